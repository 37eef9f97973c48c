#include "bench/tune_tile.cuh"

namespace fa3::bench {
// e4m3 (--dtype e4m3): three consumers (192 query rows, 128 keys: the product's second tile for
// long sequences, fwd_config.h) at every length, and the 128x128 tile on the stream schedule
// (the product's masked first tile) for unmasked problems too.
void add_d64(std::vector<TuneVariant>& v) {
  add_variant<Fp8<TileConfig<64, 192, 128, 2, false, attn::kSoftmaxBoundSchedule | attn::kCrossTile>>, FA3_DTYPE_E4M3>(v);
  add_variant<Fp8<TileConfig<64, 128, 128, 2, false, attn::kStreamSchedule>>, FA3_DTYPE_E4M3>(v);
}
}  // namespace fa3::bench
