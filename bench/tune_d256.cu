#include "bench/tune_tile.cuh"

// Candidates of perf-log step 11 (the product's tiles are in fwd_config.h).
namespace fa3::bench {
void add_d256(std::vector<TuneVariant>& v) {
  add_variant<TileConfig<256, 128, 64, 2, true, attn::kFullSchedule & ~attn::kPingpong>>(v);
  add_variant<TileConfig<256, 128, 80, 2, true, attn::kFullSchedule & ~attn::kPingpong>>(v);
}
}  // namespace fa3::bench
