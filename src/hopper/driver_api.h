// The driver API functions fa3 calls without linking libcuda: asked of the runtime once per process
// (cudaGetDriverEntryPointByVersion) and shared by everything in src/hopper that needs one.
#pragma once
#include <cudaTypedefs.h>

#include <string>

namespace fa3::hopper {

// A driver function, or null with `why` saying what the lookup answered.
template <class Fn>
struct DriverFn {
  Fn fn = nullptr;
  std::string why;
};

struct DriverApi {
  DriverFn<PFN_cuTensorMapEncodeTiled_v12000> encode_tiled;  // TMA maps (tma_map.cpp)
  DriverFn<PFN_cuLaunchKernel_v4000> launch_kernel;          // launches (launch.cpp)
  DriverFn<PFN_cuGetErrorName_v6000> error_name;             // CUresult names in messages
};

const DriverApi& driver_api();

}  // namespace fa3::hopper
