#include "bench/tune_tile.cuh"

// Candidates of perf-log step 13: the product's d64 tiles with the other cross-tile choice.
namespace fa3::bench {
void add_d64(std::vector<TuneVariant>& v) {
  add_variant<attn::WithSchedule<attn::FwdConfig<64, false>, attn::FwdConfig<64, false>::kSchedule | attn::kCrossTile>>(v);
  add_variant<attn::WithSchedule<attn::FwdConfig<64, true>, attn::FwdConfig<64, true>::kSchedule & ~attn::kCrossTile>>(v);
}
}  // namespace fa3::bench
