#include "bench/tune_tile.cuh"

namespace fa3::bench {
void add_d128(std::vector<TuneVariant>& v) {
  add_variant<Tile<128, 128, 128, 2, false>, attn::kFullSchedule>(v);
  add_variant<Tile<128, 128, 160, 2, false>, attn::kFullSchedule>(v);
  add_variant<Tile<128, 128, 176, 2, true>, attn::kFullSchedule & ~attn::kPingpong>(v);
}
}  // namespace fa3::bench
