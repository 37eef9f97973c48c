#include "reference/quantize.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "reference/rounding.h"
#include "src/fp8/fp8_format.h"

namespace fa3::ref {

void hadamard_row(float* x, int d, uint64_t seed) {
  for (int c = 0; c < d; ++c) x[c] *= fp8::hadamard_sign(seed, c);
  for (int h = 1; h < d; h <<= 1)
    for (int c = 0; c < d; ++c)
      if ((c & h) == 0) {
        const float a = x[c], b = x[c + h];
        x[c] = a + b;
        x[c + h] = a - b;
      }
}

Quantized quantize_fp8(const std::vector<float>& x, int rows, int d, int block_size, bool hadamard, uint64_t seed) {
  if (block_size < 1 || x.size() != size_t(rows) * d) throw std::invalid_argument("quantize_fp8: bad shape");
  std::vector<float> y(x);
  if (hadamard)
    for (int r = 0; r < rows; ++r) hadamard_row(y.data() + size_t(r) * d, d, seed);
  const float norm = hadamard ? fp8::rotation_norm(d) : 1.f;
  Quantized q;
  q.bytes.resize(y.size());
  for (int r0 = 0; r0 < rows; r0 += block_size) {
    const int r1 = std::min(rows, r0 + block_size);
    float amax = 0.f;
    for (size_t i = size_t(r0) * d; i < size_t(r1) * d; ++i) amax = std::max(amax, std::fabs(y[i]));
    const float factor = fp8::quant_factor(amax);
    for (size_t i = size_t(r0) * d; i < size_t(r1) * d; ++i) q.bytes[i] = to_e4m3_bits(y[i] * factor);
    q.descale.push_back(fp8::descale_of(amax, norm));
  }
  return q;
}

}  // namespace fa3::ref
