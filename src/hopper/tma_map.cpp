#include "src/hopper/tma_map.h"

#include <algorithm>
#include <cstring>

#include "src/hopper/driver_api.h"

namespace fa3::hopper {

namespace {
std::string encode_tma_map_4d_uncached(CUtensorMap* map, const TmaMap4dDesc& d);

// The last maps this thread encoded, by their description: a call's maps mostly repeat the previous
// call's (the same tensors step after step), and encoding is ~a microsecond of the host path.
struct MapCache {
  static constexpr int kEntries = 16;
  TmaMap4dDesc desc[kEntries];
  CUtensorMap map[kEntries];
  int used = 0, next = 0;
};
bool same(const TmaMap4dDesc& a, const TmaMap4dDesc& b) {
  return a.dtype == b.dtype && a.element_bytes == b.element_bytes && a.base == b.base &&
         std::memcmp(a.dims, b.dims, sizeof a.dims) == 0 && std::memcmp(a.strides_bytes, b.strides_bytes, sizeof a.strides_bytes) == 0 &&
         std::memcmp(a.box, b.box, sizeof a.box) == 0 && a.l2_promotion == b.l2_promotion;
}
}  // namespace

std::string encode_tma_map_4d(CUtensorMap* map, const TmaMap4dDesc& d) {
  thread_local MapCache cache;
  for (int i = 0; i < cache.used; ++i)
    if (same(cache.desc[i], d)) {
      *map = cache.map[i];
      return "";
    }
  std::string err = encode_tma_map_4d_uncached(map, d);
  if (err.empty()) {
    cache.desc[cache.next] = d;
    cache.map[cache.next] = *map;
    cache.next = (cache.next + 1) % MapCache::kEntries;
    cache.used = std::min(cache.used + 1, MapCache::kEntries);
  }
  return err;
}

namespace {
std::string encode_tma_map_4d_uncached(CUtensorMap* map, const TmaMap4dDesc& d) {
  const auto& encode = driver_api().encode_tiled;
  if (encode.fn == nullptr) return encode.why;
  const cuuint64_t dims[4] = {d.dims[0], d.dims[1], d.dims[2], d.dims[3]};
  const cuuint64_t strides[3] = {d.strides_bytes[0], d.strides_bytes[1], d.strides_bytes[2]};
  const cuuint32_t box[4] = {d.box[0], d.box[1], d.box[2], d.box[3]};
  const cuuint32_t elem_strides[4] = {1, 1, 1, 1};
  const CUresult r = encode.fn(map, d.dtype, 4, const_cast<void*>(d.base), dims, strides, box, elem_strides,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            d.l2_promotion, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS)
    return "cuTensorMapEncodeTiled failed with CUresult " + std::to_string(static_cast<int>(r)) + " (dims " +
           std::to_string(d.dims[0]) + "x" + std::to_string(d.dims[1]) + "x" + std::to_string(d.dims[2]) + "x" +
           std::to_string(d.dims[3]) + ", strides " + std::to_string(d.strides_bytes[0]) + "/" +
           std::to_string(d.strides_bytes[1]) + "/" + std::to_string(d.strides_bytes[2]) + " bytes)";
  return "";
}

}  // namespace

}  // namespace fa3::hopper
