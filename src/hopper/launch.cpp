#include "src/hopper/launch.h"

#include <cuda.h>
#include <cudaTypedefs.h>

#include <mutex>
#include <string>

namespace fa3::hopper {
namespace {

// cuLaunchKernel and cuGetErrorName from the driver, asked once (fa3 does not link libcuda).
struct Driver {
  PFN_cuLaunchKernel_v4000 launch = nullptr;
  PFN_cuGetErrorName_v6000 error_name = nullptr;
  cudaError_t lookup = cudaSuccess;
};
const Driver& driver() {
  static Driver d;
  static std::once_flag once;
  std::call_once(once, [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    d.lookup = cudaGetDriverEntryPointByVersion("cuLaunchKernel", &p, 4000, cudaEnableDefault, &q);
    if (d.lookup == cudaSuccess && q == cudaDriverEntryPointSuccess) d.launch = reinterpret_cast<PFN_cuLaunchKernel_v4000>(p);
    p = nullptr;
    if (cudaGetDriverEntryPointByVersion("cuGetErrorName", &p, 6000, cudaEnableDefault, &q) == cudaSuccess &&
        q == cudaDriverEntryPointSuccess)
      d.error_name = reinterpret_cast<PFN_cuGetErrorName_v6000>(p);
  });
  return d;
}

}  // namespace

Status launch_entry(const void* entry, KernelSlot& slot, dim3 grid, dim3 block, int smem_bytes, cudaStream_t stream,
                    void** args) {
  const Driver& drv = driver();
  if (drv.launch == nullptr)
    return detail::cuda_error(drv.lookup == cudaSuccess ? cudaErrorSymbolNotFound : drv.lookup,
                              "cudaGetDriverEntryPointByVersion(\"cuLaunchKernel\")", __FILE__, __LINE__);
  void* kernel = slot.handle.load(std::memory_order_acquire);
  if (kernel == nullptr) {  // (two threads may both look it up: the same handle)
    cudaKernel_t k = nullptr;
    FA3_CUDA_TRY(cudaGetKernel(&k, entry));
    kernel = k;
    slot.handle.store(kernel, std::memory_order_release);
  }
  // Above the default 48 KB a kernel must be allowed its shared memory on each device it runs on.
  if (smem_bytes > 48 * 1024) {
    int dev = 0;
    FA3_CUDA_TRY(cudaGetDevice(&dev));
    const uint64_t bit = dev < 64 ? uint64_t(1) << dev : 0;
    if (!bit || !(slot.smem_devices.load(std::memory_order_acquire) & bit)) {
      FA3_CUDA_TRY(cudaKernelSetAttributeForDevice(static_cast<cudaKernel_t>(kernel),
                                                   cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes, dev));
      slot.smem_devices.fetch_or(bit, std::memory_order_acq_rel);
    }
  }
  const CUresult r = drv.launch(static_cast<CUfunction>(kernel), grid.x, grid.y, grid.z, block.x, block.y, block.z,
                                unsigned(smem_bytes), static_cast<CUstream>(stream), args, nullptr);
  if (r == CUDA_SUCCESS) return Status();
  const char* name = nullptr;
  if (drv.error_name == nullptr || drv.error_name(r, &name) != CUDA_SUCCESS) name = "unknown";
  return Status(FA3_ERROR_CUDA, std::string("CUDA error ") + name + " (CUresult " + std::to_string(int(r)) +
                                    ") in cuLaunchKernel (grid " + std::to_string(grid.x) + "x" +
                                    std::to_string(grid.y) + "x" + std::to_string(grid.z) + ", block " +
                                    std::to_string(block.x) + ", shared memory " + std::to_string(smem_bytes) + ")");
}

}  // namespace fa3::hopper
