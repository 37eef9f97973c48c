#include "bench/tune_tile.cuh"

// Candidates of perf-log step 31: a share of the exponentials on the FMA pipe (exp2_poly) in both
// d64 tiles; the short causal stream tile with 3 and 4 K/V stages.
namespace fa3::bench {
void add_d64(std::vector<TuneVariant>& v) {
  using Main = attn::FwdConfig<64, false>;
  using Alt = attn::FwdConfig<64, true>;
  add_variant<attn::WithPolyExp<Main, 8>>(v);
  add_variant<attn::WithPolyExp<Alt, 8>>(v);
  add_variant<attn::TileConfig<64, 128, 128, 3, false, Alt::kSchedule>>(v);
  add_variant<attn::TileConfig<64, 128, 128, 4, false, Alt::kSchedule>>(v);
}
}  // namespace fa3::bench
