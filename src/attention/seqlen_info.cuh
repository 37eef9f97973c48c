// Per-tile sequence info: how many query and key rows the tile's batch entry has, where its rows
// lie in the Q/O and K/V tensors, and which visibility shortcuts hold for it. The producer fills it
// once per tile (into the tile's note, fwd_smem.cuh); block ranges, the mask, the mainloop and the
// epilogue read it, so a kernel's geometry is the same whatever the sequences' layout.
//  - fixed-length batches (SeqlenInfo<false>): everything comes from the kernel parameters; the
//    struct holds nothing the compiler must keep in registers;
//  - varlen (SeqlenInfo<true>): cu_seqlens_q/k give packed rows (the sequence is one batch entry of
//    the packed tensor at row offset cu_seqlens[b]), seqused_q/k the used lengths (with or without
//    packing).
#pragma once
#include <cstdint>

#include "src/attention/fwd_params.h"

namespace fa3::attn {

template <bool kVarlen>
struct SeqlenInfo;

// Both take the kernel parameters in every accessor rather than holding a pointer to them: the
// consumers keep a tile's info in registers next to S, P and O, and the parameters are in the
// constant bank anyway.
template <>
struct SeqlenInfo<false> {
  int batch;
  __host__ __device__ __forceinline__ SeqlenInfo(const FwdKernelParams&, int b) : batch(b) {}
  // Before the first tile (a placeholder the first note overwrites).
  __host__ __device__ __forceinline__ static SeqlenInfo unset(const FwdKernelParams& p) { return {p, 0}; }
  __host__ __device__ __forceinline__ int seqlen_q(const FwdKernelParams& p) const { return p.seqlen_q; }
  __host__ __device__ __forceinline__ int seqlen_k(const FwdKernelParams& p) const { return p.seqlen_k; }
  // TMA coordinates of the sequence's first row: (row, batch) in the 4-D maps.
  __host__ __device__ __forceinline__ int q_row0() const { return 0; }
  __host__ __device__ __forceinline__ int k_row0() const { return 0; }
  __host__ __device__ __forceinline__ int q_batch(const FwdKernelParams&) const { return batch; }
  __host__ __device__ __forceinline__ int k_batch(const FwdKernelParams&) const { return batch; }
  __host__ __device__ __forceinline__ bool every_row_sees_a_key(const FwdKernelParams& p) const {
    return p.every_row_sees_a_key;
  }
  // Element offset of (head, the sequence's row 0) in the LSE buffer: [batch][heads_q][seqlen_q].
  __host__ __device__ __forceinline__ int64_t lse_offset(const FwdKernelParams& p, int head) const {
    return (int64_t(batch) * p.heads_q + head) * p.seqlen_q;
  }
  // Element offset of (the sequence's row 0, head) in O.
  __host__ __device__ __forceinline__ int64_t o_offset(const FwdKernelParams& p, int head) const {
    return int64_t(batch) * p.o_batch_stride + int64_t(head) * p.o_head_stride;
  }
};

template <>
struct SeqlenInfo<true> {
  int batch;
  int sq, sk;
  int q0, k0;  // first packed row (cu_seqlens), else 0

  // What the tile's note carries (the consumers).
  __device__ __forceinline__ SeqlenInfo(int b, int seqlen_q, int seqlen_k, int q_row0, int k_row0)
      : batch(b), sq(seqlen_q), sk(seqlen_k), q0(q_row0), k0(k_row0) {}
  __device__ __forceinline__ static SeqlenInfo unset(const FwdKernelParams&) { return {0, 0, 0, 0, 0}; }
  // From the API's arrays in global memory (the producer, once per tile).
  __device__ __forceinline__ SeqlenInfo(const FwdKernelParams& p, int b) : batch(b) {
    q0 = p.cu_seqlens_q ? p.cu_seqlens_q[b] : 0;
    k0 = p.cu_seqlens_k ? p.cu_seqlens_k[b] : 0;
    sq = p.seqused_q ? p.seqused_q[b] : p.cu_seqlens_q ? p.cu_seqlens_q[b + 1] - q0 : p.seqlen_q;
    sk = p.seqused_k ? p.seqused_k[b] : p.cu_seqlens_k ? p.cu_seqlens_k[b + 1] - k0 : p.seqlen_k;
  }
  __device__ __forceinline__ int seqlen_q(const FwdKernelParams&) const { return sq; }
  __device__ __forceinline__ int seqlen_k(const FwdKernelParams&) const { return sk; }
  __device__ __forceinline__ int q_row0() const { return q0; }
  __device__ __forceinline__ int k_row0() const { return k0; }
  __device__ __forceinline__ int q_batch(const FwdKernelParams& p) const { return p.cu_seqlens_q ? 0 : batch; }
  __device__ __forceinline__ int k_batch(const FwdKernelParams& p) const { return p.cu_seqlens_k ? 0 : batch; }
  // No left window edge and no row above the first key's diagonal (bottom-right alignment); a
  // sequence without keys is a zero tile and never reaches the mask.
  __device__ __forceinline__ bool every_row_sees_a_key(const FwdKernelParams& p) const {
    return p.window_left < 0 && sq <= sk;
  }
  // LSE: [heads_q][total_q] for packed Q (FlashAttention's varlen layout), else [batch][heads_q][seqlen_q].
  __device__ __forceinline__ int64_t lse_offset(const FwdKernelParams& p, int head) const {
    return p.cu_seqlens_q ? int64_t(head) * p.total_q + q0 : (int64_t(batch) * p.heads_q + head) * p.seqlen_q;
  }
  __device__ __forceinline__ int64_t o_offset(const FwdKernelParams& p, int head) const {
    return (p.cu_seqlens_q ? int64_t(q0) * p.o_row_stride : int64_t(batch) * p.o_batch_stride) +
           int64_t(head) * p.o_head_stride;
  }
};

}  // namespace fa3::attn
