// FP8 quantization of attention inputs (fa3_quantize_fp8): 16-bit [batch, seqlen, heads, head_dim]
// to e4m3 with a descale per block of positions, optionally rotated by a random-sign Hadamard
// matrix first (FlashAttention-3's incoherent processing). The arithmetic is fp8_format.h's.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "fa3/fa3_c.h"
#include "src/api/status.h"
#include "src/fp8/fp8_format.h"

namespace fa3::fp8 {

// The kernel takes a (sequence, head)'s rows in chunks: 128 rows, or one block of more (its max
// needs all of them). Their count is numbered in 32 bits on the GPU: validate_quantize bounds it.
constexpr int kChunkRows = 128;
constexpr int chunk_rows(int block_size) { return block_size > kChunkRows ? block_size : kChunkRows; }
inline int64_t chunk_count(const fa3_quantize_params& p) {
  const int64_t rows = chunk_rows(p.block_size);
  return (int64_t(p.seqlen) + rows - 1) / rows * p.heads * p.batch;
}

// One quantization kernel for validated parameters.
Status launch_quantize(const fa3_quantize_params& p, cudaStream_t stream);

}  // namespace fa3::fp8
