#include "bench/tune_tile.cuh"

namespace fa3::bench {
void add_d128(std::vector<TuneVariant>& v) {
  constexpr int kFull = attn::kFullSchedule;
  add_variant<Tile<128, 128, 128, 2, false>, kFull>(v);
  add_variant<Tile<128, 128, 128, 2, false>, kFull & ~attn::kPingpong>(v);
  add_variant<Tile<128, 128, 128, 2, false>, kFull & ~attn::kExpUnderPv>(v);
  add_variant<Tile<128, 128, 176, 2, true>, kFull>(v);
  add_variant<Tile<128, 128, 176, 2, true>, kFull & ~attn::kPingpong>(v);
  add_variant<Tile<128, 128, 176, 2, true>, kFull & ~attn::kExpUnderPv>(v);
}
}  // namespace fa3::bench
