// The implementations behind fa3_forward, each behind a plain host function.
#pragma once
#include <cuda_runtime_api.h>

#include "src/api/problem.h"
#include "src/api/status.h"

namespace fa3::detail {

// The warp-specialised TMA + wgmma kernel (src/attention). nullptr when it covers the problem,
// else a short reason ("paged KV", ...).
const char* hopper_fwd_unsupported_reason(const FwdProblem& f);
Status hopper_fwd(const FwdProblem& f, cudaStream_t stream);
// The same kernel with one schedule flag changed (benchmark ablation; bf16, d 128, no mask; always
// the 128x128 tile): sched = FwdConfig<128>::kSchedule as it is, without kOverlap, or with kPingpong flipped.
Status hopper_fwd_schedule(const FwdProblem& f, int sched, cudaStream_t stream);

// The simple fp32 kernel (src/oracle) that covers every forward feature.
Status oracle_fwd(const FwdProblem& f, cudaStream_t stream);

}  // namespace fa3::detail
