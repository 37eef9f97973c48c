// A consumer warpgroup of the backward's query-rows tile (bwd_config.h, BwdQueryRowsConfig: d256 in
// the default mode, FlashAttention-3's d256 decomposition). Warpgroup c, per query block (one step;
// the CTA's 80 keys stay in shared memory, like K and V):
//   S  = Q K^T   (SS; all 64 queries x keys 40c..40c+39)   P  = exp2(S scale_log2 - LSE2)  [softcap: tanh first]
//   dP = dO V^T  (SS)                                       dS = P (dP - D)  [x (1 - tanh^2)]
// P and dS go to shared memory transposed (stmatrix .trans: rows keys, columns queries); after the
// barrier that both warpgroups' halves are there, for this warpgroup's 128 head dims:
//   dV^T += dO^T P    (SS: dO as an M-major A, P^T as a K-major B)   dK^T += Q^T dS   (the same)
//   dQ^T  = K^T dS^T  (SS: K M-major, dS^T N-major) in two 64 x 64 slices, each reduce-added from
//                     registers into the workspace's fp32 accumulator (red.global.add.v4, in the
//                     slice's register order: dq_accum_index_transposed).
// dK^T and dV^T stay in registers across the walk (2 x 2 x 40 per thread); the softmax scale
// multiplies dK at the end and dQ in the postprocess. Query rows past the sequence have LSE2 = +inf
// (their P and dS are 0); key rows past it are zero-filled by TMA for fixed lengths, and masked in
// the last key block for varlen (they are the next packed sequence's rows).
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
struct BwdQueryRowsConsumer {
  static_assert(Cfg::kQueryRows, "the query-rows consumer needs a query-rows tile (bwd_config.h)");
  static_assert(!Feat::kVarlen || Feat::kMasked, "varlen backward instantiations are masked ones");
  using Seq = SeqlenInfo<Feat::kVarlen>;
  using Mma = hopper::Mma16<Elem>;
  using Smem = BwdSmem<Cfg>;
  using KTile = typename Smem::KTile;
  using QTile = typename Smem::QTile;
  using DsTile = typename Smem::DsTile;  // P^T and dS^T: rows keys, columns queries
  static constexpr int kD = Cfg::kHeadDim, kM = Cfg::kBlockM, kN = Cfg::kBlockN, kK = Mma::kK;
  static constexpr int kKeys = Cfg::kWgKeys, kDims = Cfg::kWgDims, kDimBlocks = kDims / 64;
  static_assert(kM == 64 && kKeys % 8 == 0 && kDims % 64 == 0, "one m64 row block of queries, 8-key chunks");

  const BwdKernelParams& p;
  Smem smem;
  int consumer, thread;  // warpgroup 0/1 of the consumers; 0..127
  // dK^T and dV^T: this warpgroup's head dims (64 per block) x the CTA's kN keys.
  float dk[kDimBlocks][kN / 2], dv[kDimBlocks][kN / 2];
  hopper::PipelineState<Cfg::kDoStages> do_st;

  __device__ __forceinline__ BwdQueryRowsConsumer(const BwdKernelParams& params, Smem s, int c, int t)
      : p(params), smem(s), consumer(c), thread(t) {}

  // This thread's first row of an m64 accumulator (its second is 8 further): a query of S / dP, a
  // head dim of dK^T / dV^T / dQ^T; and its first key column of the CTA's block in S / dP.
  __device__ __forceinline__ int row0() const { return 16 * (thread / 32) + (thread % 32) / 4; }
  __device__ __forceinline__ int key_col0() const { return kKeys * consumer + 2 * (thread % 4); }

  __device__ void run(int n_block, int kv_head, const Seq& seq) {
#pragma unroll
    for (int b = 0; b < kDimBlocks; ++b)
#pragma unroll
      for (int i = 0; i < kN / 2; ++i) dk[b][i] = dv[b][i] = 0.f;
    const BwdWalk<Cfg> walk(n_block, kv_head, seq, p);
    hopper::mbarrier_wait(&smem.bars().kv, 0);
    hopper::PipelineState<Cfg::kStages> st;
    auto cur = walk.begin();
    for (int it = 0; it < walk.steps; ++it) {
      step(n_block, cur.head, walk.m_block(cur), seq, st, it);
      st.advance();
      walk.advance(cur);
    }
    store_dkdv(n_block, kv_head, seq);
  }

 private:
  // The per-row values (LSE2 or D) of this thread's two accumulator rows, row0() and row0() + 8.
  __device__ __forceinline__ float2 row_pair(const float* rows) const {
    const uint32_t at = hopper::smem_u32(rows) + 4 * row0();
    return {__uint_as_float(hopper::ld_shared_u32(at)), __uint_as_float(hopper::ld_shared_u32(at + 32))};
  }

