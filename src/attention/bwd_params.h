// What the backward kernels read: built once per call on the host, passed as __grid_constant__.
#pragma once
#include <cuda.h>

#include <cstdint>

#include "fa3/fa3_c.h"
#include "src/attention/fwd_params.h"

namespace fa3::attn {

// Where the rows of (sequence b, query head h) start in the backward's per-query-row scratch
// (lse2, delta, dq_accum; the semaphores are one per kBlockM of those rows), each sequence's in
// whole kBlockM blocks:
//  - fixed lengths, or seqused_q without packing: [batch][heads_q][seqlen_q rounded up];
//  - packed Q (cu_seqlens_q): [heads_q][packed_rows], sequence b at
//    floor((cu_seqlens_q[b] + b kBlockM) / kBlockM) kBlockM: blocks start aligned, and the next
//    sequence starts at least ceil(len_b / kBlockM) blocks later, so no two sequences share a
//    block; packed_rows = total_q + batch kBlockM rounded up to kBlockM bounds them all.
struct BwdWorkspaceRows {
  int heads_q, seqlen_q_rounded, block_m;
  int64_t packed_rows;  // packed Q: rows per head; 0 otherwise
  __host__ __device__ __forceinline__ static int64_t dense_row0(int b, int h, int heads_q, int seqlen_q_rounded) {
    return (int64_t(b) * heads_q + h) * seqlen_q_rounded;
  }
  __host__ __device__ __forceinline__ int64_t row0(int b, int h, int q_row0) const {
    if (packed_rows == 0) return dense_row0(b, h, heads_q, seqlen_q_rounded);
    return int64_t(h) * packed_rows + (int64_t(q_row0) + int64_t(b) * block_m) / block_m * block_m;
  }
  // The same where block_m is known at compile time (the main kernel's kBlockM, a power of two):
  // a shift, not a 64-bit division, whose registers the producer warps of the varlen d64 kernel
  // did not have (it spilled 236 bytes at 40 registers).
  template <int kBlockM>
  __host__ __device__ __forceinline__ int64_t row0(int b, int h, int q_row0) const {
    static_assert((kBlockM & (kBlockM - 1)) == 0, "a power-of-two block");
    if (packed_rows == 0) return dense_row0(b, h, heads_q, seqlen_q_rounded);
    return int64_t(h) * packed_rows + ((uint64_t(q_row0) + uint64_t(b) * kBlockM) & ~uint64_t(kBlockM - 1));
  }
};

// Workspace of the Hopper backward (bwd_workspace_layout places it), rows as BwdWorkspaceRows:
//  - lse2, delta: fp32 per query row: LSE * log2(e) (+inf for rows past the sequence or without
//    a visible key, so that their P is 0) and D = rowsum(dO * O) (0 there);
//  - dq_accum: [m-blocks][kBlockM * d] fp32, each block's two 64 x 64 parts in the accumulator's
//    register order (bwd_mma.cuh: element (register i, thread t) at i * 128 + t), so that a
//    warpgroup stages and reduce-adds it without bank conflicts and as one contiguous bulk copy;
//  - dq_semaphore: [m-blocks] int32 kBwdDqSemaphoreStride apart, deterministic mode: how many key
//    blocks' adds into the block's dQ completed (the query-rows tile: the first two ints, one per
//    consumer warpgroup's head dims, bwd_dq_gate.cuh). The writers of every SM poll them: 16 bytes
//    apart (4 bytes apart, d64's deterministic mode ran ~5% slower: perf-log step 74).
constexpr int kBwdDqSemaphoreStride = 4;
struct BwdKernelParams {
  // The forward's parameters of the same problem: the Q, K, V maps (boxes of kBlockM / kBlockN
  // rows), lengths, masks and scales, so that SeqlenInfo and the block ranges serve both directions.
  FwdKernelParams fwd;
  CUtensorMap tma_do;  // dO, boxes of kBlockM rows, head_dim_v columns

  fa3_tensor dk, dv;  // the API's views (element strides)

  const float* lse2;
  const float* delta;
  float* dq_accum;
  int* dq_semaphore;
  int seqlen_q_rounded;  // m-blocks * kBlockM: the row count of lse2 / delta per (batch, head)
  float scale;           // softmax scale: dK and dQ are scale * (dS K), (dS^T Q)
  bool deterministic;
  // Deterministic mode's order of the key blocks adding into a query block's dQ (bwd_load.cuh):
  // kDqOrderIncreasing (n ascending; CTAs launched by key block), kDqOrderDecreasing (masked
  // problems: n descending, the order in which the key blocks reach a query block, CTAs launched
  // from the last key block), kDqOrderRotating (unmasked, num_n_blocks <= the SMs, and per sequence
  // key blocks N <= query blocks M (BwdSeqOrder): CTA n starts its walk at m-block n * M / N and
  // wraps, CTAs launched from the last key block).
  int dq_order;
  int num_n_blocks;
  // Varlen (kept last: the fixed-length kernels' parameter offsets stay as they were).
  BwdWorkspaceRows ws_rows;
};
enum BwdDqOrder : int { kDqOrderIncreasing = 0, kDqOrderDecreasing = 1, kDqOrderRotating = 2 };

// The preprocess and postprocess kernels (bwd_prepost.cuh): plain pointers and strides.
struct BwdPrepostParams {
  fa3_tensor o, dout, dq;  // the API's views (element strides)
  const float* lse;
  float* lse2;
  float* delta;
  float* dq_accum;
  int* dq_semaphore;
  int heads_q, seqlen_q, seqlen_q_rounded, head_dim_qk, head_dim_v;
  int head_dim_padded;  // the main kernel's tile (dq_accum's layout; its kBlockM is the kernels' template argument)
  // dq_accum's block layout (bwd_prepost.cuh): dq_accum_index (the key-rows tiles' staged parts)
  // or dq_accum_index_transposed (the query-rows tile's adds of dQ^T).
  int dq_accum_transposed;
  float scale;
  // Varlen: the API's arrays (any of them null), total_q (LSE's row count with cu_seqlens_q).
  const int* cu_seqlens_q;
  const int* seqused_q;
  int total_q;
  BwdWorkspaceRows ws_rows;
  // Optional: the loss's gradient w.r.t. the forward's LSE, laid out as `lse` (fa3_bwd_params.dlse);
  // the preprocess takes it into D (D = rowsum(dO * O) - dLSE).
  const float* dlse;
};

}  // namespace fa3::attn
