// FP8 descales (FlashAttention-3's per-(batch, kv head) factors): Q and K are stored as q / dq and
// k / dk, so S = dq dk (Q_8 K_8^T): dq dk joins the exp2 scale of the tile's softmax (one factor
// per tile, free in the loop); V as v / dv, so O = dv (P V_8) / sum: dv joins the final 1/sum.
#pragma once
#include "src/attention/fwd_params.h"

namespace fa3::attn {

__device__ __forceinline__ float descale_of(const float* d, const FwdKernelParams& p, int batch, int head_q) {
  if (d == nullptr) return 1.f;
  return d[batch * p.descale_batch_stride + (head_q / p.head_ratio) * p.descale_head_stride];
}

// The exp2 scale of a tile's softmax: the problem's, times dq dk for e4m3 operands.
template <bool kFp8>
__device__ __forceinline__ float softmax_scale_log2(const FwdKernelParams& p, int batch, int head_q) {
  if constexpr (kFp8)
    return p.scale_log2 * descale_of(p.q_descale, p, batch, head_q) * descale_of(p.k_descale, p, batch, head_q);
  else return p.scale_log2;
}

// What O's final 1/sum is multiplied by: dv for e4m3 operands.
template <bool kFp8>
__device__ __forceinline__ float output_descale(const FwdKernelParams& p, int batch, int head_q) {
  if constexpr (kFp8) return descale_of(p.v_descale, p, batch, head_q);
  else return 1.f;
}

}  // namespace fa3::attn
