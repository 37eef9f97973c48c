// The CPU reference of fa3_quantize_fp8 (fa3_c.h): the same arithmetic in the same order as the
// kernel (src/fp8/fp8_format.h; the Walsh-Hadamard butterflies by stride 1, 2, 4, ...), so its
// e4m3 bytes and descales are the kernel's bit for bit.
#pragma once
#include <cstdint>
#include <vector>

namespace fa3::ref {

// y = (x * signs(seed)) H for one row of d values (d a power of two), unnormalised: H's entries
// are +-1. In place.
void hadamard_row(float* x, int d, uint64_t seed);

// One (sequence, head): rows x d values (the 16-bit inputs as floats, row-major) to e4m3 bytes
// (rows x d) and one descale per block of block_size rows (ceil(rows / block_size) of them).
struct Quantized {
  std::vector<uint8_t> bytes;
  std::vector<float> descale;
};
Quantized quantize_fp8(const std::vector<float>& x, int rows, int d, int block_size, bool hadamard, uint64_t seed);

}  // namespace fa3::ref
