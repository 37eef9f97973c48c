// Entries for fa3's own language bindings (src/torch), whose tensors are device memory of the
// current device by construction (the binding has checked that each is a CUDA tensor on it).
#pragma once
#include <cuda_runtime_api.h>

#include "fa3/fa3.h"

namespace fa3::detail {

// fa3::forward / fa3::backward without the per-pointer cudaPointerGetAttributes checks (one per
// non-null pointer, up to 19 per call): they guard C callers against host pointers, which a
// PyTorch CUDA tensor cannot be, and are most of a small call's host time after the launch.
Status forward_device_tensors(const FwdArgs& args, cudaStream_t stream);
Status backward_device_tensors(const BwdArgs& args, cudaStream_t stream);
Status combine_device_tensors(const CombineArgs& args, cudaStream_t stream);

}  // namespace fa3::detail
