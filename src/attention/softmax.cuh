// Online softmax over one warpgroup's S fragments (FlashAttention-2/3): each thread owns two rows
// (g and g + 8 of its warp's 16) with kBlockN/4 scores each; the 4 lanes of a quad hold a row.
// Scores stay unscaled in S; the scale is folded into exp2's argument (one FFMA per score), and
// the running max lives in that log2 domain.  Rows that have seen only -inf stay finite-safe:
// their max is -inf, exp2 gets 0 as the subtrahend, and the correction factor is 1.
#pragma once
#include <cmath>

#include "src/hopper/arch.cuh"

namespace fa3::attn {

// The current key block's shift (kBlockScales): log2 r and 1 / r; constants otherwise, in a base
// class so that they take no storage (a member of an empty type renumbered the 16-bit kernels'
// PTX registers).
template <bool kBlockScales>
struct SoftmaxShift {
  struct {
    float log2_r = 0.f, inv_r = 1.f;
  } shift;
};
template <>
struct SoftmaxShift<false> {
  struct Constant {
    static constexpr float log2_r = 0.f, inv_r = 1.f;
  };
  static constexpr Constant shift{};
};

// kLazy: keep a stale running max until a block's max exceeds it by more than 2^8 (FlashAttention-4's
// conditional rescaling). Exponentials then reach at most 256 (harmless in fp32 and for bf16/fp16 P),
// the final 1/sum makes the result exact, and most blocks need no O rescale at all.
// kBlockScales (FP8 block descales; descale.cuh sets the values): each of the thread's two rows has
// an exp2 scale of its own, which may change from key block to key block (the running max is in
// the log2 domain, so a block's scale applies to that block's scores only); and each key block's
// logits may be shifted by log2 of a factor r (V's block factor): the softmax then runs on
// S * scale + log2 r, so P comes out multiplied by r, while the row sums take P / r (what the sums
// of the unshifted logits would be, at the same running max).
template <int kBlockN, bool kLazy = false, bool kBlockScales = false>
struct OnlineSoftmax : SoftmaxShift<kBlockScales> {
  using SoftmaxShift<kBlockScales>::shift;
  static constexpr float kLazyThreshold = 8.f;  // log2 of the largest tolerated exponential
  static constexpr float kLazyBound = 256.f;     // 2^kLazyThreshold
  static constexpr int kPerRow = kBlockN / 4;  // scores per thread per row
  float row_max[2];  // max(S * scale) so far (log2 domain), -inf before any visible key
  float row_sum[2];  // this thread's share of sum(exp2(S * scale - row_max))
  float scale_log2[kBlockScales ? 2 : 1];
  __device__ __forceinline__ float scale(int h) const { return scale_log2[kBlockScales ? h : 0]; }
  // x + log2 r, and the exp2 subtrahend of row max m (m - log2 r): x and m unchanged without
  // kBlockScales (spelled out: x + 0.f is not x for x = -0, so the compiler would keep the add).
  __device__ __forceinline__ float shifted(float x) const {
    if constexpr (kBlockScales) return x + shift.log2_r;
    else return x;
  }
  __device__ __forceinline__ float subtrahend(float m) const {
    if constexpr (kBlockScales) return m - shift.log2_r;
    else return m;
  }
  // Adds a block's sum of exponentials (for each row) to the row sums.
  __device__ __forceinline__ void add_sums(float sum0, float sum1) {
    if constexpr (kBlockScales) {
      row_sum[0] = fmaf(sum0, shift.inv_r, row_sum[0]);
      row_sum[1] = fmaf(sum1, shift.inv_r, row_sum[1]);
    } else {
      row_sum[0] += sum0;
      row_sum[1] += sum1;
    }
  }

  __device__ __forceinline__ explicit OnlineSoftmax(float scale) {
#pragma unroll
    for (float& x : scale_log2) x = scale;
    row_max[0] = row_max[1] = -INFINITY;
    row_sum[0] = row_sum[1] = 0.f;
  }

