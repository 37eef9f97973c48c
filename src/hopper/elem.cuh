// Element conversions to and from fp32 for the element types fa3 reads and writes (plain
// loads/stores, not the wgmma packing, which is Mma16::pack / MmaE4m3::pack4).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <type_traits>

namespace fa3::hopper {

template <class T>
__device__ __forceinline__ float to_f32(T x) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return __bfloat162float(x);
  else if constexpr (std::is_same_v<T, __half>) return __half2float(x);
  else return float(x);  // __nv_fp8_e4m3
}

template <class T>
__device__ __forceinline__ T from_f32(float x) {
  static_assert(std::is_same_v<T, __nv_bfloat16> || std::is_same_v<T, __half>, "16-bit outputs only");
  if constexpr (std::is_same_v<T, __nv_bfloat16>) return __float2bfloat16_rn(x);
  else return __float2half_rn(x);
}

}  // namespace fa3::hopper
