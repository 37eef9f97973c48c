// FP8 descales (FlashAttention-3's per-(batch, kv head) factors): Q and K are stored as q / dq and
// k / dk, so S = dq dk (Q_8 K_8^T): dq dk joins the exp2 scale of the tile's softmax (one factor
// per tile, free in the loop), or with softcap the tanh's factor (score_mod.cuh); V as v / dv, so
// O = dv (P V_8) / sum: dv joins the final 1/sum.
// Block descales (a factor per block of positions: fa3_block_scales) go to the same places, per
// row and per key block: Fp8Softmax below, and with softcap the tanh's factors of
// ScoreMod<true, true, true>.
#pragma once
#include "src/attention/fwd_params.h"
#include "src/attention/softmax.cuh"

namespace fa3::attn {

__device__ __forceinline__ float descale_of(const float* d, const FwdKernelParams& p, int batch, int head_q) {
  if (d == nullptr) return 1.f;
  return d[batch * p.descale_batch_stride + (head_q / p.head_ratio) * p.descale_head_stride];
}

// dq dk of a tile's head: 1 for 16-bit operands.
template <bool kFp8>
__device__ __forceinline__ float qk_descale(const FwdKernelParams& p, int batch, int head_q) {
  if constexpr (kFp8) return descale_of(p.q_descale, p, batch, head_q) * descale_of(p.k_descale, p, batch, head_q);
  else return 1.f;
}

// The exp2 scale of a tile's softmax: the problem's, times dq dk for e4m3 operands. (With softcap,
// dq dk goes inside the tanh instead and the exp2 scale is the problem's: score_mod.cuh.)
template <bool kFp8>
__device__ __forceinline__ float softmax_scale_log2(const FwdKernelParams& p, int batch, int head_q) {
  if constexpr (kFp8)
    return p.scale_log2 * descale_of(p.q_descale, p, batch, head_q) * descale_of(p.k_descale, p, batch, head_q);
  else return p.scale_log2;
}

// Q's block factor of a query row at position `row` of its sequence: 1 without Q block descales
// and for rows past the sequence (whose factors would lie past the array).
__device__ __forceinline__ float q_block_factor(const FwdKernelParams& p, int batch, int head_q, int row, int seqlen_q) {
  const fa3_block_scales& q = p.q_block;
  const bool in = q.data != nullptr && row < seqlen_q;
  return in ? q.data[batch * q.batch_stride + head_q * q.head_stride + row / q.block_size] : 1.f;
}

// What O's final 1/sum is multiplied by: dv for e4m3 operands.
template <bool kFp8>
__device__ __forceinline__ float output_descale(const FwdKernelParams& p, int batch, int head_q) {
  if constexpr (kFp8) return descale_of(p.v_descale, p, batch, head_q);
  else return 1.f;
}

// The FP8 kernel's softmax with block descales (tiles WithBlockDescales; without them the kernel
// keeps the plain OnlineSoftmax, whose per-block cost this would add):
//  - Q's factor of each of the thread's two rows and the head's dq dk join that row's exp2 scale
//    (once per tile);
//  - K's factor of key block n multiplies those for block n's scores (two FMULs per block: the
//    running max lives in the log2 domain, so each block may have its own scale);
//  - V's factor v(n) shifts block n's logits by log2 v(n) (OnlineSoftmax's kBlockScales): P comes
//    out as P v(n), so the PV accumulates sum P v(n) V_8 = sum P V, and the row sums take the block's
//    sums / v(n). The running max runs over the shifted logits, so it absorbs the factors' range
//    (P v(n) stays <= 2^8, inside e4m3's range, whatever the factors), and O needs no rescale when
//    V's factor changes: the stale max (kLazyRescale) keeps skipping it. (The earlier form, O kept
//    in units of the current V factor and rescaled by v(n+1) / v(n) before each PV, rescaled O at
//    every block: block descales 2-5% slower; perf-log step 99.) Accuracy: P is rounded to e4m3
//    relative to the largest P v(n) of its row instead of the largest P, so a row's probabilities
//    in blocks of smaller V factors sit lower in e4m3's range: a float64 model of the roundings put
//    it at +0.5% of RMSE, FlashAttention-3's error test measured 8.71e-3 -> 8.68e-3 (blocks of 128
//    + rotation).
// Block n's K factor, log2 v(n) and 1 / v(n) come with its K stage (the producer writes them
// beside it: fwd_smem.cuh's KeyBlockFactorSlots), one LDS.128 after S's wait. (The consumers
// walked the factor arrays themselves before: ptxas kept the factors in uniform registers, so each
// global load was waited for at once; block descales read 0.84-0.95 of per head then, perf-log
// steps 99, 100 and 102.)
// kSoftcap: Q's and K's factors (and dq dk) go inside the tanh (ScoreMod<true, true, true>, which
// takes K's factor from the same slot), so the exp2 scale stays the problem's; V's shift as above.
template <int kBlockN, bool kLazy, bool kSoftcap = false>
struct Fp8Softmax : OnlineSoftmax<kBlockN, kLazy, /*kBlockScales=*/true> {
  using Base = OnlineSoftmax<kBlockN, kLazy, true>;

  float row_base[2];  // the rows' scales before K's factor

  // rows: the positions of the thread's two rows in the sequence.
  __device__ __forceinline__ Fp8Softmax(const FwdKernelParams& p, int batch, int head_q, const int (&rows)[2],
                                        int seqlen_q)
      : Base(kSoftcap ? p.scale_log2 : softmax_scale_log2<true>(p, batch, head_q)) {
    if constexpr (!kSoftcap) {
#pragma unroll
      for (int h = 0; h < 2; ++h) row_base[h] = this->scale_log2[h] * q_block_factor(p, batch, head_q, rows[h], seqlen_q);
    }
  }

  // Key block n's softmax starts: its scales and V's shift, from its K stage's slot (K's factor,
  // log2 of V's, 1 / V's: fwd_smem.cuh).
  __device__ __forceinline__ void begin_block(float4 f) {
    if constexpr (!kSoftcap) {
      this->scale_log2[0] = row_base[0] * f.x;
      this->scale_log2[1] = row_base[1] * f.x;
    }
    this->shift.log2_r = f.y;
    this->shift.inv_r = f.z;
  }
};

}  // namespace fa3::attn
