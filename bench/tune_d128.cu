#include "bench/tune_tile.cuh"

// Candidate of perf-log step 13: the product's 128-key d128 tile with the cross-tile overlap.
namespace fa3::bench {
void add_d128(std::vector<TuneVariant>& v) {
  add_variant<attn::WithSchedule<attn::FwdConfig<128, false>, attn::FwdConfig<128, false>::kSchedule | attn::kCrossTile>>(v);
}
}  // namespace fa3::bench
