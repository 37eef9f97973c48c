// Host side of TMA: builds CUtensorMap descriptors through the driver entry point (no -lcuda).
#pragma once
#include <cuda.h>

#include <cstdint>
#include <string>

namespace fa3::hopper {

// A 4-D tensor [d3][d2][d1][d0] with d0 contiguous, loaded/stored in boxes of box[0..3] elements,
// 128-byte swizzle (box[0] * element bytes must be <= 128). Strides are in bytes for dims 1..3.
// Out-of-bounds reads fill zeros; out-of-bounds parts of a stored box are dropped. l2_promotion:
// the size of the L2 fill a box's request for a line triggers.
struct TmaMap4dDesc {
  CUtensorMapDataType dtype;
  int element_bytes;
  const void* base;
  uint64_t dims[4];
  uint64_t strides_bytes[3];
  uint32_t box[4];
  CUtensorMapL2promotion l2_promotion = CU_TENSOR_MAP_L2_PROMOTION_L2_256B;
};

// Returns "" on success, else a message naming what the driver rejected.
std::string encode_tma_map_4d(CUtensorMap* map, const TmaMap4dDesc& desc);

}  // namespace fa3::hopper
