// The FP8 format facts and the quantizer's arithmetic that fa3_quantize_fp8's kernel
// (quantize_fp8.cu) and the tests' CPU reference (reference/quantize.cpp) share, so that the two
// compute the same bits. Plain C++: no CUDA header.
#pragma once
#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define FA3_HD __host__ __device__
#else
#define FA3_HD
#endif

namespace fa3::fp8 {

constexpr float kE4m3Max = 448.f;

// The rotation's +-1 for column c: the top bit of splitmix64 of (seed, c).
FA3_HD inline float hadamard_sign(uint64_t seed, int c) {
  uint64_t z = seed + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(c + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return (z >> 63) ? -1.f : 1.f;
}

// The block's descale from the largest |y| of the unnormalised transform y (norm: 1 / sqrt(d) with
// the rotation, else 1), and the factor y is multiplied by before rounding to e4m3.
FA3_HD inline float descale_of(float amax, float norm) { return amax > 0.f ? amax / kE4m3Max * norm : 1.f; }
FA3_HD inline float quant_factor(float amax) { return amax > 0.f ? kE4m3Max / amax : 0.f; }
// 1 / sqrt(d): the rotation's normalisation (IEEE sqrt and division on both sides).
FA3_HD inline float rotation_norm(int d) { return 1.f / sqrtf(static_cast<float>(d)); }

}  // namespace fa3::fp8
