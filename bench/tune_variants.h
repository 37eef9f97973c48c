// Tile-shape variants of the forward kernel for `fa3-bench --tune`: extra instantiations compiled
// only with -DFA3_BUILD_TUNE=ON (tune_variants.cu), so that one GPU run can time several
// configurations of a head dim side by side.  The product's choices live in fwd_config.h.
#pragma once
#include <cuda_runtime_api.h>

#include <string>
#include <vector>

#include "src/api/problem.h"
#include "src/api/status.h"

namespace fa3::bench {

struct TuneVariant {
  std::string name;
  int head_dim;
  bool masked;
  fa3_dtype dtype;  // of the operands it runs on
  bool softcap;     // compiled with the score modifier (runs only under --softcap)
  Status (*launch)(const detail::FwdProblem&, cudaStream_t);
};

const std::vector<TuneVariant>& tune_variants();

}  // namespace fa3::bench
