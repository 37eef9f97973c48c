#include "bench/tune_tile.cuh"

// Candidates of perf-log step 11 (the product's tiles are in fwd_config.h).
namespace fa3::bench {
void add_d64(std::vector<TuneVariant>& v) {
  constexpr int kFull = attn::kFullSchedule;
  add_variant<Tile<64, 128, 64, 4, false>, kFull>(v);
  add_variant<Tile<64, 128, 128, 4, false>, kFull>(v);
}
}  // namespace fa3::bench
