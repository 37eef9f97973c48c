// Host entry points of the backward kernel instantiations (defined in generated instantiation files).
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>

#include "fa3/fa3_c.h"
#include "src/api/problem.h"
#include "src/api/status.h"
#include "src/attention/bwd_params.h"

namespace fa3::attn {

// Where the Hopper backward keeps its scratch in the caller's workspace (bwd_params.h says what
// each holds); every section starts 256-byte aligned (bulk copies want 16).
struct BwdWorkspace {
  size_t lse2 = 0, delta = 0, dq_accum = 0, dq_semaphore = 0, bytes = 0;
  int seqlen_q_rounded = 0;  // the longest sequence's query blocks * block_m
  BwdWorkspaceRows rows;     // where each (sequence, head) starts (bwd_params.h)
};
BwdWorkspace bwd_workspace_layout(const fa3_fwd_params& a, int block_m, int head_dim_padded);

// kDtype: FA3_DTYPE_FP16 or FA3_DTYPE_BF16; Cfg: a BwdConfig; Feat: FwdFeatures (varlen ones masked).
template <int kDtype, class Cfg, class Feat>
Status launch_bwd(const fa3_bwd_params& b, const detail::FwdProblem& f, cudaStream_t stream);

}  // namespace fa3::attn
