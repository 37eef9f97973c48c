// dK and dV leave the backward's consumers through shared memory: a row-major tile of keys, rows
// of kRowBytes whose 16-byte chunks are XOR-swizzled by row % 8 (8 rows' stores of one chunk hit
// 32 banks), copied out as whole row segments, 16 bytes a thread. (Stored from the fragments, each
// instruction put 16 bytes on each of 8 rows, half of every 32-byte sector it touched: the pattern
// that halved the postprocess's bandwidth, perf-log step 86.)
#pragma once
#include <cstdint>

#include "fa3/fa3_c.h"
#include "src/attention/fwd_params.h"
#include "src/hopper/arch.cuh"

namespace fa3::attn {

template <int kRowBytes>
struct BwdStagedRows {
  static constexpr int kChunks = kRowBytes / 16;
  static_assert(kChunks >= 8 && kChunks % 8 == 0, "the swizzle permutes 8 chunks of a row");

  __device__ __forceinline__ static uint32_t offset(int row, int chunk) {
    return uint32_t(row * kRowBytes + (chunk ^ (row % 8)) * 16);
  }

  // Rows [0, kRows) of the tile at `tile` (a 32-bit shared address) into rows key0.. of kv_head
  // of t, columns col0 + 8 chunk; keys past seqlen_k and columns past `cols` are not written.
  template <int kRows, class Elem, class Seq>
  __device__ __forceinline__ static void copy_out(uint32_t tile, const fa3_tensor& t, const FwdKernelParams& f,
                                                  const Seq& seq, int kv_head, int key0, int col0, int cols,
                                                  int thread) {
    Elem* base = static_cast<Elem*>(t.data) + int64_t(seq.k_batch(f)) * t.batch_stride +
                 int64_t(seq.k_row0()) * t.row_stride + int64_t(kv_head) * t.head_stride;
    for (int idx = thread; idx < kRows * kChunks; idx += hopper::kWarpgroupSize) {
      const int row = idx / kChunks, chunk = idx % kChunks, j = key0 + row, c = col0 + 8 * chunk;
      if (j >= seq.seqlen_k(f) || c >= cols) continue;
      *reinterpret_cast<uint4*>(base + int64_t(j) * t.row_stride + c) = hopper::ld_shared_u32x4(tile + offset(row, chunk));
    }
  }
};

}  // namespace fa3::attn
