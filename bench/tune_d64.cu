#include "bench/tune_tile.cuh"

// Candidate of perf-log step 23: the short causal stream tile with its exponentials under the PV
// again (kExpUnderPv, the choice before that step).
namespace fa3::bench {
void add_d64(std::vector<TuneVariant>& v) {
  using Alt = attn::FwdConfig<64, true>;
  add_variant<attn::WithSchedule<Alt, Alt::kSchedule | attn::kExpUnderPv>>(v);
}
}  // namespace fa3::bench