  __device__ __forceinline__ static float quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffff, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffff, x, 2));
  }
  __device__ __forceinline__ static float quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffff, x, 1);
    return x + __shfl_xor_sync(0xffffffff, x, 2);
  }

  // Folds a new block's row maxima into the running max; `correction` is what O and the sums
  // computed so far must be multiplied by (exp2(old max - new max)). Returns whether any row of
  // the warp needs that (warp-uniform, so the caller can skip rescaling O as a whole).
  // kCols < kBlockN: a block whose keys past kCols are invisible to all rows (only the first kCols/2
  // fragment elements are computed; MainloopMma's narrow first block), here and below.
  template <int kCols = kBlockN>
  __device__ __forceinline__ bool update_max(const float (&s)[kCols / 2], float (&correction)[2]) {
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int j = 0; j < kCols / 8; ++j) {
      mx[0] = fmaxf(mx[0], fmaxf(s[4 * j], s[4 * j + 1]));
      mx[1] = fmaxf(mx[1], fmaxf(s[4 * j + 2], s[4 * j + 3]));
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float block_max = shifted(quad_max(mx[h]) * scale(h));
      const bool grow = kLazy ? block_max > row_max[h] + kLazyThreshold : block_max > row_max[h];
      const float m_new = grow ? block_max : row_max[h];
      correction[h] = grow ? hopper::exp2_approx(row_max[h] - m_new) : 1.f;  // exp2(-inf) = 0 on the first block
      row_max[h] = m_new;
      row_sum[h] *= correction[h];
    }
    return __any_sync(0xffffffff, correction[0] != 1.f || correction[1] != 1.f);
  }

  // exp2(score * scale - max) for row h: the scale folded into one FFMA before the MUFU.
  __device__ __forceinline__ float exp_scaled(float score, int h, float max) const {
    return hopper::exp2_approx(fmaf(score, scale(h), -max));
  }

  // S := exp2(S * scale_log2 - row_max) in place (P in fp32), and adds the row sums.  P is packed into
  // the PV operand by pack() separately: the mainloop computes the exponentials while the previous PV
  // GEMM still reads the packed P registers.
  template <int kCols = kBlockN>
  __device__ __forceinline__ void exponentiate(float (&s)[kCols / 2]) {
    const float sub0 = row_max[0] == -INFINITY ? 0.f : subtrahend(row_max[0]);
    const float sub1 = row_max[1] == -INFINITY ? 0.f : subtrahend(row_max[1]);
    float block_sum[2] = {0.f, 0.f};
    float(&sum)[2] = kBlockScales ? block_sum : row_sum;  // kBlockScales: the block's sums, scaled once
#pragma unroll
    for (int j = 0; j < kCols / 8; ++j) {
      s[4 * j + 0] = exp_scaled(s[4 * j + 0], 0, sub0);
      s[4 * j + 1] = exp_scaled(s[4 * j + 1], 0, sub0);
      s[4 * j + 2] = exp_scaled(s[4 * j + 2], 1, sub1);
      s[4 * j + 3] = exp_scaled(s[4 * j + 3], 1, sub1);
      sum[0] += s[4 * j + 0] + s[4 * j + 1];
      sum[1] += s[4 * j + 2] + s[4 * j + 3];
    }
    if constexpr (kBlockScales) add_sums(block_sum[0], block_sum[1]);
  }
  // A middle block's softmax without its row max (kLazy only): the exponentials against the running
  // max go straight into P (the PV operand), S stays as it was. Valid when no exponential
  // exceeds 2^kLazyThreshold, as update_max() would have left the max then: this thread's sums of
  // the block's exponentials of each row bound every one of them (all >= 0), so when both are at
  // most 2^8 in every thread of the warp (warp-uniform answer), they join the row sums and the block
  // is done. Otherwise (a row max grew by more than 2^8, a NaN, or a row without any visible key so
  // far: rare once a tile's first block set the max) nothing changed: the caller runs the full step
  // on S. Saves the row max's FMNMX, one ALU instruction (two issue cycles per warp on sm_90) per
  // score, and its shuffles: d64/d96 +5-15%.
  template <class Mma>
  __device__ __forceinline__ bool exponentiate_stale(const float (&s)[kBlockN / 2],
                                                     uint32_t (&p)[kBlockN / Mma::kK][4]) {
    static_assert(kLazy, "a stale max is only right under the lazy rescale's bound");
    // -inf (no visible key yet): refused below
    const float sub0 = subtrahend(row_max[0]), sub1 = subtrahend(row_max[1]);
    float sum0 = 0.f, sum1 = 0.f;
    constexpr int kStep = Mma::kK / 2;  // accumulator elements per k-step of the PV
    if constexpr (Mma::kK == 16) {
      // 16-bit P: each pair packed as it comes (ptxas schedules the 16-bit stream tiles this way;
      // the k-step form below changed their SASS).
#pragma unroll
      for (int j = 0; j < kBlockN / 8; ++j) {
        const float e0 = exp_scaled(s[4 * j + 0], 0, sub0), e1 = exp_scaled(s[4 * j + 1], 0, sub0);
        const float e2 = exp_scaled(s[4 * j + 2], 1, sub1), e3 = exp_scaled(s[4 * j + 3], 1, sub1);
        sum0 += e0 + e1;
        sum1 += e2 + e3;
        p[j >> 1][2 * (j & 1) + 0] = Mma::pack(e0, e1);
        p[j >> 1][2 * (j & 1) + 1] = Mma::pack(e2, e3);
      }
    } else {
#pragma unroll
      for (int kb = 0; kb < kBlockN / Mma::kK; ++kb) {
        float e[kStep];
#pragma unroll
        for (int j = 0; j < kStep; j += 4) {
          e[j + 0] = exp_scaled(s[kb * kStep + j + 0], 0, sub0);
          e[j + 1] = exp_scaled(s[kb * kStep + j + 1], 0, sub0);
          e[j + 2] = exp_scaled(s[kb * kStep + j + 2], 1, sub1);
          e[j + 3] = exp_scaled(s[kb * kStep + j + 3], 1, sub1);
          sum0 += e[j + 0] + e[j + 1];
          sum1 += e[j + 2] + e[j + 3];
        }
        Mma::pack_step(e, p[kb]);
      }
    }
    const bool ok = sum0 <= kLazyBound && sum1 <= kLazyBound && sub0 != -INFINITY && sub1 != -INFINITY;
    if (!__all_sync(0xffffffff, ok)) return false;
    add_sums(sum0, sum1);
    return true;
  }

  // P as the A fragments of the PV wgmma, one k-step (Mma::kK keys, kK/2 accumulator elements) at
  // a time in the operand type's layout (hopper::Mma16::pack_step, MmaE4m3::pack_step).
  template <class Mma, int kCols = kBlockN>
  __device__ __forceinline__ static void pack(const float (&s)[kCols / 2], uint32_t (&p)[kBlockN / Mma::kK][4]) {
    static_assert(kCols % Mma::kK == 0, "whole k-steps");
#pragma unroll
    for (int kb = 0; kb < kCols / Mma::kK; ++kb) Mma::pack_step(&s[kb * (Mma::kK / 2)], p[kb]);
  }

  // After the last block: the factor that normalises each O row (0 for rows with no visible key)
  // and the row's log-sum-exp in natural log (-inf for rows with no visible key).
  __device__ __forceinline__ void finalize(float (&inv_sum)[2], float (&lse)[2]) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float sum = quad_sum(row_sum[h]);
      const bool empty = !(sum > 0.f);
      inv_sum[h] = empty ? 0.f : 1.f / sum;
      lse[h] = empty ? -INFINITY : (row_max[h] + __log2f(sum)) * 0.69314718055994531f;
    }
  }
};

}  // namespace fa3::attn
