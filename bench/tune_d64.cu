#include "bench/tune_tile.cuh"

// Candidates of perf-log step 22: 128-row tiles for short non-causal sequences (the 192-row tile
// wastes 12.5% of its rows at 512 and 1k), and a third K/V stage for the short causal tile.
namespace fa3::bench {
void add_d64(std::vector<TuneVariant>& v) {
  using attn::TileConfig;
  add_variant<attn::FwdConfig<64, true>>(v);                                          // 128x128 xtile
  add_variant<TileConfig<64, 128, 128, 2, false, attn::kFullSchedule>>(v);            // 128x128
  add_variant<TileConfig<64, 128, 128, 3, false, attn::kFullSchedule | attn::kCrossTile>>(v);  // 3 stages
}
}  // namespace fa3::bench
