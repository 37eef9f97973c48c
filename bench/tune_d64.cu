#include "bench/tune_tile.cuh"

// Candidates of perf-log step 11 (the product's tiles are in fwd_config.h).
namespace fa3::bench {
void add_d64(std::vector<TuneVariant>& v) {
  add_variant<TileConfig<64, 128, 64, 4, false>>(v);
  add_variant<TileConfig<64, 128, 128, 4, false>>(v);
}
}  // namespace fa3::bench
