#include "bench/tune_tile.cuh"

// References of perf-log step 52: the two d128 tiles before step 51 (128x128 and 192x80, both with the
// exponentials under the PV and without pingpong).
namespace fa3::bench {
void add_d128(std::vector<TuneVariant>& v) {
  constexpr int kOld = attn::kFullSchedule & ~attn::kPingpong;
  add_variant<TileConfig<128, 128, 128, 2, false, kOld>>(v);
  add_variant<TileConfig<128, 192, 80, 2, false, kOld>>(v);
}
}  // namespace fa3::bench
