#include "bench/tune_tile.cuh"

// Candidates of perf-log step 27: the d128 tiles with one schedule flag off at a time.
namespace fa3::bench {
void add_d128(std::vector<TuneVariant>& v) {
  using Main = attn::FwdConfig<128, false>;
  using Alt = attn::FwdConfig<128, true>;
  add_variant<attn::WithSchedule<Alt, Alt::kSchedule & ~attn::kLazyRescale>>(v);
  add_variant<attn::WithSchedule<Alt, Alt::kSchedule & ~attn::kExpUnderPv>>(v);
  add_variant<attn::WithSchedule<Main, Main::kSchedule & ~attn::kLazyRescale>>(v);
}
}  // namespace fa3::bench
