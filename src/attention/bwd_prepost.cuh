// The backward's two small kernels around the main one (FlashAttention-2/3's split):
//  - preprocess, one CTA per query block: D = rowsum(dO * O) in fp32, LSE into the log2 domain the
//    main kernel's exp2 wants, and the dQ accumulator and semaphores cleared (no memset, no host
//    work: the whole backward is three launches a CUDA graph captures);
//  - postprocess, one CTA per query block: dQ = scale * accumulator, converted to the output dtype
//    (from either accumulator layout the main kernels write).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "src/attention/bwd_params.h"
#include "src/hopper/elem.cuh"

namespace fa3::attn {

// The accumulator's blocks of query rows: a main kernel's query block is one or two of them.
constexpr int kDqAccumBlockM = 64;

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

// The query-rows tile's layout (bwd_mma_query_rows.cuh): part x / 64 holds a warpgroup's 64 x 64
// slice of dQ^T (fragment row x % 64, fragment column = query row rr) in register order, four
// consecutive registers per 16 bytes (one red.global.add.v4 of a thread): register i of thread t at
// part * 4096 + (i / 4) * 512 + 4 t + i % 4.
__host__ __device__ __forceinline__ int dq_accum_index_transposed(int rr, int x) {
  const int part = x / 64, r = x % 64;
  const int reg = 4 * (rr / 8) + 2 * ((r % 16) / 8) + (rr % 2);
  const int thread = 32 * (r / 16) + 4 * (r % 8) + (rr % 8) / 2;
  return part * 64 * 64 + (reg / 4) * 512 + 4 * thread + reg % 4;
}

// Float4 v of a part in that layout: thread v % 128's registers 4 (v / 128) .. + 3, i.e. elements
// (row, col), (row + 1, col), (row, col + 8), (row + 1, col + 8) of dQ (rows queries, columns the
// part's 64 head dims).
struct DqAccumTransposedVec {
  int row, col;
  __host__ __device__ __forceinline__ explicit DqAccumTransposedVec(int v) {
    const int t = v % 128;
    row = 8 * (v / 128) + 2 * (t % 4);
    col = 16 * (t / 32) + (t % 32) / 4;
  }
};

// Both kernels run a CTA of kPrepostThreads per (query block, head, sequence) and move 16 bytes
// per access: they are bandwidth-bound, and at 1k tokens they took a quarter of the backward's time
// when they ran at 1.3-3.4 TB/s (a warp per row with 2-byte loads, a one-element gather: perf-log
// step 86).
constexpr int kPrepostThreads = 256;

// The postprocess's unit: the 8 dQ columns 8 oc .. 8 oc + 7 of one row of a query block. In the
// accumulator tile (dq_accum_index) they are registers 4c + 2h (the even columns) and 4c + 2h + 1 (the
// odd ones), c = oc % 8, of the four threads 32w + 4g .. + 3 of part oc / 8: two 16-byte vectors.
// Rows g and g + 1 (g even) hold the two halves of one 32-byte sector, so units come in such pairs
// (unit u: parity u & 1), and consecutive pairs walk a row's octets: a warp reads whole sectors and
// writes whole row segments. (Lanes on 32 different rows, 16 bytes each, ran at half the
// bandwidth: perf-log step 86.)
struct DqAccumOctet {
  int row, col;   // of its first element in the query block
  int even, odd;  // float4 indices (in the block's tile) of its even and odd columns
  __host__ __device__ __forceinline__ DqAccumOctet(int u, int octets_per_row) {
    const int pair = (u >> 1) / octets_per_row, oc = (u >> 1) % octets_per_row;
    const int w = pair / 8, h = (pair / 4) & 1, g = 2 * (pair % 4) + (u & 1);
    row = 16 * w + g + 8 * h;
    col = 8 * oc;
    // dq_accum_index(row, col) / 4 and (row, col + 1) / 4 (the CPU test checks it), written out:
    // through dq_accum_index's general divisions the postprocess had 30% more instructions.
    even = (64 * 64 * (oc / 8) + (4 * (oc % 8) + 2 * h) * 128 + 32 * w + 4 * g) / 4;
    odd = even + 128 / 4;
  }
};

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
// the longest sequence, and a shorter one's blocks past its last leave. A row's d_v columns are
// read by `lanes` consecutive threads (a power of two >= d_v / 8), 16 bytes each; the loads in
// flight come from the CTAs an SM holds (few registers), not from unrolling.
template <class T, int kBlockM>
__global__ void __launch_bounds__(kPrepostThreads) bwd_preprocess_kernel(const BwdPrepostParams p) {
  const int m = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const PrepostSeq seq(p, b);
  if (m * kBlockM >= seq.len) return;
  const int64_t block_row0 = p.ws_rows.row0(b, h, seq.row0) + int64_t(m) * kBlockM;
  const int chunks = p.head_dim_v / 8;
  const int lanes = chunks <= 1 ? 1 : 1 << (32 - __clz(chunks - 1));
  const int chunk = threadIdx.x % lanes;
#pragma unroll 2
  for (int rr0 = 0; rr0 < kBlockM; rr0 += kPrepostThreads / lanes) {  // uniform: the shuffles need every lane
    const int rr = rr0 + int(threadIdx.x) / lanes, r = m * kBlockM + rr;
    float dot = 0.f;
    if (rr < kBlockM && r < seq.len && chunk < chunks) {
      auto chunk_of = [&](const fa3_tensor& t) {
        return *reinterpret_cast<const uint4*>(static_cast<const T*>(t.data) + seq.at(p, t, b, r, h) + 8 * chunk);
      };
      float x[8], y[8];
      hopper::to_float8<T>(chunk_of(p.o), x);
      hopper::to_float8<T>(chunk_of(p.dout), y);
#pragma unroll
      for (int e = 0; e < 8; ++e) dot = fmaf(x[e], y[e], dot);
    }
    for (int off = lanes / 2; off > 0; off >>= 1) dot += __shfl_xor_sync(0xffffffff, dot, off);
    if (chunk == 0 && rr < kBlockM) {
      float lse2 = INFINITY;
      if (r < seq.len) {
        const int64_t at = seq.lse(p, b, r, h);
        const float lse = p.lse[at];
        // A row without a visible key has LSE -inf (and O = 0): +inf makes its P exactly 0.
        if (lse != -INFINITY) lse2 = lse * 1.4426950408889634f;
        // LSE's own gradient: dLSE_i / dS_ij = P_ij, so dS_ij = P_ij (dP_ij - D_i + dLSE_i), and the
        // main kernel and the sinks' gradient need only D_i - dLSE_i.
        if (p.dlse != nullptr) dot -= p.dlse[at];
      }
      p.lse2[block_row0 + rr] = lse2;
      p.delta[block_row0 + rr] = dot;
    }
  }
  // The block's counters (one, or one per consumer warpgroup: bwd_dq_gate.cuh), in one store.
  static_assert(kBwdDqSemaphoreStride == 4, "a block's counters are one int4");
  if (threadIdx.x == 0)
    *reinterpret_cast<int4*>(p.dq_semaphore + block_row0 / kBlockM * kBwdDqSemaphoreStride) = make_int4(0, 0, 0, 0);
  // The block's accumulator (kBlockM x d_padded contiguous floats), 16 bytes a store.
  float4* acc = reinterpret_cast<float4*>(p.dq_accum + block_row0 * p.head_dim_padded);
  for (int i = threadIdx.x; i < kBlockM * p.head_dim_padded / 4; i += kPrepostThreads)
    acc[i] = make_float4(0.f, 0.f, 0.f, 0.f);
}

// dQ = scale * accumulator, 8 consecutive columns a 16-byte store. dq_accum_index: each thread
// turns two 16-byte loads (DqAccumOctet) into one store. dq_accum_index_transposed: a part's
// columns of one row lie 64 bytes apart, so each 64 x 64 part goes through shared memory, read
// 16 bytes a thread in the layout's order and written to a [row][column] tile (rows padded to 68
// floats: a warp's scattered stores hit 32 banks, rows stay 16-byte aligned).
template <class T>
__global__ void __launch_bounds__(kPrepostThreads) bwd_postprocess_kernel(const BwdPrepostParams p) {
  constexpr int kBlockM = kDqAccumBlockM;
  constexpr int kStride = 68;
  __shared__ alignas(16) float tile[kBlockM * kStride];
  const int m = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const PrepostSeq seq(p, b);
  const int rows = min(kBlockM, seq.len - m * kBlockM);
  if (rows <= 0) return;
  const float4* acc = reinterpret_cast<const float4*>(
      p.dq_accum + (p.ws_rows.row0(b, h, seq.row0) + int64_t(m) * kBlockM) * p.head_dim_padded);
  T* dq = static_cast<T*>(p.dq.data) + seq.at(p, p.dq, b, m * kBlockM, h);
  auto store = [&](int row, int col, const float (&w)[8]) {
    float v[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] = w[e] * p.scale;
    *reinterpret_cast<uint4*>(dq + int64_t(row) * p.dq.row_stride + col) = hopper::from_float8<T>(v);
  };
  if (p.dq_accum_transposed) {  // uniform
    for (int part = 0; part < p.head_dim_padded / 64; ++part) {
      if (64 * part >= p.head_dim_qk) break;
      for (int v = threadIdx.x; v < 64 * 64 / 4; v += kPrepostThreads) {
        const DqAccumTransposedVec at(v);
        const float4 e = acc[part * 64 * 64 / 4 + v];
        tile[at.row * kStride + at.col] = e.x;
        tile[(at.row + 1) * kStride + at.col] = e.y;
        tile[at.row * kStride + at.col + 8] = e.z;
        tile[(at.row + 1) * kStride + at.col + 8] = e.w;
      }
      __syncthreads();
      for (int u = threadIdx.x; u < kBlockM * 8; u += kPrepostThreads) {
        const int row = u / 8, col = 8 * (u % 8);
        if (row >= rows || 64 * part + col >= p.head_dim_qk) continue;
        const float4 lo = *reinterpret_cast<const float4*>(&tile[row * kStride + col]);
        const float4 hi = *reinterpret_cast<const float4*>(&tile[row * kStride + col + 4]);
        store(row, 64 * part + col, {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w});
      }
      __syncthreads();  // the tile is read before the next part overwrites it
    }
    return;
  }
  const int octets = p.head_dim_padded / 8;
#pragma unroll 4
  for (int u = threadIdx.x; u < kBlockM * octets; u += kPrepostThreads) {
    const DqAccumOctet o(u, octets);
    if (o.row >= rows || o.col >= p.head_dim_qk) continue;
    const float4 e = acc[o.even], d = acc[o.odd];
    store(o.row, o.col, {e.x, d.x, e.y, d.y, e.z, d.z, e.w, d.w});
  }
}

}  // namespace fa3::attn
