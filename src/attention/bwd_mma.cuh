// A consumer warpgroup of the backward: 64 keys of the CTA's block, their dK and dV in registers
// across every query block the producer streams. One step per query block (FlashAttention-2's
// backward, with the transposes Hopper wants: rows are keys, so S^T and dP^T come straight out of
// wgmma with M = 64 keys, P^T feeds dV from registers and dS^T, stored once, both dK and dQ):
//   S^T  = K Q^T           (SS)       P^T  = exp2(S^T * scale_log2 - LSE2)   [softcap: tanh first]
//   dP^T = V dO^T          (SS)       dS^T = P^T * (dP^T - D) [* (1 - tanh^2)]
//   dV  += P^T dO          (RS)       dK  += dS^T Q   (SS: dS^T from shared memory, K-major)
//   dQ   = dS K            (SS: dS^T from shared memory as an M-major A, K as an N-major B), in
//                          64 x 64 parts (bwd_config.h), staged for the dQ writer warp, which
//                          reduce-adds each into the fp32 workspace by one bulk copy.
// The softmax scale multiplies dK at the end and dQ in the postprocess. Tails need no mask: rows
// past a length are zero-filled by TMA (K_j = V_j = 0, Q_i = dO_i = 0) and have LSE2 = +inf, so
// whatever they add lands in rows nobody stores or is multiplied by zero.
#pragma once
#include <climits>
#include <cmath>
#include <type_traits>


#include "src/attention/block_info.cuh"
#include "src/attention/bwd_load.cuh"
#include "src/attention/bwd_params.h"
#include "src/attention/bwd_smem.cuh"
#include "src/attention/fwd_features.h"
#include "src/hopper/arch.cuh"
#include "src/hopper/wgmma.cuh"

namespace fa3::attn {

template <class Elem, class Cfg, class Feat>
struct BwdConsumer {
  static_assert(!Feat::kVarlen, "the Hopper backward runs fixed-length batches (varlen: the reference kernel)");
  using Mma = hopper::Mma16<Elem>;
  using Smem = BwdSmem<Cfg>;
  using KTile = typename Smem::KTile;
  using QTile = typename Smem::QTile;
  using DsTile = typename Smem::DsTile;
  static constexpr int kD = Cfg::kHeadDim, kM = Cfg::kBlockM, kN = Cfg::kBlockN, kK = Mma::kK;

  const BwdKernelParams& p;
  Smem smem;
  int consumer, thread;  // warpgroup 0/1 of the consumers (keys 64c .. 64c+63 of the block); 0..127
  float dk[kD / 2], dv[kD / 2];
  hopper::PipelineState<2> dq_st;  // this warpgroup's dQ staging ring (bwd_dq_writer.cuh)

  __device__ __forceinline__ BwdConsumer(const BwdKernelParams& params, Smem s, int c, int t)
      : p(params), smem(s), consumer(c), thread(t) {}

  // The consumers' barrier: d64's two warpgroups reach it from different instantiations of step
  // (unaligned form), each warp converged after its mbarrier waits' per-thread spin loops.
  __device__ __forceinline__ static void consumers_sync(int id, int threads) {
    __syncwarp();
    hopper::named_barrier_sync_unaligned(id, threads);
  }

  // This thread's first key row of the block (its second is 8 further) and first query column.
  __device__ __forceinline__ int key_row0(int n_block) const {
    return n_block * kN + 64 * consumer + 16 * (thread / 32) + (thread % 32) / 4;
  }
  __device__ __forceinline__ int col0() const { return 2 * (thread % 4); }

