// Score modifiers: applied once to each S fragment after QK^T and before the mask, so the mask's
// hidden scores stay hidden whatever the modifier does to visible ones.
//  - none;
//  - softcap (Gemma 2, Grok): s -> c * tanh(scale * s / c). The factor c joins the softmax's log2
//    scale (FwdKernelParams::scale_log2 = c * log2 e), so here it is one FMUL and one MUFU.TANH per
//    score; visible scores then lie in [-c, c].
// kDescaled (e4m3 operands): S holds Q_8 K_8^T, and the tile's descales dq dk (descale.cuh) must go
// inside the tanh, where no later factor can reach them: tanh's factor is then the tile's
// (scale / c x dq dk), set with the tile's softmax (MainloopMma::scores). The 16-bit kernels read
// the problem's factor from the parameters (a constant-bank operand, no register).
// kBlockScales (e4m3 with block descales): the factor differs by row (Q's block factor) and by key
// block (K's): tanh's factor of each of the thread's two rows is scale / c x dq dk x q(row), set
// with the tile's softmax, times key block n's k(n) once its K stage's slot is read
// (MainloopMma::s_done): two FMULs a block, the same FMUL and MUFU.TANH per score.
// Attention sinks (one logit per head in the denominator) belong to the softmax, not here.
#pragma once
#include "src/attention/fwd_params.h"
#include "src/hopper/arch.cuh"
#include "src/hopper/wgmma.cuh"

namespace fa3::attn {

template <bool kSoftcap, bool kDescaled = false, bool kBlockScales = false>
struct ScoreMod {
  __device__ __forceinline__ void begin_tile(const FwdKernelParams&, float /*qk_descale*/) {}
  template <int N>
  __device__ __forceinline__ void apply(float (&)[N], const FwdKernelParams&) const {}
};

template <>
struct ScoreMod<true, false> {
  __device__ __forceinline__ void begin_tile(const FwdKernelParams&, float) {}
  template <int N>
  __device__ __forceinline__ void apply(float (&s)[N], const FwdKernelParams& p) const {
#pragma unroll
    for (int i = 0; i < N; ++i) s[i] = hopper::tanh_approx(s[i] * p.softcap_scale);
  }
};

template <>
struct ScoreMod<true, true> {
  float factor = 0.f;  // the tile's scale / c x dq dk
  __device__ __forceinline__ void begin_tile(const FwdKernelParams& p, float qk_descale) {
    factor = p.softcap_scale * qk_descale;
  }
  template <int N>
  __device__ __forceinline__ void apply(float (&s)[N], const FwdKernelParams&) const {
#pragma unroll
    for (int i = 0; i < N; ++i) s[i] = hopper::tanh_approx(s[i] * factor);
  }
};

template <>
struct ScoreMod<true, true, true> {
  float row_factor[2] = {0.f, 0.f};  // the rows' scale / c x dq dk x q(row)
  float factor[2] = {0.f, 0.f};      // those times the current key block's k(n)
  __device__ __forceinline__ void begin_rows(float f0, float f1) {
    row_factor[0] = f0;
    row_factor[1] = f1;
  }
  __device__ __forceinline__ void begin_block(float k_factor) {
    factor[0] = row_factor[0] * k_factor;
    factor[1] = row_factor[1] * k_factor;
  }
  template <int N>
  __device__ __forceinline__ void apply(float (&s)[N], const FwdKernelParams&) const {
#pragma unroll
    for (int i = 0; i < N; ++i) s[i] = hopper::tanh_approx(s[i] * factor[hopper::acc_row(i) ? 1 : 0]);
  }
};

}  // namespace fa3::attn
