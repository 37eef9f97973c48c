#include "bench/tune_tile.cuh"

namespace fa3::bench {
void add_d64(std::vector<TuneVariant>& v) {
  constexpr int kFull = attn::kFullSchedule;
  add_variant<Tile<64, 192, 128, 2, false>, kFull & ~attn::kPingpong>(v);
  add_variant<Tile<64, 192, 128, 2, false>, kFull & ~attn::kExpUnderPv>(v);
  add_variant<Tile<64, 192, 128, 4, false>, kFull>(v);
  add_variant<Tile<64, 128, 128, 2, false>, kFull>(v);
}
}  // namespace fa3::bench
