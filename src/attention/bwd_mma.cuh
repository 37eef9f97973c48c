// A consumer warpgroup of the backward's keys-as-rows tile (d64, d128; bwd_config.h): 64 keys of
// the CTA's block, their dK and dV in registers across every query block the producer streams. One
// step per query block (FlashAttention-2's backward, with the transposes Hopper wants: rows are
// keys, so S^T and dP^T come straight out of wgmma with M = 64 keys, P^T and dS^T feed dV and dK
// from registers, and dS^T, stored once, dQ):
//   S^T  = K Q^T           (SS)       P^T  = exp2(S^T * scale_log2 - LSE2)   [softcap: tanh first]
//   dP^T = V dO^T          (SS)       dS^T = P^T * (dP^T - D) [* (1 - tanh^2)]
//   dV  += P^T dO          (RS)       dK  += dS^T Q   (RS)
//   dQ   = dS K            (SS: dS^T from shared memory as an M-major A, K as an N-major B), in
//                          64 x 64 parts (bwd_config.h), staged for the dQ writer warp, which
//                          reduce-adds each into the fp32 workspace by one bulk copy.
// The softmax scale multiplies dK at the end and dQ in the postprocess. Query rows past the
// sequence have LSE2 = +inf (the preprocess), so their P and dS are 0 whatever Q and dO hold there.
// Key rows past it: fixed lengths need no mask, TMA zero-fills them (K_j = V_j = 0, so the dQ they
// would add is 0 and their dK/dV rows are not stored); varlen reads real rows there (the next
// packed sequence, or past seqused_k), so the last key block masks them to P = 0.
#pragma once
#include "src/attention/block_info.cuh"
#include "src/attention/bwd_load.cuh"
#include "src/attention/bwd_params.h"
#include "src/attention/bwd_dkdv_store.cuh"
#include "src/attention/bwd_smem.cuh"
#include "src/attention/bwd_softmax.cuh"
#include "src/attention/fwd_features.h"
#include "src/hopper/arch.cuh"
#include "src/hopper/wgmma.cuh"

namespace fa3::attn {

template <class Elem, class Cfg, class Feat>
struct BwdConsumer {
  // Varlen kernels always take the masked path: their key tails need the mask anyway.
  static_assert(!Feat::kVarlen || Feat::kMasked, "varlen backward instantiations are masked ones");
  static_assert(!Cfg::kQueryRows, "the keys-as-rows consumer needs a keys-as-rows tile (bwd_config.h)");
  using Seq = SeqlenInfo<Feat::kVarlen>;
  using Mma = hopper::Mma16<Elem>;
  using Smem = BwdSmem<Cfg>;
  using KTile = typename Smem::KTile;
  using QTile = typename Smem::QTile;
  using DsTile = typename Smem::DsTile;
  static constexpr int kD = Cfg::kHeadDim, kM = Cfg::kBlockM, kN = Cfg::kBlockN, kK = Mma::kK;
  // This warpgroup's keys start at kWgKeys consumer; its S^T / dP^T columns are all kM queries, its
  // dK / dV rows all kD columns.
  static constexpr int kWgKeys = Cfg::kWgKeys;
  static_assert(Cfg::kDoStages == Cfg::kStages, "dO and D share the Q ring's stages");
  // The 128-query tile (d64) reads LSE2 and D where it uses them and packs P^T late (step).
  static constexpr bool kLean = kM > 64;

  const BwdKernelParams& p;
  Smem smem;
  int consumer, thread;  // warpgroup 0/1 of the consumers; 0..127
  float dk[kD / 2], dv[kD / 2];
  hopper::PipelineState<Cfg::kDqBuffers> dq_st;  // this warpgroup's dQ staging ring (bwd_dq_writer.cuh)

  __device__ __forceinline__ BwdConsumer(const BwdKernelParams& params, Smem s, int c, int t)
      : p(params), smem(s), consumer(c), thread(t) {}

  // This thread's first key row of the block (its second is 8 further), first query column of the
  // block (S^T, dP^T), and first column of its accumulator fragments.
  __device__ __forceinline__ int key_row0(int n_block) const {
    return n_block * kN + kWgKeys * consumer + 16 * (thread / 32) + (thread % 32) / 4;
  }
  __device__ __forceinline__ int acc_col0() const { return 2 * (thread % 4); }

