#include "bench/tune_tile.cuh"

namespace fa3::bench {
void add_d64(std::vector<TuneVariant>& v) {
  add_variant<Tile<64, 128, 128, 2, false>, attn::kFullSchedule>(v);
}
}  // namespace fa3::bench
