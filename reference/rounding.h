// Host emulation of the device storage dtypes (fp16, bf16, float8 e4m3fn).
//
// Tests round host inputs through these before handing them to the GPU, so the reference sees
// exactly the values the kernel sees; the conversions must match the CUDA intrinsics bit for bit.
#pragma once

#include <cstdint>
#include <vector>

namespace fa3::ref {

// bfloat16: round to nearest even; NaN stays a (quiet) NaN; overflow gives inf.
uint16_t to_bf16_bits(float x);
float from_bf16_bits(uint16_t bits);

// IEEE binary16: round to nearest even, overflow gives inf, subnormals down to 2^-24.
uint16_t to_fp16_bits(float x);
float from_fp16_bits(uint16_t bits);

// float8 e4m3fn as __nv_fp8_e4m3 with __NV_SATFINITE: round to nearest even, |x| > 448 (and inf)
// saturates to +-448, NaN gives 0x7f, subnormals in steps of 2^-9.
uint8_t to_e4m3_bits(float x);
float from_e4m3_bits(uint8_t bits);

inline float round_bf16(float x) { return from_bf16_bits(to_bf16_bits(x)); }
inline float round_fp16(float x) { return from_fp16_bits(to_fp16_bits(x)); }
inline float round_e4m3(float x) { return from_e4m3_bits(to_e4m3_bits(x)); }

// Rounds every element in place to `dtype`, numbered as fa3_dtype: 0 = fp16, 1 = bf16, 2 = e4m3,
// 3 = fp32 (left unchanged). Anything else throws std::invalid_argument.
void round_vec(std::vector<float>& values, int dtype);

}  // namespace fa3::ref
