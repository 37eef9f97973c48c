#include "bench/tune_tile.cuh"

// Candidates of perf-log step 11 (the product's tiles are in fwd_config.h).
namespace fa3::bench {
void add_d128(std::vector<TuneVariant>& v) {
  constexpr int kProduct = attn::FwdConfig<128>::kSchedule;
  add_variant<TileConfig<128, 128, 64, 4, false, kProduct>>(v);
  add_variant<TileConfig<128, 128, 64, 4, false, kProduct | attn::kPingpong>>(v);
  add_variant<TileConfig<128, 128, 192, 2, true, kProduct>>(v);
}
}  // namespace fa3::bench
