#include "bench/tune_tile.cuh"

// Candidates of perf-log steps 23 and 25: the short causal stream tile with its exponentials under
// the PV again (kExpUnderPv), and with narrow first blocks (kNarrowFirst).
namespace fa3::bench {
void add_d64(std::vector<TuneVariant>& v) {
  using Alt = attn::FwdConfig<64, true>;
  add_variant<attn::WithSchedule<Alt, Alt::kSchedule | attn::kExpUnderPv>>(v);
  add_variant<attn::WithSchedule<Alt, Alt::kSchedule | attn::kNarrowFirst>>(v);
}
}  // namespace fa3::bench
