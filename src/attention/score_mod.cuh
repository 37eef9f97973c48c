// Score modifiers: applied once to each S fragment after QK^T and before the mask, so the mask's
// hidden scores stay hidden whatever the modifier does to visible ones.
//  - none;
//  - softcap (Gemma 2, Grok): s -> c * tanh(scale * s / c). The factor c joins the softmax's log2
//    scale (FwdKernelParams::scale_log2 = c * log2 e), so here it is one FMUL and one MUFU.TANH per
//    score; visible scores then lie in [-c, c].
// Attention sinks (one logit per head in the denominator) belong to the softmax, not here.
#pragma once
#include "src/attention/fwd_params.h"
#include "src/hopper/arch.cuh"

namespace fa3::attn {

template <bool kSoftcap>
struct ScoreMod {
  template <int N>
  __device__ __forceinline__ static void apply(float (&)[N], const FwdKernelParams&) {}
};

template <>
struct ScoreMod<true> {
  template <int N>
  __device__ __forceinline__ static void apply(float (&s)[N], const FwdKernelParams& p) {
#pragma unroll
    for (int i = 0; i < N; ++i) s[i] = hopper::tanh_approx(s[i] * p.softcap_scale);
  }
};

}  // namespace fa3::attn
