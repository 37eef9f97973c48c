// Bit-level float conversions. Written with integer arithmetic rather than compiler half types so
// they behave identically under g++ and nvcc's host compiler, and so subnormal and tie cases are
// explicit.
#include "reference/rounding.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

namespace fa3::ref {
namespace {

uint32_t bits_of(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
}

constexpr uint32_t kAbsMask = 0x7fffffffu;
constexpr uint32_t kInfBits = 0x7f800000u;

// m >> n rounded to nearest, ties to even. Callers pass a 24-bit significand, so for n >= 25 the
// whole value is below half of one unit and rounds to 0.
uint32_t shift_rne(uint32_t m, int n) {
  if (n <= 0) return m;
  if (n >= 25) return 0;
  const uint32_t kept = m >> n;
  const uint32_t rest = m & ((1u << n) - 1);
  const uint32_t half = 1u << (n - 1);
  return (rest > half || (rest == half && (kept & 1u))) ? kept + 1 : kept;
}

// Unbiased exponent and 24-bit significand (implicit bit set) of a finite float. Float
// subnormals get exponent -127, far below every target's range, so they round to zero.
int exponent_of(uint32_t abs_bits) { return static_cast<int>(abs_bits >> 23) - 127; }
uint32_t significand_of(uint32_t abs_bits) { return (abs_bits & 0x7fffffu) | 0x800000u; }

}  // namespace

uint16_t to_bf16_bits(float x) {
  const uint32_t u = bits_of(x);
  if ((u & kAbsMask) > kInfBits) return static_cast<uint16_t>((u >> 16) | 0x0040u);  // quiet NaN
  // Adding 0x7fff (+1 when the kept part is odd) carries into bit 16 exactly when RNE rounds up;
  // a carry out of the exponent lands on inf, which is the correct overflow.
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

float from_bf16_bits(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

uint16_t to_fp16_bits(float x) {
  const uint32_t u = bits_of(x);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & kAbsMask;
  if (a > kInfBits) return static_cast<uint16_t>(sign | 0x7e00u);
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 rounds to inf
  const int e = exponent_of(a);
  const uint32_t m = significand_of(a);
  if (e >= -14) {
    // Keep 11 significant bits; a rounding carry to 0x800 correctly bumps the exponent.
    const uint32_t r = shift_rne(m, 13);
    return static_cast<uint16_t>(sign | ((static_cast<uint32_t>(e + 15) << 10) + r - 0x400u));
  }
  // Subnormal: code = value / 2^-24 = m * 2^(e + 1); rounding up to 0x400 yields the smallest
  // normal.
  return static_cast<uint16_t>(sign | shift_rne(m, -e - 1));
}

float from_fp16_bits(uint16_t bits) {
  const float sign = (bits & 0x8000u) ? -1.0f : 1.0f;
  const int e = (bits >> 10) & 0x1f;
  const int m = bits & 0x3ff;
  if (e == 31) return m ? std::numeric_limits<float>::quiet_NaN() : sign * INFINITY;
  if (e == 0) return sign * std::ldexp(static_cast<float>(m), -24);
  return sign * std::ldexp(static_cast<float>(m | 0x400), e - 25);
}

uint8_t to_e4m3_bits(float x) {
  const uint32_t u = bits_of(x);
  const uint32_t a = u & kAbsMask;
  if (a > kInfBits) return 0x7f;
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  if (a > bits_of(448.0f)) return static_cast<uint8_t>(sign | 0x7e);  // satfinite; also catches inf
  const int e = exponent_of(a);
  const uint32_t m = significand_of(a);
  if (e >= -6) {
    // Keep 4 significant bits. Values <= 448 never round past 448, so 0x7f (NaN) is unreachable.
    const uint32_t r = shift_rne(m, 20);
    return static_cast<uint8_t>(sign | ((static_cast<uint32_t>(e + 7) << 3) + r - 8u));
  }
  // Subnormal: code = value / 2^-9 = m * 2^(e - 14).
  return static_cast<uint8_t>(sign | shift_rne(m, 14 - e));
}

float from_e4m3_bits(uint8_t bits) {
  const float sign = (bits & 0x80u) ? -1.0f : 1.0f;
  const int e = (bits >> 3) & 0xf;
  const int m = bits & 0x7;
  if (e == 15 && m == 7) return std::numeric_limits<float>::quiet_NaN();  // e4m3fn has no inf
  if (e == 0) return sign * std::ldexp(static_cast<float>(m), -9);
  return sign * std::ldexp(static_cast<float>(m | 8), e - 10);
}

void round_vec(std::vector<float>& values, int dtype) {
  float (*round)(float) = nullptr;
  switch (dtype) {
    case 0:
      round = round_fp16;
      break;
    case 1:
      round = round_bf16;
      break;
    case 2:
      round = round_e4m3;
      break;
    case 3:
      return;  // fp32: nothing to do
    default:
      throw std::invalid_argument("fa3::ref::round_vec: unknown dtype " + std::to_string(dtype) +
                                  " (expected 0 = fp16, 1 = bf16, 2 = e4m3, 3 = fp32)");
  }
  for (float& v : values) v = round(v);
}

}  // namespace fa3::ref