  // True when every (query, key) pair of query block m and this warpgroup's keys is visible
  // (varlen: and every key is the sequence's).
  __device__ __forceinline__ bool fully_visible(int n_block, int m, const Seq& seq) const {
    const int j_lo = n_block * kN + kKeys * consumer;
    return bwd_fully_visible<Feat::kVarlen>(p.fwd, seq, j_lo, j_lo + kKeys - 1, m * kM, m * kM + kM - 1);
  }

  // acc = (the query block at `block`) x (this warpgroup's kKeys rows of the key-block tile at
  // `keys`)^T over the head dim, both K-major: one committed group (S = Q K^T, dP = dO V^T).
  __device__ __forceinline__ void issue_block_times_keys(float (&acc)[kKeys / 2], uint32_t block, const uint8_t* keys) const {
    const uint64_t a = hopper::make_smem_desc(block, QTile::kKMajorLbo, QTile::kKMajorSbo);
    const uint64_t b = hopper::make_smem_desc(hopper::smem_u32(keys) + KTile::row_offset(kKeys * consumer),
                                              KTile::kKMajorLbo, KTile::kKMajorSbo);
#pragma unroll
    for (int kk = 0; kk < kD / kK; ++kk)
      Mma::template Op<kKeys>::template ss<0>(acc, hopper::desc_advance(a, QTile::template k_chunk_offset<kK>(kk)),
                                              hopper::desc_advance(b, KTile::template k_chunk_offset<kK>(kk)), kk > 0);
    hopper::wgmma_commit();
  }

  // Where the transposed S-shaped fragment's column x (a key of this warpgroup) and rows from q go
  // in a keys x queries tile (P^T, dS^T).
  __device__ __forceinline__ auto keys_by_queries(uint8_t* tile) const {
    const uint32_t base = hopper::smem_u32(tile);
    const int key0 = kKeys * consumer;
    return [base, key0](int x, int q) { return base + DsTile::offset(key0 + x, q); };
  }

  __device__ void step(int n_block, int head, int m, const Seq& seq, hopper::PipelineState<Cfg::kStages>& st, int it) {
    const int buf = it & 1;
    smem.bars().q.consumer_wait(st);
    // dO's ring is waited for before the first issue: a spin loop between two wgmma issues makes
    // ptxas fence them.
    smem.bars().dout.consumer_wait(do_st);
    const uint32_t q_addr = hopper::smem_u32(smem.q(st.index)), do_addr = hopper::smem_u32(smem.dout(do_st.index));
    float s[kKeys / 2], dp[kKeys / 2];
    hopper::wgmma_fence();
    issue_block_times_keys(s, q_addr, smem.k());
    issue_block_times_keys(dp, do_addr, smem.v());
    // This thread's two rows' LSE2, read while the GEMMs run.
    const float2 lse = row_pair(smem.lse2(st.index));
    hopper::wgmma_wait<1>();
    hopper::fence_operand(s);

    // P (bf16 pairs into P^T's tile, for dV) and, kept in s, P * dscore for dS. Only tiles that are
    // not fully visible pay for the mask.
    uint32_t pa[kKeys / 8][2];
    if (Feat::kMasked && !fully_visible(n_block, m, seq)) probabilities<true>(s, pa, lse, n_block, m, seq);
    else probabilities<false>(s, pa, lse, n_block, m, seq);
    hopper::store_fragment_transposed(pa, keys_by_queries(smem.p(buf)), thread);
    hopper::wgmma_wait<0>();
    hopper::fence_operand(dp);

    // dS = P (dP - D) into dS^T's tile.
    const float2 delta = row_pair(smem.delta(do_st.index));
    uint32_t da[kKeys / 8][2];
#pragma unroll
    for (int i = 0; i < kKeys / 2; i += 2) {
      const float d = hopper::acc_row(i) ? delta.y : delta.x;
      da[i / 4][(i / 2) % 2] = Mma::pack(s[i] * (dp[i] - d), s[i + 1] * (dp[i + 1] - d));
    }
    hopper::store_fragment_transposed(da, keys_by_queries(smem.ds(buf)), thread);
    // Both warpgroups' halves of P^T and dS^T are read by both. One barrier per buffer: the buffer
    // is written again two steps later, after both warpgroups passed the barrier of the step
    // between, which each reaches only after its GEMMs of this step completed.
    hopper::fence_view_async_shared();
    bwd_barrier_sync(kBarDsReady + buf, 2 * hopper::kWarpgroupSize);
    gradients(buf, q_addr, do_addr, head, m, seq, st);
  }

