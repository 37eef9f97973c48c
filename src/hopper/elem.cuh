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

// 16-byte vectors of 8 16-bit elements (one vector load or store of a row's 8 columns) to and
// from fp32.
template <class T>
using Pair16 = std::conditional_t<std::is_same_v<T, __half>, __half2, __nv_bfloat162>;
__device__ __forceinline__ float2 to_float2(__nv_bfloat162 h) { return __bfloat1622float2(h); }
__device__ __forceinline__ float2 to_float2(__half2 h) { return __half22float2(h); }

template <class T>
__device__ __forceinline__ void to_float8(const uint4& raw, float (&x)[8]) {
  const Pair16<T>* pairs = reinterpret_cast<const Pair16<T>*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = to_float2(pairs[i]);
    x[2 * i] = f.x;
    x[2 * i + 1] = f.y;
  }
}

template <class T>
__device__ __forceinline__ uint4 from_float8(const float (&x)[8]) {
  uint4 raw;
  Pair16<T>* pairs = reinterpret_cast<Pair16<T>*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (std::is_same_v<T, __half>) pairs[i] = __floats2half2_rn(x[2 * i], x[2 * i + 1]);
    else pairs[i] = __floats2bfloat162_rn(x[2 * i], x[2 * i + 1]);
  }
  return raw;
}

}  // namespace fa3::hopper