  __device__ void run(int n_block, int kv_head, const Seq& seq) {
#pragma unroll
    for (int i = 0; i < kD / 2; ++i) dk[i] = dv[i] = 0.f;
    const BwdWalk<Cfg> walk(n_block, kv_head, seq, p);
    hopper::mbarrier_wait(&smem.bars().kv, 0);
    hopper::PipelineState<Cfg::kStages> st;
    // Steps in BwdWalk's order; the parity picks the dS^T buffer.
    auto cur = walk.begin();
    for (int it = 0; it < walk.steps; ++it) {
      step(n_block, walk.m_block(cur), seq, st, it);
      st.advance();
      walk.advance(cur);
    }
    store_dkdv(n_block, kv_head, seq);
  }

 private:
  // True when every (key, query) pair of this warpgroup's 64 keys and query block m is visible
  // (varlen: and every key is the sequence's).
  __device__ __forceinline__ bool fully_visible(int n_block, int m, const Seq& seq) const {
    const int j_lo = n_block * kN + kWgKeys * consumer, i_lo = m * kM;
    return bwd_fully_visible<Feat::kVarlen>(p.fwd, seq, j_lo, j_lo + kWgKeys - 1, i_lo, i_lo + kM - 1);
  }

  // acc = (this warpgroup's 64 rows of the key-block tile at `keys`) x (the query block at
  // `block`)^T over the head dim, both K-major: one committed group (S^T = K Q^T, dP^T = V dO^T).
  __device__ __forceinline__ void issue_rows_times_block(float (&acc)[kM / 2], const uint8_t* keys, uint32_t block) const {
    const uint64_t a = hopper::make_smem_desc(hopper::smem_u32(keys) + KTile::row_offset(kWgKeys * consumer),
                                              KTile::kKMajorLbo, KTile::kKMajorSbo);
    const uint64_t b = hopper::make_smem_desc(block, QTile::kKMajorLbo, QTile::kKMajorSbo);
#pragma unroll
    for (int kk = 0; kk < kD / kK; ++kk)
      Mma::template Op<kM>::template ss<0>(acc, hopper::desc_advance(a, KTile::template k_chunk_offset<kK>(kk)),
                                           hopper::desc_advance(b, QTile::template k_chunk_offset<kK>(kk)), kk > 0);
    hopper::wgmma_commit();
  }

  // Four 16-bit A-fragment registers (a 64 x 16 block: this warpgroup's keys x 16 queries) into
  // the keys x queries dS^T tile by one stmatrix: k-block kb of the columns.
  __device__ __forceinline__ void store_fragment(uint8_t* tile, int kb, const uint32_t (&r)[4]) const {
    const int lane = thread % 32, mi = lane / 8;
    const int row = kWgKeys * consumer + (thread / 32) * 16 + lane % 8 + 8 * (mi & 1);
    const int col = 16 * kb + 8 * (mi >> 1);
    hopper::stmatrix_x4(hopper::smem_u32(tile) + DsTile::offset(row, col), r[0], r[1], r[2], r[3]);
  }

  // The row values (LSE2 or D) of this thread's accumulator columns: pair j = columns 8j + acc_col0()
  // and + 1 of the block's queries (acc_col(i) = 8 (i / 4) + (i & 1)), by 64-bit shared loads.
  __device__ __forceinline__ void column_pairs(float2 (&v)[kM / 8], const float* rows) const {
    const uint32_t base = hopper::smem_u32(rows) + 4 * acc_col0();
#pragma unroll
    for (int j = 0; j < kM / 8; ++j) v[j] = hopper::ld_shared_f32x2(base + 32 * j);
  }

