#include "bench/tune_tile.cuh"

namespace fa3::bench {
// e4m3 (--dtype e4m3): the FP8 d256 tiles (128 keys; 64 below 4k keys) on the other schedules.
void add_d256(std::vector<TuneVariant>& v) {
  add_variant<Fp8<TileConfig<256, 128, 128, 2, true, attn::kFullSchedule & ~attn::kPingpong>>, FA3_DTYPE_E4M3>(v);
  add_variant<Fp8<TileConfig<256, 128, 128, 2, true, attn::kFullSchedule>>, FA3_DTYPE_E4M3>(v);
  add_variant<Fp8<TileConfig<256, 128, 64, 2, false>>, FA3_DTYPE_E4M3>(v);
  add_variant<Fp8<TileConfig<256, 128, 64, 2, false, attn::kFullSchedule & ~attn::kPingpong>>, FA3_DTYPE_E4M3>(v);
}
}  // namespace fa3::bench
