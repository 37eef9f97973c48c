// The backward's two small kernels around the main one (FlashAttention-2/3's split):
//  - preprocess, one warp per query row: D = rowsum(dO * O) in fp32, LSE into the log2 domain the
//    main kernel's exp2 wants, and the dQ accumulator and semaphores cleared (no memset, no host
//    work: the whole backward is three launches a CUDA graph captures);
//  - postprocess, one CTA per query block: dQ = scale * accumulator, converted to the output dtype.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "src/attention/bwd_params.h"
#include "src/hopper/elem.cuh"

namespace fa3::attn {

// Where element (row r, column x) of a 64-row query block's dQ sits in its dq_accum tile: the block
// is d/64 parts of 64 columns, each in the order a warpgroup's m64n64 accumulator holds it
// (wgmma.cuh: register i of thread 32w + 4g + t is row 16w + g + 8((i >> 1) & 1), column
// 8(i >> 2) + 2t + (i & 1)), register-major.
__host__ __device__ __forceinline__ int dq_accum_index(int rr, int x) {
  const int part = x / 64, cc = x % 64;
  const int reg = 4 * (cc / 8) + 2 * ((rr % 16) / 8) + (cc % 2);
  const int thread = 32 * (rr / 16) + 4 * (rr % 8) + (cc % 8) / 2;
  return part * 64 * 64 + reg * 128 + thread;
}

constexpr int kPrepostWarps = 8;

// Sequence b's query rows as these kernels see them (runtime varlen: they are bandwidth-bound, one
// branch costs nothing): its length, its first packed row, and where its rows lie in a Q-shaped
// tensor, the LSE and the workspace.
struct PrepostSeq {
  int len, row0;
  __device__ __forceinline__ PrepostSeq(const BwdPrepostParams& p, int b) {
    row0 = p.cu_seqlens_q ? p.cu_seqlens_q[b] : 0;
    len = p.seqused_q ? p.seqused_q[b] : p.cu_seqlens_q ? p.cu_seqlens_q[b + 1] - row0 : p.seqlen_q;
  }
  // Element offset of (row r, head h) of a Q-shaped tensor (O, dO, dQ).
  __device__ __forceinline__ int64_t at(const BwdPrepostParams& p, const fa3_tensor& t, int b, int r, int h) const {
    return (p.cu_seqlens_q ? 0 : int64_t(b) * t.batch_stride) + int64_t(row0 + r) * t.row_stride +
           int64_t(h) * t.head_stride;
  }
  // The forward's LSE: [heads_q][total_q] for packed Q, else [batch][heads_q][seqlen_q].
  __device__ __forceinline__ int64_t lse(const BwdPrepostParams& p, int b, int r, int h) const {
    return p.cu_seqlens_q ? int64_t(h) * p.total_q + row0 + r : (int64_t(b) * p.heads_q + h) * p.seqlen_q + r;
  }
};

// Rows past the sequence (up to its last block's end) get LSE2 = +inf and D = 0; varlen grids cover
// the longest sequence, and a shorter one's warps past its last block leave.
template <class T>
__global__ void __launch_bounds__(kPrepostWarps * 32) bwd_preprocess_kernel(const BwdPrepostParams p) {
  const int lane = threadIdx.x % 32, h = blockIdx.y, b = blockIdx.z;
  const int r = blockIdx.x * kPrepostWarps + threadIdx.x / 32;
  const PrepostSeq seq(p, b);
  if (r >= (seq.len + p.block_m - 1) / p.block_m * p.block_m) return;
  const int64_t row = p.ws_rows.row0(b, h, seq.row0) + r;
  float d = 0.f, lse2 = INFINITY;
  if (r < seq.len) {
    const T* o = static_cast<const T*>(p.o.data) + seq.at(p, p.o, b, r, h);
    const T* dout = static_cast<const T*>(p.dout.data) + seq.at(p, p.dout, b, r, h);
    for (int x = lane; x < p.head_dim_v; x += 32) d += hopper::to_f32(o[x]) * hopper::to_f32(dout[x]);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) d += __shfl_xor_sync(0xffffffff, d, off);
    const float lse = p.lse[seq.lse(p, b, r, h)];
    // A row without a visible key has LSE -inf (and O = 0): +inf makes its P exactly 0.
    if (lse != -INFINITY) lse2 = lse * 1.4426950408889634f;
  }
  if (lane == 0) {
    p.lse2[row] = lse2;
    p.delta[row] = d;
    if (r % p.block_m == 0) p.dq_semaphore[row / p.block_m * kBwdDqSemaphoreStride] = 0;
  }
  // Row r's share of the block's accumulator: blocks are permuted inside, so any equal split clears it.
  float* acc = p.dq_accum + row * p.head_dim_padded;
  for (int x = lane; x < p.head_dim_padded; x += 32) acc[x] = 0.f;
}

template <class T>
__global__ void __launch_bounds__(256) bwd_postprocess_kernel(const BwdPrepostParams p) {
  const int m = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const PrepostSeq seq(p, b);
  const int rows = min(p.block_m, seq.len - m * p.block_m);
  if (rows <= 0) return;
  const float* acc = p.dq_accum + (p.ws_rows.row0(b, h, seq.row0) + int64_t(m) * p.block_m) * p.head_dim_padded;
  T* dq = static_cast<T*>(p.dq.data) + seq.at(p, p.dq, b, m * p.block_m, h);
  for (int e = threadIdx.x; e < rows * p.head_dim_qk; e += blockDim.x) {
    const int r = e / p.head_dim_qk, x = e % p.head_dim_qk;
    dq[int64_t(r) * p.dq.row_stride + x] = hopper::from_f32<T>(p.scale * acc[dq_accum_index(r, x)]);
  }
}

}  // namespace fa3::attn
