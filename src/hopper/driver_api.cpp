#include "src/hopper/driver_api.h"

#include <cuda_runtime_api.h>

#include <mutex>

namespace fa3::hopper {
namespace {

template <class Fn>
void look_up(DriverFn<Fn>& f, const char* name, unsigned version) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult q{};
  const cudaError_t e = cudaGetDriverEntryPointByVersion(name, &p, version, cudaEnableDefault, &q);
  if (e == cudaSuccess && q == cudaDriverEntryPointSuccess && p != nullptr)
    f.fn = reinterpret_cast<Fn>(p);
  else
    f.why = std::string(name) + " is not available from the driver (" + cudaGetErrorString(e) + ")";
}

}  // namespace

const DriverApi& driver_api() {
  static DriverApi api;
  static std::once_flag once;
  std::call_once(once, [] {
    look_up(api.encode_tiled, "cuTensorMapEncodeTiled", 12000);
    look_up(api.launch_kernel, "cuLaunchKernel", 4000);
    look_up(api.error_name, "cuGetErrorName", 6000);
  });
  return api;
}

}  // namespace fa3::hopper
