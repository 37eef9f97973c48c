#include "bench/tune_tile.cuh"

// Candidates of perf-log steps 23, 25 and 27: the short causal stream tile with its exponentials
// under the PV again (kExpUnderPv) and with narrow first blocks; the 192-row tile without pingpong
// and without the lazy rescale.
namespace fa3::bench {
void add_d64(std::vector<TuneVariant>& v) {
  using Main = attn::FwdConfig<64, false>;
  using Alt = attn::FwdConfig<64, true>;
  add_variant<attn::WithSchedule<Alt, Alt::kSchedule | attn::kExpUnderPv>>(v);
  add_variant<attn::WithSchedule<Alt, Alt::kSchedule | attn::kNarrowFirst>>(v);
  add_variant<attn::WithSchedule<Main, Main::kSchedule & ~attn::kPingpong>>(v);
  add_variant<attn::WithSchedule<Main, Main::kSchedule & ~attn::kLazyRescale>>(v);
}
}  // namespace fa3::bench
