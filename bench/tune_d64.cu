#include "bench/tune_tile.cuh"

// Candidates of perf-log step 34: d64 with 64-key blocks under 192-row tiles (each warpgroup's hidden
// diagonal blocks skipped), per tile and as a stream; d96's 192-row tile with 96-key blocks.
namespace fa3::bench {
void add_d64(std::vector<TuneVariant>& v) {
  constexpr int kStream = (attn::kFullSchedule & ~attn::kExpUnderPv) | attn::kCrossTile;
  add_variant<attn::TileConfig<64, 192, 64, 4, false>>(v);
  add_variant<attn::TileConfig<64, 192, 64, 4, false, kStream & ~attn::kNarrowFirst>>(v);
  add_variant<attn::TileConfig<96, 192, 96, 2, false>>(v);
}
}  // namespace fa3::bench
