#include "bench/tune_tile.cuh"

namespace fa3::bench {
void add_d256(std::vector<TuneVariant>& v) {
  add_variant<Tile<256, 128, 80, 2, true>, attn::kFullSchedule & ~attn::kPingpong>(v);
}
}  // namespace fa3::bench
