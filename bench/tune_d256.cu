#include "bench/tune_tile.cuh"

namespace fa3::bench {
// e4m3 (--dtype e4m3): the FP8 d256 tile without pingpong.
void add_d256(std::vector<TuneVariant>& v) {
  add_variant<Fp8<TileConfig<256, 128, 64, 2, false, attn::kFullSchedule & ~attn::kPingpong>>, FA3_DTYPE_E4M3>(v);
}
}  // namespace fa3::bench