  // dV^T += dO^T P, dQ^T's first slice, dK^T += Q^T dS, then the slices' adds: each under a GEMM
  // still running (the first under dK^T, the second under the other warpgroup's work).
  __device__ __forceinline__ void gradients(int buf, uint32_t q_addr, uint32_t do_addr, int head, int m, const Seq& seq,
                                            hopper::PipelineState<Cfg::kStages>& st) {
    const uint32_t p_tile = hopper::smem_u32(smem.p(buf)), ds_tile = hopper::smem_u32(smem.ds(buf));
    const uint64_t bp = hopper::make_smem_desc(p_tile, DsTile::kKMajorLbo, DsTile::kKMajorSbo);
    const uint64_t bds = hopper::make_smem_desc(ds_tile, DsTile::kKMajorLbo, DsTile::kKMajorSbo);
#pragma unroll
    for (int b = 0; b < kDimBlocks; ++b) {
      hopper::fence_operand(dv[b]);
      hopper::fence_operand(dk[b]);
    }
    hopper::wgmma_fence();
    // acc^T += block^T x (the P^T / dS^T tile at b): A = the row block's head-dim panels kDimBlocks c
    // + i, read M-major (K = queries); B K-major. One committed group.
    auto issue_transposed = [&](float (&acc)[kDimBlocks][kN / 2], uint32_t block, uint64_t b) {
#pragma unroll
      for (int i = 0; i < kDimBlocks; ++i) {
        const uint64_t a = hopper::make_smem_desc(block + QTile::panel_offset(kDimBlocks * consumer + i),
                                                  QTile::kNMajorLbo, QTile::kNMajorSbo);
#pragma unroll
        for (int kb = 0; kb < kM / kK; ++kb)
          Mma::template Op<kN>::template ss<0, 1>(acc[i], hopper::desc_advance(a, QTile::template row_chunk_offset<kK>(kb)),
                                                  hopper::desc_advance(b, DsTile::template k_chunk_offset<kK>(kb)), 1);
      }
      hopper::wgmma_commit();
    };
    issue_transposed(dv, do_addr, bp);  // dV^T += dO^T P
    float dq[32];
    issue_dq_slice(dq, ds_tile, 0);
    issue_transposed(dk, q_addr, bds);  // dK^T += Q^T dS
    float* acc = p.dq_accum + (bwd_ws_row0<kM>(p, seq, head) + int64_t(m) * kM) * kD;
    static_assert(kDimBlocks == 2, "dQ^T in two slices");
    // dV^T was the last reader of dO: its single stage goes back while dQ^T and dK^T run.
    hopper::wgmma_wait<2>();
#pragma unroll
    for (int b = 0; b < kDimBlocks; ++b) hopper::fence_operand(dv[b]);
    smem.bars().dout.consumer_release(do_st);
    do_st.advance();
    hopper::wgmma_wait<1>();
    hopper::fence_operand(dq);
    if (p.deterministic) bwd_barrier_sync(kBarDqMayAdd + consumer, kBwdDqGateThreads);  // our turn (bwd_dq_gate.cuh)
    add_dq(acc, dq, 0);
    hopper::wgmma_fence();  // dq's registers were read since the last wgmma
    issue_dq_slice(dq, ds_tile, 1);
    hopper::wgmma_wait<0>();
    hopper::fence_operand(dq);
#pragma unroll
    for (int b = 0; b < kDimBlocks; ++b) {
      hopper::fence_operand(dv[b]);
      hopper::fence_operand(dk[b]);
    }
    // Every read of the stage is done (every thread arrives: each read its own LSE2 and D).
    smem.bars().q.consumer_release(st);
    add_dq(acc, dq, 1);
    if (p.deterministic) bwd_barrier_sync(kBarDqAdded + consumer, kBwdDqGateThreads);  // the next key block's turn
  }

  // dQ^T slice `slice` (this warpgroup's head dims kDims c + 64 slice .. + 63, all 64 queries) =
  // K^T dS^T: A = K's head-dim panel read M-major (K = keys), B = dS^T N-major; one committed group.
  __device__ __forceinline__ void issue_dq_slice(float (&dq)[32], uint32_t ds_tile, int slice) const {
    const uint64_t a = hopper::make_smem_desc(hopper::smem_u32(smem.k()) + KTile::panel_offset(kDimBlocks * consumer + slice),
                                              KTile::kNMajorLbo, KTile::kNMajorSbo);
    const uint64_t b = hopper::make_smem_desc(ds_tile, DsTile::kNMajorLbo, DsTile::kNMajorSbo);
#pragma unroll
    for (int kk = 0; kk < kN / kK; ++kk)
      Mma::template Op<64>::template ss<1, 1>(dq, hopper::desc_advance(a, KTile::template row_chunk_offset<kK>(kk)),
                                              hopper::desc_advance(b, DsTile::template row_chunk_offset<kK>(kk)), kk > 0);
    hopper::wgmma_commit();
  }