  __device__ void run(int n_block, int kv_head, int batch) {
    const FwdKernelParams& f = p.fwd;
#pragma unroll
    for (int i = 0; i < kD / 2; ++i) dk[i] = dv[i] = 0.f;
    const SeqlenInfo<false> seq(f, batch);
    const BwdWalk<Cfg> walk(n_block, kv_head, seq, p);
    hopper::mbarrier_wait(&smem.bars().kv, 0);
    hopper::PipelineState<Cfg::kStages> st;
    // Steps in BwdWalk's order; the parity picks the dS^T buffer and, for d64, the warpgroup that
    // computes the step's dQ. That choice is compile-time (two code paths, one per warpgroup,
    // taking turns): a wgmma under a runtime condition makes ptxas serialise every wgmma of the
    // kernel (C7520).
    const int steps = walk.steps;
    auto cur = walk.begin();
    auto at = [&](int it, auto dq_here) {
      step<decltype(dq_here)::value>(n_block, walk.m_block(cur), cur.head, batch, seq, st, it);
      st.advance();
      walk.advance(cur);
    };
    using Yes = std::true_type;
    using No = std::false_type;
    if constexpr (Cfg::kDqParts == 2) {
      for (int it = 0; it < steps; ++it) at(it, Yes{});
    } else if (consumer == 0) {
      for (int it = 0; it < steps; it += 2) {
        at(it, Yes{});
        if (it + 1 < steps) at(it + 1, No{});
      }
    } else {
      for (int it = 0; it < steps; it += 2) {
        at(it, No{});
        if (it + 1 < steps) at(it + 1, Yes{});
      }
    }
    store_dkdv(n_block, kv_head, batch, seq);
  }

 private:
  // True when every (key, query) pair of this warpgroup's 64 keys and query block m is visible.
  __device__ __forceinline__ bool fully_visible(int n_block, int m, const SeqlenInfo<false>& seq) const {
    const FwdKernelParams& f = p.fwd;
    const int off = seq.seqlen_k(f) - seq.seqlen_q(f);
    const int j_lo = n_block * kN + 64 * consumer, j_hi = j_lo + 63, i_lo = m * kM, i_hi = i_lo + kM - 1;
    return (f.window_right < 0 || j_hi <= i_lo + off + f.window_right) &&
           (f.window_left < 0 || j_lo >= i_hi + off - f.window_left);
  }

  // acc = (this warpgroup's 64 rows of the key-block tile at `keys`) x (the query block at
  // `block`)^T over the head dim, both K-major: one committed group (S^T = K Q^T, dP^T = V dO^T).
  __device__ __forceinline__ void issue_rows_times_block(float (&acc)[kM / 2], const uint8_t* keys, uint32_t block) const {
    const uint64_t a = hopper::make_smem_desc(hopper::smem_u32(keys) + KTile::row_offset(64 * consumer), KTile::kKMajorLbo,
                                              KTile::kKMajorSbo);
    const uint64_t b = hopper::make_smem_desc(block, QTile::kKMajorLbo, QTile::kKMajorSbo);
#pragma unroll
    for (int kk = 0; kk < kD / kK; ++kk)
      Mma::template Op<kM>::template ss<0>(acc, hopper::desc_advance(a, KTile::template k_chunk_offset<kK>(kk)),
                                           hopper::desc_advance(b, QTile::template k_chunk_offset<kK>(kk)), kk > 0);
    hopper::wgmma_commit();
  }

  // kDqHere: this warpgroup computes (and adds) a dQ part of this step.
  template <bool kDqHere>
  __device__ void step(int n_block, int m, int h, int batch, const SeqlenInfo<false>& seq,
                       hopper::PipelineState<Cfg::kStages>& st, int it) {
    const int buf = it & 1;
    auto& ring = smem.bars().q;
    ring.consumer_wait(st);
    const uint32_t q_addr = hopper::smem_u32(smem.q(st.index)), do_addr = hopper::smem_u32(smem.dout(st.index));
    float s[kM / 2], dp[kM / 2];

    // S^T = K Q^T and dP^T = V dO^T: this warpgroup's 64 rows of K / V, K-major like Q / dO.
    hopper::wgmma_fence();
    issue_rows_times_block(s, smem.k(), q_addr);
    issue_rows_times_block(dp, smem.v(), do_addr);
    hopper::wgmma_wait<1>();
    hopper::fence_operand(s);

    // P^T (bf16 fragments for dV) and, kept in s, P^T * dscore for dS^T. Only tiles that are not
    // fully visible pay for the mask (a runtime test per element made d64 causal 1.75x slower).
    uint32_t pa[kM / kK][4];
    if (Feat::kMasked && !fully_visible(n_block, m, seq)) probabilities<true>(s, pa, st.index, n_block, m, seq);
    else probabilities<false>(s, pa, st.index, n_block, m, seq);
    hopper::wgmma_wait<0>();
    hopper::fence_operand(dp);

    // dS^T = P^T (dP^T - D), straight into shared memory (this warpgroup's 64 rows), one 16-column
    // k-block (an A fragment's four registers, one stmatrix) at a time: dK and dQ both read it from
    // there, so it never occupies registers whole (d64's 128-query blocks spilled with it).
    {
      const int lane = thread % 32, mi = lane / 8;
      const int row = 64 * consumer + (thread / 32) * 16 + lane % 8 + 8 * (mi & 1);
      const uint32_t base = hopper::smem_u32(smem.ds(buf));
      const uint32_t delta = hopper::smem_u32(smem.delta(st.index));
#pragma unroll
      for (int kb = 0; kb < kM / kK; ++kb) {
        uint32_t da[4];
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int i = 8 * kb + 2 * r;
          const float2 d = hopper::ld_shared_f32x2(delta + 4 * (hopper::acc_col(i) + col0()));  // columns c, c + 1
          da[r] = Mma::pack(s[i] * (dp[i] - d.x), s[i + 1] * (dp[i + 1] - d.y));
        }
        hopper::stmatrix_x4(base + DsTile::offset(row, 16 * kb + 8 * (mi >> 1)), da[0], da[1], da[2], da[3]);
      }
    }
    hopper::fence_view_async_shared();
    consumers_sync(kBarDsReady, 2 * hopper::kWarpgroupSize);

