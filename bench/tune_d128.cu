#include "bench/tune_tile.cuh"

namespace fa3::bench {
// e4m3 (--dtype e4m3): three consumers (192 query rows, 64 keys) and two on the other schedule
// (perf-log step 65).
void add_d128(std::vector<TuneVariant>& v) {
  add_variant<Fp8<TileConfig<128, 192, 64, 2, false, attn::kFullSchedule & ~attn::kPingpong>>, FA3_DTYPE_E4M3>(v);
  add_variant<Fp8<TileConfig<128, 128, 128, 2, false, attn::kStreamSchedule>>, FA3_DTYPE_E4M3>(v);
}
}  // namespace fa3::bench
