// The implementations behind fa3_forward, each behind a plain host function.
#pragma once
#include <cuda_runtime_api.h>

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

// The simple fp32 kernel (src/oracle) that covers every forward feature.
Status oracle_fwd(const FwdProblem& f, cudaStream_t stream);

}  // namespace fa3::detail
