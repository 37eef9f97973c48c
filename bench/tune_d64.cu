#include "bench/tune_tile.cuh"

// Candidates of perf-log step 52: the d64 192x128 tile with the cross-tile stream.
namespace fa3::bench {
void add_d64(std::vector<TuneVariant>& v) {
  using Main = attn::FwdConfig<64, false>;
  add_variant<attn::WithSchedule<Main, Main::kSchedule | attn::kCrossTile>>(v);
  add_variant<attn::WithSchedule<Main, attn::kStreamSchedule>>(v);
}
}  // namespace fa3::bench
