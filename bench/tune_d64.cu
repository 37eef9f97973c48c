#include "bench/tune_tile.cuh"

namespace fa3::bench {
// e4m3 (--dtype e4m3): three consumers (192 query rows, 128 keys; perf-log step 65).
void add_d64(std::vector<TuneVariant>& v) {
  add_variant<Fp8<TileConfig<64, 192, 128, 2, false, attn::kSoftmaxBoundSchedule | attn::kCrossTile>>, FA3_DTYPE_E4M3>(v);
}
}  // namespace fa3::bench
