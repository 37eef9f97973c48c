#include "bench/tune_tile.cuh"

namespace fa3::bench {
void add_d64(std::vector<TuneVariant>&) {}  // no candidates at present (perf-log steps 51-53)
}  // namespace fa3::bench
