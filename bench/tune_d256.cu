#include "bench/tune_tile.cuh"

// Candidates of perf-log steps 23 and 25: the short-key d256 tile with pingpong again, and without
// the lazy rescale.
namespace fa3::bench {
void add_d256(std::vector<TuneVariant>& v) {
  using Alt = attn::FwdConfig<256, true>;
  add_variant<attn::WithSchedule<Alt, Alt::kSchedule | attn::kPingpong>>(v);
  add_variant<attn::WithSchedule<Alt, Alt::kSchedule & ~attn::kLazyRescale>>(v);
}
}  // namespace fa3::bench
