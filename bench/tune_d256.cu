#include "bench/tune_tile.cuh"

// Candidate of perf-log step 23: the short-key d256 tile with pingpong again (the choice before).
namespace fa3::bench {
void add_d256(std::vector<TuneVariant>& v) {
  using Alt = attn::FwdConfig<256, true>;
  add_variant<attn::WithSchedule<Alt, Alt::kSchedule | attn::kPingpong>>(v);
}
}  // namespace fa3::bench
