#include "bench/tune_tile.cuh"

// No d256 candidates at the moment (perf-log step 11 tried 128x64 / 128x80 without pingpong).
namespace fa3::bench {
void add_d256(std::vector<TuneVariant>&) {}
}  // namespace fa3::bench
