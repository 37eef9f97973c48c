// The current device's SM count, asked once per device (a device's SM count never changes): the
// persistent grids of the attention kernels and the quantizer's walk over its chunks size to it.
#pragma once
#include <cuda_runtime_api.h>

#include <atomic>

#include "src/api/status.h"

namespace fa3::hopper {

inline Status sm_count(int* count) {
  int dev = 0;
  FA3_CUDA_TRY(cudaGetDevice(&dev));
  constexpr int kDevices = 64;
  static std::atomic<int> cached[kDevices] = {};
  if (dev < kDevices && (*count = cached[dev].load(std::memory_order_relaxed)) > 0) return Status();
  FA3_CUDA_TRY(cudaDeviceGetAttribute(count, cudaDevAttrMultiProcessorCount, dev));
  if (dev < kDevices) cached[dev].store(*count, std::memory_order_relaxed);
  return Status();
}

}  // namespace fa3::hopper
