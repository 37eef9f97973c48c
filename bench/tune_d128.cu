#include "bench/tune_tile.cuh"

// Candidates of perf-log step 33: the 192-row product tile with pingpong and without the
// exponentials under the PV GEMM, and with 3 K/V stages (one Q buffer then); the 128-row tile
// without lazy rescale (step 27).
namespace fa3::bench {
void add_d128(std::vector<TuneVariant>& v) {
  using Main = attn::FwdConfig<128, false>;
  using Alt = attn::FwdConfig<128, true>;
  add_variant<attn::WithSchedule<Alt, Alt::kSchedule | attn::kPingpong>>(v);
  add_variant<attn::WithSchedule<Alt, Alt::kSchedule & ~attn::kExpUnderPv>>(v);
  add_variant<attn::WithSchedule<Main, Main::kSchedule & ~attn::kLazyRescale>>(v);
  add_variant<attn::TileConfig<128, 192, 80, 3, false, Alt::kSchedule>>(v);  // one Q buffer
}
}  // namespace fa3::bench
