// fa3: exact attention for NVIDIA Hopper (sm_90a).  C++ API.
//
// The argument structs are the C ABI's (fa3_c.h), default-initialised; the calls return a Status
// whose message names the offending argument.  Example:
//
//   fa3::FwdArgs a;                          // defaults: bf16, no mask, scale 1/sqrt(d)
//   a.batch = 2; a.seqlen_q = a.seqlen_k = 4096; a.heads_q = a.heads_kv = 16;
//   a.head_dim_qk = a.head_dim_v = 128;
//   a.q = fa3::bshd(q_ptr, 4096, 16, 128);   // contiguous [b, s, h, d]
//   ...
//   fa3::Status st = fa3::forward(a, stream);
//   if (!st) fprintf(stderr, "%s\n", st.message().c_str());
#ifndef FA3_FA3_H_
#define FA3_FA3_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "fa3/fa3_c.h"

struct CUstream_st;

namespace fa3 {

using DType = fa3_dtype;
using Tensor = fa3_tensor;

class Status {
 public:
  Status() = default;
  Status(fa3_status code, std::string message) : code_(code), message_(std::move(message)) {}
  bool ok() const { return code_ == FA3_OK; }
  explicit operator bool() const { return ok(); }
  fa3_status code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  fa3_status code_ = FA3_OK;
  std::string message_;
};

struct FwdArgs : fa3_fwd_params {
  FwdArgs() { fa3_fwd_params_init(this); }
};

struct BwdArgs : fa3_bwd_params {
  BwdArgs() { fa3_bwd_params_init(this); }
};

struct CombineArgs : fa3_combine_params {
  CombineArgs() { fa3_combine_params_init(this); }
};

struct QuantizeArgs : fa3_quantize_params {
  QuantizeArgs() { fa3_quantize_params_init(this); }
};

// A contiguous [batch, seqlen, heads, head_dim] tensor.
inline Tensor bshd(void* data, int64_t seqlen, int64_t heads, int64_t head_dim) {
  return Tensor{data, seqlen * heads * head_dim, heads * head_dim, head_dim};
}

FA3_API Status forward(const FwdArgs& args, CUstream_st* stream = nullptr);
FA3_API Status validate(const FwdArgs& args);
FA3_API Status workspace_size(const FwdArgs& args, size_t* bytes);
FA3_API Status backward(const BwdArgs& args, CUstream_st* stream = nullptr);
FA3_API Status validate(const BwdArgs& args);
FA3_API Status workspace_size(const BwdArgs& args, size_t* bytes);
// Merges split results (fa3_c.h, fa3_combine_params).
FA3_API Status combine(const CombineArgs& args, CUstream_st* stream = nullptr);
FA3_API Status validate(const CombineArgs& args);
// 16-bit Q, K or V to e4m3 with block descales, optionally rotated (fa3_c.h, fa3_quantize_params).
FA3_API Status quantize_fp8(const QuantizeArgs& args, CUstream_st* stream = nullptr);
FA3_API Status validate(const QuantizeArgs& args);

// "hopper" or "reference-gpu": the implementation forward() picks for these arguments.
FA3_API Status kernel_name(const FwdArgs& args, const char** name);
// "hopper" or "reference-gpu": the implementation backward() picks for these arguments.
FA3_API Status kernel_name(const BwdArgs& args, const char** name);

FA3_API const char* dtype_name(DType dtype);

}  // namespace fa3

#endif  // FA3_FA3_H_
