// The benchmark's schedule ablation (`fa3-bench --ablation`, FlashAttention-3's Table 2): the
// product's d128 tile with one schedule flag changed, instantiated here, outside libfa3.
#pragma once
#include <cuda_runtime_api.h>

#include "src/api/problem.h"
#include "src/api/status.h"

namespace fa3::bench {

// bf16, head dim 128, no mask, fixed lengths (always the 128x128 tile): sched = FwdConfig<128>::kSchedule
// as it is, without kOverlap, or with kPingpong flipped.
Status run_schedule_ablation(const detail::FwdProblem& f, int sched, cudaStream_t stream);

}  // namespace fa3::bench
