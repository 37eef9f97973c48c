// Building Status values and keeping the C ABI's per-thread last error.
#pragma once
#include <string>

#include "fa3/fa3.h"

namespace fa3::detail {

inline Status ok() { return Status(); }
inline Status invalid(std::string msg) { return Status(FA3_ERROR_INVALID_ARGUMENT, std::move(msg)); }
inline Status not_supported(std::string msg) {
  return Status(FA3_ERROR_NOT_SUPPORTED, "not supported yet: " + std::move(msg));
}
Status cuda_error(int err, const char* call, const char* file, int line);

// Remembers the message of the last call made through the C ABI on this thread.
void set_last_error(const Status& st);

}  // namespace fa3::detail

// Returns from the enclosing function with FA3_ERROR_CUDA when a CUDA runtime call fails.
#define FA3_CUDA_TRY(call)                                                             \
  do {                                                                                 \
    const int fa3_err_ = static_cast<int>(call);                                       \
    if (fa3_err_ != 0) return ::fa3::detail::cuda_error(fa3_err_, #call, __FILE__, __LINE__); \
  } while (0)

// Propagates a non-ok Status.
#define FA3_TRY(expr)                          \
  do {                                         \
    ::fa3::Status fa3_st_ = (expr);            \
    if (!fa3_st_.ok()) return fa3_st_;         \
  } while (0)
