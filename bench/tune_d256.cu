#include "bench/tune_tile.cuh"

// Candidates of perf-log step 52 (in this file for a third compile job): the d96 tiles with the
// cross-tile stream.
namespace fa3::bench {
void add_d256(std::vector<TuneVariant>& v) {
  using Main = attn::FwdConfig<96, false>;
  using Alt = attn::FwdConfig<96, true>;
  add_variant<attn::WithSchedule<Main, attn::kStreamSchedule>>(v);
  add_variant<attn::WithSchedule<Alt, Alt::kSchedule | attn::kCrossTile>>(v);
}
}  // namespace fa3::bench
