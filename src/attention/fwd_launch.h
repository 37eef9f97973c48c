// Host entry points of the forward kernel instantiations (defined in generated instantiation files).
#pragma once
#include <cuda_runtime_api.h>

#include "src/api/problem.h"
#include "src/api/status.h"
#include "src/attention/fwd_features.h"

namespace fa3::attn {

// kDtype: FA3_DTYPE_FP16 or FA3_DTYPE_BF16; Cfg: a tile configuration of fwd_config.h (its head dims
// are the padded ones, 64/96/128/192/256), which also carries the schedule flags; Feat: FwdFeatures.
template <int kDtype, class Cfg, class Feat>
Status launch_fwd(const detail::FwdProblem& f, cudaStream_t stream);

// The padded head dim of the kernel that serves head dim d (TMA zero-fills the extra columns).
constexpr int padded_head_dim(int d) { return d <= 64 ? 64 : d <= 96 ? 96 : d <= 128 ? 128 : d <= 192 ? 192 : 256; }

}  // namespace fa3::attn
