#include "bench/tune_tile.cuh"

// Candidates of perf-log step 22: the 128-key tile where the product takes 176 keys (long causal).
namespace fa3::bench {
void add_d128(std::vector<TuneVariant>& v) {
  add_variant<attn::FwdConfig<128, false>>(v);
}
}  // namespace fa3::bench