    // dV += P^T dO (A from registers), dK += dS^T Q (A = this warpgroup's rows of dS^T, K-major);
    // B = dO / Q rows as N-major operands.
    hopper::fence_operand(dv);
    hopper::fence_operand(dk);
    hopper::wgmma_fence();
    {
      const uint64_t bdo = hopper::make_smem_desc(do_addr, QTile::kNMajorLbo, QTile::kNMajorSbo);
      const uint64_t bq = hopper::make_smem_desc(q_addr, QTile::kNMajorLbo, QTile::kNMajorSbo);
      const uint64_t ads = hopper::make_smem_desc(hopper::smem_u32(smem.ds(buf)) + DsTile::row_offset(64 * consumer),
                                                  DsTile::kKMajorLbo, DsTile::kKMajorSbo);
#pragma unroll
      for (int kb = 0; kb < kM / kK; ++kb)
        Mma::template Op<kD>::template rs<1>(dv, pa[kb], hopper::desc_advance(bdo, QTile::template row_chunk_offset<kK>(kb)), 1);
      hopper::wgmma_commit();
#pragma unroll
      for (int kb = 0; kb < kM / kK; ++kb)
        Mma::template Op<kD>::template ss<1>(dk, hopper::desc_advance(ads, DsTile::template k_chunk_offset<kK>(kb)),
                                             hopper::desc_advance(bq, QTile::template row_chunk_offset<kK>(kb)), 1);
      hopper::wgmma_commit();
    }

    // dQ part `part` (columns 64 part ..): d128 each warpgroup its own, d64 the step's warpgroup.
    const int part = Cfg::kDqParts == 2 ? consumer : 0;
    float dq[32];
    if constexpr (kDqHere) {
      // A = dS (queries x keys) read M-major from dS^T; B = K (keys x d) N-major, from its panel.
      const uint64_t ad = hopper::make_smem_desc(hopper::smem_u32(smem.ds(buf)), DsTile::kNMajorLbo, DsTile::kNMajorSbo);
      const uint64_t bd = hopper::make_smem_desc(hopper::smem_u32(smem.k()) + KTile::panel_offset(part),
                                                 KTile::kNMajorLbo, KTile::kNMajorSbo);
#pragma unroll
      for (int kk = 0; kk < kN / kK; ++kk)
        Mma::template Op<64>::template ss<1, 1>(dq, hopper::desc_advance(ad, DsTile::template row_chunk_offset<kK>(kk)),
                                                hopper::desc_advance(bd, KTile::template row_chunk_offset<kK>(kk)), kk > 0);
      hopper::wgmma_commit();
    }
    hopper::wgmma_wait<0>();
    if constexpr (kDqHere) hopper::fence_operand(dq);
    hopper::fence_operand(dv);
    hopper::fence_operand(dk);
    // Every read of the stage is done. Every thread arrives: an arrive orders only the arriving
    // thread's own reads (LSE2 and D) before the producer's next bulk copy into the stage.
    ring.consumer_release(st);
    if constexpr (kDqHere) stage_dq(dq);
  }

