#include "src/hopper/launch.h"

#include <cuda.h>

#include <string>

#include "src/hopper/driver_api.h"

namespace fa3::hopper {

Status launch_entry(const void* entry, KernelSlot& slot, dim3 grid, dim3 block, int smem_bytes, cudaStream_t stream,
                    void** args) {
  const DriverApi& drv = driver_api();
  if (drv.launch_kernel.fn == nullptr) return Status(FA3_ERROR_CUDA, drv.launch_kernel.why);
  void* kernel = slot.handle.load(std::memory_order_acquire);
  if (kernel == nullptr) {  // (two threads may both look it up: the same handle)
    cudaKernel_t k = nullptr;
    FA3_CUDA_TRY(cudaGetKernel(&k, entry));
    kernel = k;
    slot.handle.store(kernel, std::memory_order_release);
  }
  // Above the default 48 KB of shared memory, dynamic plus the kernel's static, a kernel must be
  // allowed its dynamic shared memory on each device it runs on (once: each kernel is launched with
  // one size; the static size is looked up only for kernels that have dynamic shared memory).
  if (smem_bytes > 0) {
    int dev = 0;
    FA3_CUDA_TRY(cudaGetDevice(&dev));
    const uint64_t bit = dev < 64 ? uint64_t(1) << dev : 0;
    if (!bit || !(slot.smem_devices.load(std::memory_order_acquire) & bit)) {
      cudaFuncAttributes attr{};
      FA3_CUDA_TRY(cudaFuncGetAttributes(&attr, entry));
      if (size_t(smem_bytes) + attr.sharedSizeBytes > 48 * 1024)
        FA3_CUDA_TRY(cudaKernelSetAttributeForDevice(static_cast<cudaKernel_t>(kernel),
                                                     cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes, dev));
      slot.smem_devices.fetch_or(bit, std::memory_order_acq_rel);
    }
  }
  const CUresult r = drv.launch_kernel.fn(static_cast<CUfunction>(kernel), grid.x, grid.y, grid.z, block.x, block.y, block.z,
                                unsigned(smem_bytes), static_cast<CUstream>(stream), args, nullptr);
  if (r == CUDA_SUCCESS) return Status();
  const char* name = nullptr;
  if (drv.error_name.fn == nullptr || drv.error_name.fn(r, &name) != CUDA_SUCCESS) name = "unknown";
  return Status(FA3_ERROR_CUDA, std::string("CUDA error ") + name + " (CUresult " + std::to_string(int(r)) +
                                    ") in cuLaunchKernel (grid " + std::to_string(grid.x) + "x" +
                                    std::to_string(grid.y) + "x" + std::to_string(grid.z) + ", block " +
                                    std::to_string(block.x) + ", shared memory " + std::to_string(smem_bytes) + ")");
}

}  // namespace fa3::hopper
