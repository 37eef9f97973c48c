// Default build: no tuning variants (configure with -DFA3_BUILD_TUNE=ON for bench/tune_variants.cu).
#include "bench/tune_variants.h"

namespace fa3::bench {
const std::vector<TuneVariant>& tune_variants() {
  static const std::vector<TuneVariant> none;
  return none;
}
}  // namespace fa3::bench
