#include "bench/tune_tile.cuh"

// Candidate of perf-log step 22: the 192-row tile (idle third warpgroup past seqlen_q, narrow first
// blocks) on short causal sequences, where the product takes the 128-row stream tile.
namespace fa3::bench {
void add_d64(std::vector<TuneVariant>& v) {
  add_variant<attn::FwdConfig<64, false>>(v);
}
}  // namespace fa3::bench
