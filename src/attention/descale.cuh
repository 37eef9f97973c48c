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
//  - V's factor v(n) is O's unit: O accumulates O / v(current), so before block n's PV O is
//    multiplied by v(n+1) / v(n), inside the max correction (fold_o_ratio; a block whose factor is
//    its predecessor's costs nothing), and the final 1/sum takes dv v(last). (Folding v(n) / v(first)
//    into P's exponent instead saves that rescale but pushes small probabilities into e4m3's
//    subnormals: FlashAttention-3's error test 8.7e-3 -> 9.6e-3, and no faster.)
// Each operand's factors are walked one key block at a time downwards (no division per block), the
// next block's loaded while a block's softmax runs: the softmax cannot wait for an L2 hit.
template <int kBlockN, bool kLazy>
struct Fp8Softmax : OnlineSoftmax<kBlockN, kLazy, /*kRowScales=*/true> {
  using Base = OnlineSoftmax<kBlockN, kLazy, true>;
  static constexpr bool kScalesO = true;

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
  float o_unit;         // O's accumulator holds O / o_unit
  float o_ratio = 1.f;  // what O is multiplied by before the current block's PV
  float dv;

  // rows: the positions of the thread's two rows in the sequence; first_block: the tile's first key
  // block (its factors are loaded now; V's becomes O's unit).
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
    o_unit = v.next;
    dv = output_descale<true>(p, batch, head_q);
  }

  // Key block n's softmax starts: its scales, and O's change of unit.
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
    o_ratio = vf == o_unit ? 1.f : __fdividef(o_unit, vf);
    o_unit = vf;
  }
  // Joins O's change of unit into update_max's correction; whether O must be rescaled (warp-uniform).
  __device__ __forceinline__ bool fold_o_ratio(float (&corr)[2], bool any_rescale) const {
    if (o_ratio == 1.f) return any_rescale;
    corr[0] *= o_ratio;
    corr[1] *= o_ratio;
    return true;
  }
  // What O's final 1/sum is multiplied by.
  __device__ __forceinline__ float o_factor() const { return dv * o_unit; }
};

}  // namespace fa3::attn
