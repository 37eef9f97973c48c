// Kernel launches through the driver with the kernel's handle looked up once.
//
// The runtime's <<<>>> finds the function for its entry address and the current context at every
// call; cuLaunchKernel on a context-less CUkernel (cudaGetKernel, once per kernel) skips that: an
// empty kernel with the forward's 896 bytes of parameters launched in 3.4-3.9 us this way against
// 3.9-4.3 us through <<<>>> on the H200 host (fa3-bench --host, 2026-12-02), most of a decode
// step's host cost being its launch. The stream's context runs it, as with <<<>>>.
#pragma once
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <type_traits>

#include "src/api/status.h"

namespace fa3::hopper {

// Per kernel: its handle, and the devices on which its dynamic shared-memory limit is settled.
struct KernelSlot {
  std::atomic<void*> handle{nullptr};
  std::atomic<uint64_t> smem_devices{0};
};

// Launches `entry` (a __global__ function's address) with the kernel parameters `args`.
Status launch_entry(const void* entry, KernelSlot& slot, dim3 grid, dim3 block, int smem_bytes,
                    cudaStream_t stream, void** args);

// launch<kernel>(grid, block, smem, stream, args...): the arguments must have exactly the kernel's
// parameter types, because the driver copies each by the size the kernel declares.
template <auto kKernel, class... Args>
Status launch(dim3 grid, dim3 block, int smem_bytes, cudaStream_t stream, const Args&... args) {
  static_assert(std::is_same_v<decltype(kKernel), void (*)(Args...)>,
                "launch<kernel>: pass arguments of exactly the kernel's parameter types");
  static KernelSlot slot;
  void* params[] = {const_cast<void*>(static_cast<const void*>(&args))...};
  return launch_entry(reinterpret_cast<const void*>(kKernel), slot, grid, block, smem_bytes, stream, params);
}

}  // namespace fa3::hopper
