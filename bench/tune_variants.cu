// Tile-shape and schedule candidates timed by `fa3-bench --tune` beside the product configuration
// (fwd_config.h), interleaved call by call. One file per head dim so they compile in parallel.
#include "bench/tune_tile.cuh"

namespace fa3::bench {

const std::vector<TuneVariant>& tune_variants() {
  static const std::vector<TuneVariant> all = [] {
    std::vector<TuneVariant> v;
    add_d64(v);
    add_d128(v);
    add_d256(v);
    return v;
  }();
  return all;
}

}  // namespace fa3::bench
