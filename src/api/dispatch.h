// The implementations behind fa3_forward, each behind a plain host function.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

#include "src/api/problem.h"
#include "src/api/status.h"

namespace fa3::detail {

// The warp-specialised TMA + wgmma kernel (src/attention). nullptr when it covers the problem,
// else a short reason ("paged KV", ...).
const char* hopper_fwd_unsupported_reason(const FwdProblem& f);
Status hopper_fwd(const FwdProblem& f, cudaStream_t stream);
// The name of the instantiation hopper_fwd would launch ("fwd_bf16_d128_mtrue_sfalse_vfalse", as
// CMakeLists.txt names its generated files and the instantiation registry lists them).
Status hopper_fwd_instance(const FwdProblem& f, std::string* name);
// The scratch the Hopper forward needs for the problem: the decode path's partial results
// (split_plan.h), 0 for every other problem.
Status hopper_fwd_workspace_bytes(const FwdProblem& f, size_t* bytes);

// The simple fp32 kernel (src/oracle) that covers every forward feature.
Status oracle_fwd(const FwdProblem& f, cudaStream_t stream);

// The backward: the Hopper kernels (src/attention/bwd_*) and the simple fp32 ones (src/oracle)
// that cover every backward feature. Each needs the scratch its *_workspace_bytes names.
const char* hopper_bwd_unsupported_reason(const FwdProblem& f);
size_t hopper_bwd_workspace_bytes(const FwdProblem& f);
Status hopper_bwd(const fa3_bwd_params& b, const FwdProblem& f, cudaStream_t stream);
size_t oracle_bwd_workspace_bytes(const FwdProblem& f);
Status oracle_bwd(const fa3_bwd_params& b, const FwdProblem& f, cudaStream_t stream);

}  // namespace fa3::detail
