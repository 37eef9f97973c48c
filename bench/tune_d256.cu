#include "bench/tune_tile.cuh"

namespace fa3::bench {
void add_d256(std::vector<TuneVariant>& v) {
  constexpr int kFull = attn::kFullSchedule;
  add_variant<Tile<256, 128, 80, 2, true>, kFull & ~attn::kPingpong>(v);
  add_variant<Tile<256, 128, 80, 2, true>, kFull & ~attn::kExpUnderPv>(v);
}
}  // namespace fa3::bench
