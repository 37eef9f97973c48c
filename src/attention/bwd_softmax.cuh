// The backward's probabilities, shared by its consumers (rows keys, bwd_mma.cuh; rows queries,
// bwd_mma_query_rows.cuh): which (key, query) pairs of a tile are visible, and P = exp2(S
// scale_log2 - LSE2) with softcap's tanh and its derivative.
#pragma once
#include <climits>

#include "src/attention/fwd_params.h"
#include "src/hopper/arch.cuh"

namespace fa3::attn {

// True when every pair of keys [j_lo, j_hi] and queries [i_lo, i_hi] is visible (bottom-right
// aligned windows; varlen: and every key is the sequence's).
template <bool kVarlen, class Seq>
__device__ __forceinline__ bool bwd_fully_visible(const FwdKernelParams& f, const Seq& seq, int j_lo, int j_hi, int i_lo,
                                                  int i_hi) {
  const int off = seq.seqlen_k(f) - seq.seqlen_q(f);
  return (f.window_right < 0 || j_hi <= i_lo + off + f.window_right) &&
         (f.window_left < 0 || j_lo >= i_hi + off - f.window_left) && (!kVarlen || j_hi < seq.seqlen_k(f));
}

// The mask of one thread's accumulator elements: key j of query q is visible iff
// off - left <= j - q <= off + right, and (varlen) j < seqlen_k. An element's j - q is the thread's
// (j0 - q0) plus register offsets (dj, dq), so the bounds are moved once per tile.
template <bool kVarlen>
struct BwdVisibility {
  int lo = 0, hi = 0, keys_left = 0;
  BwdVisibility() = default;
  template <class Seq>
  __device__ __forceinline__ BwdVisibility(const FwdKernelParams& f, const Seq& seq, int j0, int q0) {
    const int off = seq.seqlen_k(f) - seq.seqlen_q(f), base = j0 - q0;
    lo = f.window_left >= 0 ? off - f.window_left - base : INT_MIN / 2;
    hi = f.window_right >= 0 ? off + f.window_right - base : INT_MAX / 2;
    keys_left = seq.seqlen_k(f) - j0;
  }
  __device__ __forceinline__ bool hidden(int dj, int dq) const {
    const int rel = dj - dq;
    return rel < lo || rel > hi || (kVarlen && dj >= keys_left);
  }
};

// P of score s against its row's LSE2; *dscore = dP-to-dS factor (softcap: 1 - tanh^2, the
// derivative of c tanh(s / c)).
template <bool kSoftcap>
__device__ __forceinline__ float bwd_probability(float s, float lse2, const FwdKernelParams& f, float* dscore) {
  *dscore = 1.f;
  if constexpr (kSoftcap) {
    s = hopper::tanh_approx(s * f.softcap_scale);
    *dscore = 1.f - s * s;
  }
  return hopper::exp2_approx(fmaf(s, f.scale_log2, -lse2));
}

}  // namespace fa3::attn
