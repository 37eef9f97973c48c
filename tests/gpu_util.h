// Shared helpers of the GPU tests: device detection, random inputs in any supported layout,
// running a forward implementation on them, and comparing against the double-precision reference.
#pragma once
#include <cuda_runtime_api.h>

#include <functional>
#include <random>
#include <string>
#include <vector>

#include "fa3/fa3.h"
#include "reference/reference.h"

namespace fa3::test {

// "" when an sm_90 device is present, else why the GPU tests are skipped.
std::string gpu_skip_reason();

#define FA3_REQUIRE_GPU()                                            \
  do {                                                               \
    const std::string fa3_why_ = ::fa3::test::gpu_skip_reason();     \
    if (!fa3_why_.empty()) GTEST_SKIP() << fa3_why_;                 \
  } while (0)

#define FA3_CUDA_CHECK(call) ASSERT_EQ(cudaSuccess, (call)) << #call

// Owns one device allocation.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = nullptr; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  void upload(const void* host, size_t bytes);
  void download(void* host, size_t bytes) const;
  void fill_bytes(int value);

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

std::mt19937& rng();  // seeded once from std::random_device; the seed is printed at start

enum class Layout { kBSHD, kBSHDPadded, kBHSD };

struct FwdCase {
  fa3_dtype dtype = FA3_DTYPE_BF16;
  int batch = 1, seqlen_q = 128, seqlen_k = 128, heads_q = 2, heads_kv = 2, head_dim = 128, head_dim_v = 0;
  bool causal = false;
  int window_left = -1, window_right = -1;
  float softcap = 0.f;
  bool with_lse = true;
  Layout layout = Layout::kBSHD;
  std::vector<int> varlen_q, varlen_k;  // per-batch lengths; empty = fixed lengths
  int page_size = 0;                    // > 0: paged K/V cache with shuffled pages
  // > 0: key j's row scaled by 1 + key_growth * (seqlen_k - 1 - j) / seqlen_k, so that the kernels'
  // row maxima grow block after block (they walk the keys from the last): running-max rescales.
  float key_growth = 0.f;
  std::string name() const;
};

// Inputs on host (logical, as the reference wants them) and on device (in the case's layout),
// plus the argument struct that points at them. Outputs are poisoned with NaN.
struct FwdData {
  FwdCase c;
  ref::Problem prob;
  ref::Inputs in;
  FwdArgs args;
  DeviceBuffer q, k, v, out, lse, cu_q, cu_k, seqused_k, page_table, descale;
  int total_q = 0;
};

FwdData make_fwd_data(const FwdCase& c);
void poison_outputs(FwdData& d);

struct FwdOutputs {
  std::vector<std::vector<double>> o, lse;  // same layouts as ref::FwdResult
};
FwdOutputs download_outputs(const FwdData& d);

struct Errors {
  double rel_fro = 0, max_abs = 0, max_ref = 0, lse_max_err = 0;
  long nan_count = 0, lse_mismatch = 0;
  std::string summary() const;
};
Errors compare(const FwdOutputs& got, const ref::FwdResult& want, bool check_lse);

// The tolerance every 16-bit forward is held to (METHOD.md: bf16 relative error <= 1e-2 vs double),
// plus an element-wise guard so a few wrong rows cannot hide in the norm.
void expect_close(const Errors& e, const std::string& what, double rel_tol = 1e-2);

}  // namespace fa3::test
