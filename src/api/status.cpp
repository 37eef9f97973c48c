#include "src/api/status.h"

#include <cuda_runtime_api.h>

namespace fa3::detail {

Status cuda_error(int err, const char* call, const char* file, int line) {
  const auto e = static_cast<cudaError_t>(err);
  return Status(FA3_ERROR_CUDA, std::string("CUDA error ") + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) +
                                    ") in " + call + " at " + file + ":" + std::to_string(line));
}

namespace {
thread_local std::string t_last_error;
}

void set_last_error(const Status& st) { t_last_error = st.ok() ? std::string() : st.message(); }

}  // namespace fa3::detail

extern "C" const char* fa3_last_error(void) { return fa3::detail::t_last_error.c_str(); }
