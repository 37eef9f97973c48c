#include "bench/tune_tile.cuh"

// Candidates of perf-log step 46: the short causal d64 stream tile after the stale-max softmax,
// without pingpong, with narrow first blocks, with three K/V stages.
namespace fa3::bench {
void add_d64(std::vector<TuneVariant>& v) {
  using Stream = attn::FwdConfig<64, true>;
  add_variant<attn::WithSchedule<Stream, Stream::kSchedule & ~attn::kPingpong>>(v);
  add_variant<attn::WithSchedule<Stream, Stream::kSchedule | attn::kNarrowFirst>>(v);
  add_variant<attn::TileConfig<64, 128, 128, 3, false, Stream::kSchedule>>(v);
}
}  // namespace fa3::bench
