// FP8 descales (FlashAttention-3's per-(batch, kv head) factors): Q and K are stored as q / dq and
// k / dk, so S = dq dk (Q_8 K_8^T): dq dk joins the exp2 scale of the tile's softmax (one factor
// per tile, free in the loop); V as v / dv, so O = dv (P V_8) / sum: dv joins the final 1/sum.
// Block descales (a factor per block of positions: fa3_block_scales) go to the same places, per
// row and per key block: Fp8Softmax below.
#pragma once
#include "src/attention/fwd_params.h"
#include "src/attention/softmax.cuh"

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

// The FP8 kernel's softmax with block descales (tiles WithBlockDescales; without them the kernel
// keeps the plain OnlineSoftmax, whose per-block cost this would add: 3-9% measured):
//  - Q's factor of each of the thread's two rows and the head's dq dk join that row's exp2 scale
//    (once per tile);
//  - K's factor of key block n multiplies those for block n's scores (two FMULs per block: the
//    running max lives in the log2 domain, so each block may have its own scale);
//  - V's factor v(n) shifts block n's logits by log2 v(n) (OnlineSoftmax's kBlockScales): P comes
//    out as P v(n), so the PV accumulates sum P v(n) V_8 = sum P V, and the row sums take the block's
//    sums / v(n). The running max runs over the shifted logits, so it absorbs the factors' range
//    (P v(n) stays <= 2^8, inside e4m3's range, whatever the factors), and O needs no rescale when
//    V's factor changes: the stale max (kLazyRescale) keeps skipping it. Cost: a MUFU.LG2 and a
//    MUFU.RCP per block where the factor changes. (The earlier form, O kept in units of the current
//    V factor and rescaled by v(n+1) / v(n) before each PV, rescaled O at every block: block
//    descales 2-5% slower; perf-log step 99.) Accuracy: P is rounded to e4m3 relative to the
//    largest P v(n) of its row instead of the largest P, so a row's probabilities in blocks of
//    smaller V factors sit lower in e4m3's range: a float64 model of the roundings put it at +0.5%
//    of RMSE, FlashAttention-3's error test measured 8.71e-3 -> 8.68e-3 (blocks of 128 + rotation).
// Each operand's factors are walked one key block at a time downwards (no division per block), the
// next block's loaded at the end of begin_block. ptxas keeps the factors in uniform registers, so
// each load is waited for at once (an R2UR after it): with every factor equal the block-descale
// kernels still read 6-11% below the per-head ones (perf-log step 99; calling begin_block before
// S's wait lost 3-4%, step 100).
template <int kBlockN, bool kLazy>
struct Fp8Softmax : OnlineSoftmax<kBlockN, kLazy, /*kBlockScales=*/true> {
  using Base = OnlineSoftmax<kBlockN, kLazy, true>;

  // One operand's factors (K's or V's) from block `at` downwards.
  struct Factors {
    const float* data;  // this (sequence, kv head)'s, or null (every factor 1)
    int per;            // key blocks per factor (block_size / kBlockN)
    int index = 0, rest = 0;  // block at's factor, and how many blocks below `at` share it
    float next = 1.f;         // block at's factor
    __device__ __forceinline__ void seek(int at) {
      if (data == nullptr) return;
      index = at / per;
      rest = at - index * per;
      next = data[index];
    }
    __device__ __forceinline__ void step() {  // at -> at - 1
      if (data == nullptr) return;
      if (rest > 0) {
        --rest;
      } else {
        rest = per - 1;
        if (--index >= 0) next = data[index];
      }
    }
  };
  float row_base[2];  // the rows' scales before K's factor
  Factors k, v;
  int at;               // the block whose factors k.next, v.next are
  float v_shifted = 1.f;  // the V factor the shift holds now (Base::shift: log2 of it, and 1 / it)
  float dv;

  // rows: the positions of the thread's two rows in the sequence; first_block: the tile's first key
  // block (its factors are loaded now).
  __device__ __forceinline__ Fp8Softmax(const FwdKernelParams& p, int batch, int head_q, const int (&rows)[2],
                                        int seqlen_q, int first_block)
      : Base(softmax_scale_log2<true>(p, batch, head_q)) {
    const int kv_head = head_q / p.head_ratio;
    const fa3_block_scales& q = p.q_block;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const bool in = q.data != nullptr && rows[h] < seqlen_q;
      row_base[h] = this->scale_log2[h] *
                    (in ? q.data[batch * q.batch_stride + head_q * q.head_stride + rows[h] / q.block_size] : 1.f);
    }
    auto factors = [&](const fa3_block_scales& b) {
      return Factors{b.data ? b.data + batch * b.batch_stride + kv_head * b.head_stride : nullptr,
                     b.block_size / kBlockN};
    };
    k = factors(p.k_block);
    v = factors(p.v_block);
    at = first_block;
    k.seek(at);
    v.seek(at);
    dv = output_descale<true>(p, batch, head_q);
  }

  // Key block n's softmax starts: its scales and V's shift.
  __device__ __forceinline__ void begin_block(int n) {
    if (n != at) {  // blocks walked past before the tile's first (MainloopMma::kSkipHidden)
      at = n;
      k.seek(n);
      v.seek(n);
    }
    const float kf = k.next, vf = v.next;
    k.step();
    v.step();
    --at;
    this->scale_log2[0] = row_base[0] * kf;
    this->scale_log2[1] = row_base[1] * kf;
    if (vf != v_shifted) {  // the same for the whole warp
      v_shifted = vf;
      // A zero factor (a block of V that is all zeros) as 1e-30: its P v(n) underflows to 0 in
      // e4m3, its sums still count (fp32 holds P v(n) / v(n) exactly enough).
      const float r = vf == 0.f ? 1e-30f : vf;
      this->shift.log2_r = __log2f(r);
      this->shift.inv_r = __fdividef(1.f, r);
    }
  }
  // What O's final 1/sum is multiplied by (V's factors are in P already).
  __device__ __forceinline__ float o_factor() const { return dv; }
};

}  // namespace fa3::attn