  __device__ void step(int n_block, int m, const Seq& seq, hopper::PipelineState<Cfg::kStages>& st, int it) {
    const int buf = it & 1;
    auto& ring = smem.bars().q;
    ring.consumer_wait(st);
    const uint32_t q_addr = hopper::smem_u32(smem.q(st.index)), do_addr = hopper::smem_u32(smem.dout(st.index));
    float s[kM / 2], dp[kM / 2];

    // S^T = K Q^T and dP^T = V dO^T: this warpgroup's 64 rows of K / V, K-major like Q / dO.
    hopper::wgmma_fence();
    issue_rows_times_block(s, smem.k(), q_addr);
    issue_rows_times_block(dp, smem.v(), do_addr);
    // This thread's LSE2 and D (its columns' rows of the stage), pair j = columns 8j + acc_col0()
    // and + 1. LSE2 is read while the GEMMs run (read after the wait, its latency stood between
    // S^T and the first exp2 of every step), D after dP^T's wait (read with LSE2 it spilled in the
    // masked d128 kernels). The 128-query tile reads each pair where it is used: its S^T and dP^T
    // take 128 registers.
    float2 lse[kLean ? 1 : kM / 8], delta[kLean ? 1 : kM / 8];
    if constexpr (!kLean) column_pairs(lse, smem.lse2(st.index));
    const uint32_t lse_at = hopper::smem_u32(smem.lse2(st.index)) + 4 * acc_col0();
    const uint32_t delta_at = hopper::smem_u32(smem.delta(st.index)) + 4 * acc_col0();
    auto lse_pair = [&](int j) {
      if constexpr (kLean) return hopper::ld_shared_f32x2(lse_at + 32 * j);
      else return lse[j];
    };
    auto delta_load = [&](int j) { return hopper::ld_shared_f32x2(delta_at + 32 * j); };
    // The 128-query tile with softcap waits for dP^T too and computes dS^T with P^T, element by
    // element (kFuseDs): P^T's fragments and P^T * dscore both beside S^T, dP^T, dK and dV spilled.
    constexpr bool kFuseDs = kLean && Feat::kSoftcap;
    if constexpr (kFuseDs) hopper::wgmma_wait<0>();
    else hopper::wgmma_wait<1>();
    hopper::fence_operand(s);
    if constexpr (kFuseDs) hopper::fence_operand(dp);

    // P^T (bf16 fragments for dV) and, kept in s, P^T * dscore for dS^T (kFuseDs: dS^T itself).
    // Only tiles that are not fully visible pay for the mask (a runtime test per element made d64
    // causal 1.75x slower). The 128-query tile without softcap packs P^T's fragments below, with
    // dS^T's (s is P^T then).
    constexpr bool kPackP = !kLean || Feat::kSoftcap;
    uint32_t pa[kM / kK][4];
    if (Feat::kMasked && !fully_visible(n_block, m, seq))
      probabilities<true, kPackP, kFuseDs>(s, pa, lse_pair, dp, delta_load, n_block, m, seq);
    else
      probabilities<false, kPackP, kFuseDs>(s, pa, lse_pair, dp, delta_load, n_block, m, seq);
    if constexpr (!kFuseDs) {
      hopper::wgmma_wait<0>();
      hopper::fence_operand(dp);
    }

    // dS^T = P^T (dP^T - D) into shared memory (this warpgroup's rows; the dQ GEMMs of both
    // warpgroups read all of it), one 16-column k-block (an A fragment's four registers, one
    // stmatrix) at a time; the fragments stay in registers too, as dK's A operand.
    if constexpr (!kLean) column_pairs(delta, smem.delta(st.index));
    auto delta_pair = [&](int j) {
      if constexpr (kLean) return delta_load(j);
      else return delta[j];
    };
    uint32_t da[kM / kK][4];
#pragma unroll
    for (int j = 0; j < kM / 8; ++j) {
      float2 d;
      if constexpr (!kFuseDs) d = delta_pair(j);
#pragma unroll
      for (int i = 4 * j; i < 4 * j + 4; i += 2) {  // register i: k-block i / 8, register (i / 2) % 4
        if constexpr (!kPackP) pa[i / 8][(i / 2) % 4] = Mma::pack(s[i], s[i + 1]);
        da[i / 8][(i / 2) % 4] = kFuseDs ? Mma::pack(s[i], s[i + 1]) : Mma::pack(s[i] * (dp[i] - d.x), s[i + 1] * (dp[i + 1] - d.y));
      }
      if (j % 2 == 1) store_fragment(smem.ds(buf), j / 2, da[j / 2]);
    }
    step_gradients(buf, q_addr, do_addr, pa, da, st);
  }

