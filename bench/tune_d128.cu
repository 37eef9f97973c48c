#include "bench/tune_tile.cuh"

namespace fa3::bench {
// e4m3 (--dtype e4m3): the 128x128 tile on the other schedule (the product runs the stream
// schedule masked or not, and 192-key blocks from 4k keys). Three consumers on
// 64-key blocks (192x64) hung on causal 1k problems in 2 of 3 runs with the chunked V transposer
// (perf-log step 72, not understood): not a candidate until it is.
void add_d128(std::vector<TuneVariant>& v) {
  add_variant<Fp8<TileConfig<128, 128, 128, 2, false, attn::kStreamSchedule>>, FA3_DTYPE_E4M3>(v);
  add_variant<Fp8<TileConfig<128, 128, 128, 2, false, attn::kFullSchedule & ~attn::kPingpong>>, FA3_DTYPE_E4M3>(v);
  // Three K/V/V^T stages (208 KB of smem): +0.5-1% at 4k-16k, within the noise (perf-log step 96).
  add_variant<Fp8<TileConfig<128, 128, 128, 3, false, attn::kStreamSchedule>>, FA3_DTYPE_E4M3>(v);
  add_variant<Fp8<TileConfig<128, 128, 128, 3, false, attn::kFullSchedule & ~attn::kPingpong>>, FA3_DTYPE_E4M3>(v);
  // 192-key blocks (the product's second tile from 4k keys) without pingpong: 10-12% slower than
  // with it at 4k-16k (perf-log step 104).
  add_variant<Fp8<TileConfig<128, 128, 192, 2, false, attn::kFullSchedule & ~attn::kPingpong>>, FA3_DTYPE_E4M3>(v);
}
}  // namespace fa3::bench