  // s (S^T) -> P^T: the bf16 fragments pa for dV, and P^T * dscore back in s for dS^T. Hidden
  // pairs (kMask) get P = 0: key j of query q is visible iff off - left <= j - q <= off + right,
  // and j - q is this thread's (j0 - q0) plus a per-register constant.
  template <bool kMask>
  __device__ __forceinline__ void probabilities(float (&s)[kM / 2], uint32_t (&pa)[kM / kK][4], int stage, int n_block,
                                                int m, const SeqlenInfo<false>& seq) const {
    const FwdKernelParams& f = p.fwd;
    const uint32_t lse2 = hopper::smem_u32(smem.lse2(stage));
    int lo = 0, hi = 0;
    if constexpr (kMask) {
      const int off = seq.seqlen_k(f) - seq.seqlen_q(f), base = key_row0(n_block) - (m * kM + col0());
      lo = f.window_left >= 0 ? off - f.window_left - base : INT_MIN / 2;
      hi = f.window_right >= 0 ? off + f.window_right - base : INT_MAX / 2;
    }
#pragma unroll
    for (int i = 0; i < kM / 2; i += 2) {
      const float2 l = hopper::ld_shared_f32x2(lse2 + 4 * (hopper::acc_col(i) + col0()));  // columns c, c + 1
      float pr[2];
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float x = s[i + e], dscore = 1.f;
        if constexpr (Feat::kSoftcap) {
          x = hopper::tanh_approx(x * f.softcap_scale);
          dscore = 1.f - x * x;  // d(c tanh(u / c)) / du
        }
        pr[e] = hopper::exp2_approx(fmaf(x, f.scale_log2, -(e ? l.y : l.x)));
        if constexpr (kMask) {
          const int rel = hopper::acc_row(i + e) - hopper::acc_col(i + e);
          if (rel < lo || rel > hi) pr[e] = 0.f;
        }
        s[i + e] = pr[e] * dscore;
      }
      pa[i / 8][(i / 2) % 4] = Mma::pack(pr[0], pr[1]);
    }
  }

  // A 64 x 64 dQ part into this warpgroup's next staging buffer, in register order (conflict-free),
  // for the dQ writer warp to reduce-add (bwd_dq_writer.cuh). Every thread arrives after its own
  // stores and proxy fence.
  __device__ __forceinline__ void stage_dq(const float (&dq)[32]) {
    auto& ring = smem.bars().dq[consumer];
    ring.producer_acquire(dq_st);  // the writer's bulk copy has read this buffer
    float* stage = smem.dq(consumer, dq_st.index);
#pragma unroll
    for (int i = 0; i < 32; ++i) stage[i * hopper::kWarpgroupSize + thread] = dq[i];
    hopper::fence_view_async_shared();
    hopper::mbarrier_arrive(&ring.full[dq_st.index]);
    dq_st.advance();
  }

  // dK = scale * dK, dV: converted, 4-byte stores of column pairs; rows past seqlen_k and columns
  // past the head dims are not written.
  __device__ void store_dkdv(int n_block, int kv_head, int batch, const SeqlenInfo<false>& seq) const {
    const FwdKernelParams& f = p.fwd;
    const int j0 = key_row0(n_block);
    auto base = [&](const fa3_tensor& t) {
      return static_cast<Elem*>(t.data) + int64_t(batch) * t.batch_stride + int64_t(kv_head) * t.head_stride;
    };
    Elem *dk_base = base(p.dk), *dv_base = base(p.dv);
#pragma unroll
    for (int i = 0; i < kD / 2; i += 2) {
      const int j = j0 + hopper::acc_row(i), c = hopper::acc_col(i) + col0();
      if (j >= seq.seqlen_k(f)) continue;
      if (c < f.head_dim_qk)
        *reinterpret_cast<uint32_t*>(dk_base + int64_t(j) * p.dk.row_stride + c) =
            Mma::pack(dk[i] * p.scale, dk[i + 1] * p.scale);
      if (c < f.head_dim_v)
        *reinterpret_cast<uint32_t*>(dv_base + int64_t(j) * p.dv.row_stride + c) = Mma::pack(dv[i], dv[i + 1]);
    }
  }
};

}  // namespace fa3::attn