  // The step's gradient GEMMs: dV += P^T dO and dK += dS^T Q with A from
  // registers (P^T and dS^T are this warpgroup's own keys), B = the dO / Q rows as N-major
  // operands; dQ = dS K over both warpgroups' dS^T. Only dQ waits for the other warpgroup's half of
  // dS^T: dV runs under that barrier, and the dQ part is staged for the writer while dK runs, so
  // the tensor pipe has work across both waits (FlashAttention-3's order).
  __device__ __forceinline__ void step_gradients(int buf, uint32_t q_addr, uint32_t do_addr,
                                                 const uint32_t (&pa)[kM / kK][4], const uint32_t (&da)[kM / kK][4],
                                                 hopper::PipelineState<Cfg::kStages>& st) {
    const uint64_t bdo = hopper::make_smem_desc(do_addr, QTile::kNMajorLbo, QTile::kNMajorSbo);
    const uint64_t bq = hopper::make_smem_desc(q_addr, QTile::kNMajorLbo, QTile::kNMajorSbo);
    hopper::fence_operand(dv);
    hopper::fence_operand(dk);
    hopper::wgmma_fence();
#pragma unroll
    for (int kb = 0; kb < kM / kK; ++kb)
      Mma::template Op<kD>::template rs<1>(dv, pa[kb], hopper::desc_advance(bdo, QTile::template row_chunk_offset<kK>(kb)), 1);
    hopper::wgmma_commit();
    // A barrier per dS^T buffer: the buffer is written again two steps later, by a warpgroup
    // that passed the barrier of the step between, which the other reaches only after its dQ GEMM
    // of this step completed.
    hopper::fence_view_async_shared();
    bwd_barrier_sync(kBarDsReady + buf, 2 * hopper::kWarpgroupSize);
    float dq[32];
    issue_dq_part(dq, buf);
#pragma unroll
    for (int kb = 0; kb < kM / kK; ++kb)
      Mma::template Op<kD>::template rs<1>(dk, da[kb], hopper::desc_advance(bq, QTile::template row_chunk_offset<kK>(kb)), 1);
    hopper::wgmma_commit();
    // The dQ part is staged while dK runs, except with one staging buffer in deterministic mode
    // (d64): there the writer may hold the buffer while it waits for the query block's turn, and
    // the stage held meanwhile stalls the producer too (6-12% slower than staging after the
    // release when d64 staged alone: perf-log step 73).
    constexpr bool kLateWhenDeterministic = Cfg::kDqBuffers == 1;
    hopper::wgmma_wait<1>();  // dV and dQ done, dK still running
    hopper::fence_operand(dq);
    if (!kLateWhenDeterministic || !p.deterministic) stage_dq(dq);
    hopper::wgmma_wait<0>();
    hopper::fence_operand(dv);
    hopper::fence_operand(dk);
    // Every read of the stage is done. Every thread arrives: an arrive orders only the arriving
    // thread's own reads (LSE2 and D) before the producer's next bulk copy into the stage.
    smem.bars().q.consumer_release(st);
    if constexpr (kLateWhenDeterministic) {
      if (p.deterministic) stage_dq(dq);
    }
  }

  // This warpgroup's dQ part (64 x 64) = dS K: A = dS (queries x keys) read M-major from dS^T, B =
  // K (keys x d) N-major; d128: all of the queries and K's panel `consumer`; d64 (kDqRowParts):
  // queries 64 consumer.. (dS^T's panel `consumer`) and all of K. One committed group.
  __device__ __forceinline__ void issue_dq_part(float (&dq)[32], int buf) const {
    const int a_panel = Cfg::kDqRowParts ? consumer : 0, b_panel = Cfg::kDqRowParts ? 0 : consumer;
    const uint64_t ad = hopper::make_smem_desc(hopper::smem_u32(smem.ds(buf)) + DsTile::panel_offset(a_panel),
                                               DsTile::kNMajorLbo, DsTile::kNMajorSbo);
    const uint64_t bd = hopper::make_smem_desc(hopper::smem_u32(smem.k()) + KTile::panel_offset(b_panel),
                                               KTile::kNMajorLbo, KTile::kNMajorSbo);
#pragma unroll
    for (int kk = 0; kk < kN / kK; ++kk)
      Mma::template Op<64>::template ss<1, 1>(dq, hopper::desc_advance(ad, DsTile::template row_chunk_offset<kK>(kk)),
                                              hopper::desc_advance(bd, KTile::template row_chunk_offset<kK>(kk)), kk > 0);
    hopper::wgmma_commit();
  }