  // A dQ^T slice into the query block's accumulator, in the slice's register order (part 2c +
  // slice of dq_accum_index_transposed): four consecutive registers per 16-byte add, so a warp's
  // add covers 512 contiguous bytes. The adds are this tile's bottleneck: one scalar add per
  // element ran at 0.79 of the four-wide form, and without adds the kernel ran 1.4x faster (perf-log
  // step 88). Deterministic mode orders them by key block (bwd_dq_gate.cuh).
  __device__ __forceinline__ void add_dq(float* acc, const float (&dq)[32], int slice) const {
    float* at = acc + (kDimBlocks * consumer + slice) * 64 * 64 + 4 * thread;
#pragma unroll
    for (int i = 0; i < 32; i += 4) hopper::red_add_f32x4(at + 128 * i, dq[i], dq[i + 1], dq[i + 2], dq[i + 3]);
  }

  // s (S) -> P: bf16 pairs pa for P^T's tile, and P * dscore back in s for dS; hidden pairs (kMask:
  // BwdVisibility, register columns are keys) get P = 0.
  template <bool kMask>
  __device__ __forceinline__ void probabilities(float (&s)[kKeys / 2], uint32_t (&pa)[kKeys / 8][2], float2 lse,
                                                int n_block, int m, const Seq& seq) const {
    BwdVisibility<Feat::kVarlen> vis;
    if constexpr (kMask) vis = BwdVisibility<Feat::kVarlen>(p.fwd, seq, n_block * kN + key_col0(), m * kM + row0());
#pragma unroll
    for (int i = 0; i < kKeys / 2; i += 2) {
      const float l = hopper::acc_row(i) ? lse.y : lse.x;
      float pr[2];
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float dscore;
        pr[e] = bwd_probability<Feat::kSoftcap>(s[i + e], l, p.fwd, &dscore);
        if (kMask && vis.hidden(hopper::acc_col(i + e), hopper::acc_row(i + e))) pr[e] = 0.f;
        s[i + e] = pr[e] * dscore;
      }
      pa[i / 4][(i / 2) % 2] = Mma::pack(pr[0], pr[1]);
    }
  }

  // dK = scale * dK and dV, converted: once both warpgroups' last GEMMs have read K and V, their
  // tiles hold this warpgroup's [keys][its head dims] halves as BwdStagedRows tiles (stmatrix's 8
  // rows hit 32 banks).
  __device__ void store_dkdv(int n_block, int kv_head, const Seq& seq) {
    using Rows = BwdStagedRows<kDims * 2>;
    constexpr int kTileBytes = kN * kDims * 2;
    static_assert(2 * kTileBytes <= KTile::kBytes, "both warpgroups' halves fit K's (and V's) tile");
    bwd_barrier_sync(kBarDsReady, 2 * hopper::kWarpgroupSize);  // every GEMM of the walk read K and V
    const uint32_t k_stage = hopper::smem_u32(smem.k()) + consumer * kTileBytes;
    const uint32_t v_stage = hopper::smem_u32(smem.v()) + consumer * kTileBytes;
    auto stage = [&](uint32_t tile, const float (&acc)[kDimBlocks][kN / 2], float scale) {
#pragma unroll
      for (int b = 0; b < kDimBlocks; ++b) {
        uint32_t frag[kN / 8][2];
#pragma unroll
        for (int i = 0; i < kN / 2; i += 2) frag[i / 4][(i / 2) % 2] = Mma::pack(acc[b][i] * scale, acc[b][i + 1] * scale);
        hopper::store_fragment_transposed(frag, [=](int key, int dim) { return tile + Rows::offset(key, (64 * b + dim) / 8); },
                                          thread);
      }
    };
    stage(k_stage, dk, p.scale);
    stage(v_stage, dv, 1.f);
    bwd_barrier_sync(kBarDkvStaged + consumer, hopper::kWarpgroupSize);
    const FwdKernelParams& f = p.fwd;
    const int key0 = n_block * kN, col0 = kDims * consumer;
    Rows::template copy_out<kN, Elem>(k_stage, p.dk, f, seq, kv_head, key0, col0, f.head_dim_qk, thread);
    Rows::template copy_out<kN, Elem>(v_stage, p.dv, f, seq, kv_head, key0, col0, f.head_dim_v, thread);
  }
};

}  // namespace fa3::attn