  // s (S^T) -> P^T: the bf16 fragments pa for dV (kPackP), and P^T * dscore back in s for dS^T
  // (kFuseDs: dS^T = P^T * dscore * (dP^T - D)); hidden pairs (kMask: BwdVisibility, register
  // rows are keys) get P = 0.
  template <bool kMask, bool kPackP, bool kFuseDs, class LsePair, class DeltaPair>
  __device__ __forceinline__ void probabilities(float (&s)[kM / 2], uint32_t (&pa)[kM / kK][4], LsePair lse_pair,
                                                const float (&dp)[kM / 2], DeltaPair delta_pair, int n_block, int m,
                                                const Seq& seq) const {
    BwdVisibility<Feat::kVarlen> vis;
    if constexpr (kMask) vis = BwdVisibility<Feat::kVarlen>(p.fwd, seq, key_row0(n_block), m * kM + acc_col0());
    // Column pair j (acc_col(i), + 1 for i = 4j .. 4j + 3) shares its LSE2 and D: one load each.
#pragma unroll
    for (int j = 0; j < kM / 8; ++j) {
      const float2 l = lse_pair(j);
      float2 d;
      if constexpr (kFuseDs) d = delta_pair(j);
#pragma unroll
      for (int i = 4 * j; i < 4 * j + 4; i += 2) {
        float pr[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float dscore;
          pr[e] = bwd_probability<Feat::kSoftcap>(s[i + e], e ? l.y : l.x, p.fwd, &dscore);
          if (kMask && vis.hidden(hopper::acc_row(i + e), hopper::acc_col(i + e))) pr[e] = 0.f;
          s[i + e] = pr[e] * dscore;
          if constexpr (kFuseDs) s[i + e] *= dp[i + e] - (e ? d.y : d.x);
        }
        if constexpr (kPackP) pa[i / 8][(i / 2) % 4] = Mma::pack(pr[0], pr[1]);
      }
    }
  }

  // A 64 x 64 dQ part into this warpgroup's next staging buffer, in register order (conflict-free),
  // for the dQ writer warp to reduce-add (bwd_dq_writer.cuh). Every thread arrives after its own
  // stores and proxy fence.
  __device__ __forceinline__ void stage_dq(const float (&dq)[32]) {
    auto& ring = smem.bars().dq[consumer];
    ring.producer_acquire(dq_st);  // the writer's bulk copy has read this buffer
    // st.shared by a 32-bit address: through the generic pointer, ptxas emitted generic stores
    // (ST.E) and a MEMBAR.ALL.CTA before the proxy fence.
    const uint32_t stage = hopper::smem_u32(smem.dq(consumer, dq_st.index)) + 4 * thread;
#pragma unroll
    for (int i = 0; i < 32; ++i) hopper::st_shared_u32(stage + 4 * i * hopper::kWarpgroupSize, __float_as_uint(dq[i]));
    hopper::fence_view_async_shared();
    hopper::mbarrier_arrive(&ring.full[dq_st.index]);
    dq_st.advance();
  }

  // dK = scale * dK and dV, converted, through this warpgroup's dQ staging buffers (free once the
  // writer's bulk copies have read them) as BwdStagedRows tiles: a warp's 4-byte fragment stores
  // hit 32 banks.
  __device__ void store_dkdv(int n_block, int kv_head, const Seq& seq) {
    using Rows = BwdStagedRows<kD * 2>;
    constexpr int kTileBytes = kWgKeys * kD * 2;
    static_assert(2 * kTileBytes <= Cfg::kDqBuffers * Smem::kDqPartFloats * 4, "dK and dV fit this warpgroup's dQ staging");
    auto& ring = smem.bars().dq[consumer];
    for (int b = 0; b < Cfg::kDqBuffers; ++b) {
      ring.producer_acquire(dq_st);
      dq_st.advance();
    }
    const uint32_t stage = hopper::smem_u32(smem.dq(consumer, 0));  // a warpgroup's buffers are adjacent
    const FwdKernelParams& f = p.fwd;
    const int key0 = n_block * kN + kWgKeys * consumer;
    auto stage_tile = [&](uint32_t tile, const float (&acc)[kD / 2], float scale) {
      const int row0 = key_row0(n_block) - key0;
#pragma unroll
      for (int i = 0; i < kD / 2; i += 2) {
        const int row = row0 + hopper::acc_row(i), col = hopper::acc_col(i) + acc_col0();
        hopper::st_shared_u32(tile + Rows::offset(row, col / 8) + 2 * (col % 8), Mma::pack(acc[i] * scale, acc[i + 1] * scale));
      }
    };
    auto copy_out = [&](uint32_t tile, const fa3_tensor& t, int cols) {
      Rows::template copy_out<kWgKeys, Elem>(tile, t, f, seq, kv_head, key0, 0, cols, thread);
    };
    stage_tile(stage, dk, p.scale);
    stage_tile(stage + kTileBytes, dv, 1.f);
    bwd_barrier_sync(kBarDkvStaged + consumer, hopper::kWarpgroupSize);
    copy_out(stage, p.dk, f.head_dim_qk);
    copy_out(stage + kTileBytes, p.dv, f.head_dim_v);
  }
};

}  // namespace fa3::attn
