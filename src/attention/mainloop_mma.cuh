// One consumer warpgroup's work on a tile: 64 query rows against key blocks n_max-1 .. n_min.
//   S = Q K^T   (SS wgmma, K-major K tile)
//   online softmax on S in registers -> P (A fragments of the operand type)
//   O += P V    (RS wgmma; 16-bit: the V tile read N-major through the descriptor's transpose bit;
//                e4m3: the V^T tile, K-major, that the producer warpgroup writes: v_transpose.cuh)
// Two FlashAttention-3 schedules, each switchable for the ablation:
//   pingpong (kPingpong): warpgroups take turns issuing their GEMMs (named barriers), so one's
//     softmax runs while the tensor cores work on the other's GEMMs;
//   intra-warpgroup overlap (kOverlap): QK^T of block n is issued together with PV of block n+1,
//     and the softmax of block n (row max, and with kExpUnderPv the exponentials) runs while that
//     PV is still in flight; only the O rescale and packing P wait for it;
//   cross-tile overlap (kCrossTile, ours): the same between the last block of one tile and the first
//     block of the next, so a persistent CTA's tiles form one stream of blocks;
//   narrow first blocks (kNarrowFirst, ours): a tile's first block only as wide as this warpgroup's
//     rows can see; and warpgroups whose rows all lie past seqlen_q sit the tile out (run_idle).
// Every schedule is made of the same verbs: issue_step (one or two GEMMs after their stages' waits,
// under the pingpong turn), s_done / pv_done (a GEMM group complete, its stage released or kept),
// and the softmax steps (first_softmax, middle_softmax) whose hooks are the score modifier
// (score_mod.cuh), the mask (mask.cuh), the softmax variant and P's conversion (softmax.cuh).
#pragma once
#include <type_traits>

#include "src/attention/block_info.cuh"
#include "src/attention/descale.cuh"
#include "src/attention/fwd_config.h"
#include "src/attention/fwd_smem.cuh"
#include "src/attention/fwd_features.h"
#include "src/attention/mask.cuh"
#include "src/attention/score_mod.cuh"
#include "src/attention/seqlen_info.cuh"
#include "src/attention/softmax.cuh"
#include "src/attention/tile_rows.cuh"
#include "src/hopper/wgmma.cuh"

namespace fa3::attn {

template <class Elem, class Cfg, class Feat>
struct MainloopMma {
  static constexpr int kSched = Cfg::kSchedule;
  static constexpr bool kMasked = Feat::kMasked;
  using Smem = FwdSmem<Cfg>;
  using Releasers = StageReleasers<Cfg, Feat>;
  using Mma = typename hopper::OperandTraits<Elem>::Mma;
  static constexpr bool kTransposeV = Smem::kTransposeV;
  static_assert(hopper::OperandTraits<Elem>::kBytes == Cfg::kOperandBytes, "the tile's operand size is Elem's");
  using Seq = SeqlenInfo<Feat::kVarlen>;
  // The score modifier; e4m3's holds the tile's descaled factor (score_mod.cuh), which the
  // consumer sets with each tile's softmax (FwdConsumer::begin_tile_scores); with block descales
  // the rows' factors, times each key block's (s_done).
  using Scores = ScoreMod<Feat::kSoftcap, kTransposeV, Cfg::kBlockDescales>;
  // The decode kernel's rows are pack-GQA rows (tile_rows.cuh): one warpgroup per tile there.
  static constexpr bool kPacked = Feat::kSplit;
  using Rows = TileRows<Cfg::kBlockM, kPacked>;
  // kDqk: Q/K columns (the QK^T reduction), kDv: V/O columns (O's accumulator).
  static constexpr int kDqk = Cfg::kHeadDim, kDv = Cfg::kHeadDimV, kN = Cfg::kBlockN, kM = Cfg::kBlockM;
  static constexpr int kConsumers = kM / 64;
  static_assert(!kPacked || kConsumers == 1, "pack-GQA tiles: one consumer warpgroup");
  static constexpr bool kUsePingpong = (kSched & Schedule::kPingpong) != 0;
  static constexpr bool kUseOverlap = (kSched & Schedule::kOverlap) != 0;
  static constexpr bool kLazyRescale = (kSched & Schedule::kLazyRescale) != 0;
  static constexpr bool kExpUnderPv = (kSched & Schedule::kExpUnderPv) != 0;
  static constexpr bool kCrossTile = (kSched & Schedule::kCrossTile) != 0 && kUseOverlap && Smem::kQStages == 2;
  static_assert(!Cfg::kOInKV || (kUseOverlap && !kCrossTile), "O in K/V stages: the overlap schedule's tile ends only");
  // Block descales (e4m3): the softmax with per-row scales that applies them (descale.cuh).
  using Softmax = std::conditional_t<Cfg::kBlockDescales, Fp8Softmax<kN, kLazyRescale, Feat::kSoftcap>,
                                     OnlineSoftmax<kN, kLazyRescale>>;
  // Middle blocks without kExpUnderPv under the lazy rescale: exponentials against the running max
  // first, the row max only where they could exceed 2^8 (OnlineSoftmax::exponentiate_stale).
  static constexpr bool kStaleMax = kLazyRescale && !kExpUnderPv;
  static_assert(kN % Mma::kK == 0 && kDqk % 16 == 0 && kDv % 16 == 0, "whole wgmma k-steps");

  const FwdKernelParams& p;
  Smem smem;
  int consumer;  // 0 .. kConsumers-1: this warpgroup's 64 rows of the tile
  int thread;    // 0 .. 127 within the warpgroup
  hopper::PipelineState<Cfg::kStages> k_st, v_st;
  Scores scores{};  // the current tile's score modifier
  // kOInKV: the stages of the tile's last key block, kept from the producer until O has been
  // staged there and stored; given back once the next tile's first QK^T is issued (the store has
  // had time to read them, and the producer needs them only for that tile's second block).
  hopper::PipelineState<Cfg::kStages> k_last, v_last;
  static constexpr bool kKeepK = Cfg::kOInKV && !Smem::kOHalf;  // else consumer 0 has a half tile
  bool kept = false;

  // ---- pingpong turn-taking: consumer c waits for its turn, then hands the turn to c+1 ----
  __device__ __forceinline__ void turn_wait() const {
    if constexpr (kUsePingpong) hopper::named_barrier_sync(kBarSchedule + consumer, 2 * hopper::kWarpgroupSize);
  }
  __device__ __forceinline__ void turn_pass() const {
    if constexpr (kUsePingpong)
      hopper::named_barrier_arrive(kBarSchedule + (consumer + 1) % kConsumers, 2 * hopper::kWarpgroupSize);
  }
  // This warpgroup's four warps meet (the epilogue's barrier: only they use it, always all 128).
  // Thread 0 gives a stage back for the warpgroup; where no wgmma has tied the warps together since
  // their waits for that stage (a block walked past: skip_block), they meet first: else the
  // producer could refill the stage while a warp is still before its wait, whose parity then names
  // the refill's phase, the one after it, so that warp waits for a completion that needs it to go
  // on (a hang, timing-dependent).
  __device__ __forceinline__ void warpgroup_sync() const {
    hopper::named_barrier_sync(kBarEpilogue + consumer, hopper::kWarpgroupSize);
  }

  // Once per kernel: the last consumer gives the first turn to consumer 0.
  __device__ __forceinline__ void start_turns() const {
    if constexpr (kUsePingpong)
      if (consumer == kConsumers - 1) hopper::named_barrier_arrive(kBarSchedule, 2 * hopper::kWarpgroupSize);
  }

  // ---- the tile's first key block: how much of it this warpgroup computes ----
  // That block (n_max-1) holds the causal diagonal and the key tail. Where every key past its
  // first half (kHalfN: rounded up to whole 16-key PV steps) is invisible to all 64 rows of this
  // warpgroup (upper rows of a diagonal tile, a short tail), its softmax and PV run on that half;
  // where the warpgroup sees none of the block (64-key blocks under 128-row tiles), not at all (the
  // PV commits an empty group, so the wait counts stay). kNarrowFirst.
  enum Width : int { kNone, kHalf, kFull };
  static constexpr bool kNarrowFirst = (kSched & Schedule::kNarrowFirst) != 0;
  static constexpr int kHalfN = (kN / 2 + Mma::kK - 1) / Mma::kK * Mma::kK;  // whole k-steps for the PV
  static constexpr bool kCanHalve = kHalfN < kN;
  int pv_width = kFull;  // of the block whose PV goes out next

  // The first query row of this warpgroup's 64 in m-block m_block.
  __device__ __forceinline__ int wg_row0(int m_block) const { return m_block * kM + consumer * 64; }
  // The last query (inside the sequence) of this warpgroup's rows.
  __device__ __forceinline__ int wg_last_query(int m_block, const Seq& seq) const {
    if constexpr (kPacked) return min(Rows::query(p, m_block, 0) + Rows::queries(p), seq.seqlen_q(p)) - 1;
    else return min(wg_row0(m_block) + 63, seq.seqlen_q(p) - 1);
  }

  __device__ __forceinline__ int first_block_width(int n, int m_block, const Seq& seq) const {
    if constexpr (!kNarrowFirst) return kFull;
    int end = seq.seqlen_k(p);  // one past this warpgroup's last visible key
    if constexpr (kMasked) {
      if (p.window_right >= 0) {
        end = min(end, wg_last_query(m_block, seq) + seq.seqlen_k(p) - seq.seqlen_q(p) + p.window_right + 1);
      }
    }
    const int visible = end - n * kN;
    return visible <= 0 ? kNone : kCanHalve && visible <= kHalfN ? kHalf : kFull;
  }

  // ---- the two GEMMs (fence + issue + commit; the caller waits) ----
  // Each batch starts with wgmma.fence: the softmax wrote S, P and O with ordinary instructions.
  __device__ __forceinline__ void issue_qk(float (&s)[kN / 2], int q_stage, int stage) const {
    hopper::fence_operand(s);
    hopper::wgmma_fence();
    using QTile = typename Smem::QTile;
    using KTile = typename Smem::KTile;
    // This warpgroup's 64 rows of Q and the block's keys, both K-major, one k-chunk per wgmma.
    const uint64_t dq = hopper::make_smem_desc(hopper::smem_u32(smem.q(q_stage)) + QTile::row_offset(consumer * 64),
                                               QTile::kKMajorLbo, QTile::kKMajorSbo);
    const uint64_t dk = hopper::make_smem_desc(hopper::smem_u32(smem.k(stage)), KTile::kKMajorLbo, KTile::kKMajorSbo);
#pragma unroll
    for (int kk = 0; kk < kDqk / Mma::kK; ++kk)
      Mma::template Op<kN>::template ss<0>(s, hopper::desc_advance(dq, QTile::template k_chunk_offset<Mma::kK>(kk)),
                                           hopper::desc_advance(dk, KTile::template k_chunk_offset<Mma::kK>(kk)), kk > 0);
    hopper::wgmma_commit();
    hopper::fence_operand(s);
  }

  // The PV's B operand, one k-step (Mma::kK keys) at a time: 16-bit V [keys][d] with d contiguous,
  // read N-major through the transpose bit (the descriptor steps V's panels of d); e4m3 V^T
  // [d][keys] with keys contiguous, K-major (FP8 wgmma has no transpose bit).
  struct PvB {
    using Tile = std::conditional_t<kTransposeV, typename Smem::VtTile, typename Smem::VTile>;
    static constexpr int kTransB = kTransposeV ? 0 : 1;
    static constexpr uint32_t lbo = kTransposeV ? Tile::kKMajorLbo : Tile::kNMajorLbo;
    static constexpr uint32_t sbo = kTransposeV ? Tile::kKMajorSbo : Tile::kNMajorSbo;
    __device__ __forceinline__ static uint32_t chunk(int kb) {
      if constexpr (kTransposeV) return Tile::template k_chunk_offset<Mma::kK>(kb);
      else return Tile::template row_chunk_offset<Mma::kK>(kb);
    }
  };
  // kKeys: the block's first kKeys keys (P's first kKeys / Mma::kK k-steps).
  template <int kKeys = kN>
  __device__ __forceinline__ void issue_pv_keys(float (&o)[kDv / 2], const uint32_t (&pa)[kN / Mma::kK][4], int stage) const {
    hopper::fence_operand(o);
    hopper::wgmma_fence();
    const uint64_t dv = hopper::make_smem_desc(hopper::smem_u32(pv_stage(stage)), PvB::lbo, PvB::sbo);
#pragma unroll
    for (int kb = 0; kb < kKeys / Mma::kK; ++kb)
      Mma::template Op<kDv>::template rs<PvB::kTransB>(o, pa[kb], hopper::desc_advance(dv, PvB::chunk(kb)), 1);
    hopper::wgmma_commit();
    hopper::fence_operand(o);
  }
  // The PV of the block whose softmax ran last, at that block's width.
  __device__ __forceinline__ void issue_pv(float (&o)[kDv / 2], const uint32_t (&pa)[kN / Mma::kK][4], int stage) {
    const int width = pv_width;
    pv_width = kFull;
    if (width == kFull) issue_pv_keys(o, pa, stage);
    else if (kCanHalve && width == kHalf) issue_pv_keys<kHalfN>(o, pa, stage);
    else issue_pv_keys<0>(o, pa, stage);
  }

  // The ring whose stages the PV reads: V, or (e4m3) V^T.
  __device__ __forceinline__ hopper::PipelineBarriers<Cfg::kStages>& pv_ring() const {
    if constexpr (kTransposeV) return smem.bars().vt;
    else return smem.bars().v;
  }
  __device__ __forceinline__ uint8_t* pv_stage(int stage) const {
    if constexpr (kTransposeV) return smem.vt(stage);
    else return smem.v(stage);
  }

  // A stage goes back: its ring's empty barrier counts `arrivals` per warpgroup (StageReleasers):
  // thread 0's, or every thread's.
  __device__ __forceinline__ void release(hopper::PipelineBarriers<Cfg::kStages>& ring,
                                          hopper::PipelineState<Cfg::kStages>& st, uint32_t arrivals) {
    if (arrivals > 1 || thread == 0) ring.consumer_release(st);
    st.advance();
  }

  // Releases the stage, or (keep) holds it back in `held` for O's staging (kOInKV).
  __device__ __forceinline__ void release_or_keep(hopper::PipelineBarriers<Cfg::kStages>& ring,
                                                  hopper::PipelineState<Cfg::kStages>& st, bool keep,
                                                  hopper::PipelineState<Cfg::kStages>& held, uint32_t arrivals) {
    if (keep) {
      held = st;
      st.advance();
    } else {
      release(ring, st, arrivals);
    }
  }
  // kOInKV, after the tile: where this warpgroup stages its 64 rows of O (consumer 1 the held V
  // stage, consumer 0 its half tile or the held K stage); the stages go back at the next tile.
  __device__ __forceinline__ uint8_t* o_staging_in_kept_stage() {
    kept = true;
    if (consumer == 1) return pv_stage(v_last.index);
    return kKeepK ? smem.k(k_last.index) : smem.o();
  }
  // Where the threads read the staged O themselves (StageReleasers::kThreadsReadKept) each arrives
  // for its own reads; else thread 0, after the TMA store's reads (its bulk group), for all (the
  // warpgroup met after staging).
  __device__ __forceinline__ void release_kept() {
    if constexpr (Releasers::kThreadsReadKept) {
      if (kKeepK) smem.bars().k.consumer_release(k_last);
      pv_ring().consumer_release(v_last);
    } else if (thread == 0) {
      hopper::tma_store_wait_read();
      if (kKeepK) smem.bars().k.consumer_release(k_last, Releasers::kK);
      pv_ring().consumer_release(v_last, Releasers::kPv);
    }
    kept = false;
  }

  __device__ __forceinline__ static void rescale(float (&o)[kDv / 2], const float (&c)[2]) {
#pragma unroll
    for (int i = 0; i < kDv / 2; ++i) o[i] *= c[(i >> 1) & 1];
  }

  static constexpr bool kRelativeMask = kN >= 128;  // mask.cuh
  // The queries of this thread's two fragment rows (r0 and r0 + 8 of this warpgroup's 64).
  struct ThreadQueries {
    int q[2];
  };
  __device__ __forceinline__ ThreadQueries thread_queries(int m_block) const {
    if constexpr (kPacked) {
      const int r0 = (thread / 32) * 16 + (thread % 32) / 4;
      return {{Rows::query(p, m_block, r0), Rows::query(p, m_block, r0 + 8)}};
    } else {
      const int row0 = wg_row0(m_block) + (thread / 32) * 16 + (thread % 32) / 4;
      return {{row0, row0 + 8}};
    }
  }
  __device__ __forceinline__ bool block_needs_mask_here(int n, int m_block, const Seq& seq) const {
    if constexpr (kPacked) {
      const int first = Rows::query(p, m_block, 0);
      return block_needs_mask_for_queries<kN, kMasked>(n, first, Rows::queries(p), seq, p);
    } else {
      return block_needs_mask<kM, kN, kMasked>(n, m_block, seq, p);
    }
  }
  __device__ __forceinline__ void mask_if_needed(float (&s)[kN / 2], int n, int m_block, const Seq& seq) const {
    if (block_needs_mask_here(n, m_block, seq))
      apply_mask<kN, kMasked, kRelativeMask>(s, thread_queries(m_block).q, n * kN + 2 * (thread % 4), seq, p);
  }

  // Mask, softmax and packing of a tile's first block (n) at its width, which its PV keeps. A
  // fresh row max: nothing to correct. The QK^T ran at full width: ptxas serialises every wgmma of
  // the kernel when GEMMs of two widths join inside a wgmma pipeline stage.
  __device__ __forceinline__ void first_softmax(int width, float (&s)[kN / 2], uint32_t (&pa)[kN / Mma::kK][4],
                                                Softmax& softmax, int n, int m_block, const Seq& seq) {
    float corr[2];
    pv_width = width;
    if (width == kFull) {
      scores.apply(s, p);
      mask_if_needed(s, n, m_block, seq);
      softmax.update_max(s, corr);
      softmax.exponentiate(s);
      Softmax::template pack<Mma>(s, pa);
    } else if constexpr (kCanHalve) {
      if (width == kHalf) {  // a half block always needs its mask
        auto& s_half = reinterpret_cast<float(&)[kHalfN / 2]>(s);
        scores.apply(s_half, p);
        apply_mask<kHalfN, kMasked, kRelativeMask>(s_half, thread_queries(m_block).q, n * kN + 2 * (thread % 4), seq,
                                                   p);
        softmax.template update_max<kHalfN>(s_half, corr);
        softmax.template exponentiate<kHalfN>(s_half);
        Softmax::template pack<Mma, kHalfN>(s_half, pa);
      }
    }
    // kNone: nothing visible, the softmax state stays empty and P is never read.
  }

  using SFrag = float[kN / 2];          // S (then P in fp32) of one block
  using PFrag = uint32_t[kN / Mma::kK][4];   // P packed: the PV GEMM's A fragments
  using OFrag = float[kDv / 2];

  // ---- the step's verbs: every schedule below is made of these ----
  // issue_step: the GEMMs of one step, each after its stage's wait, the first of them (whose
  // completion a later wgmma_wait<1> observes) issued first; with kTurn under this warpgroup's
  // pingpong turn (taken before the first issue, passed after the last).
  enum Gemm : int { kNoGemm, kQk, kPv };
  template <int kFirst, int kSecond = kNoGemm, bool kTurn = true>
  __device__ __forceinline__ void issue_step(SFrag& s, int q_stage, OFrag& o, const PFrag& pa) {
    static_assert(kFirst != kNoGemm && kFirst != kSecond, "a step issues one or two different GEMMs");
    auto& bars = smem.bars();
    auto issue = [&](auto gemm, bool first) {
      if constexpr (decltype(gemm)::value == kQk) {
        bars.k.consumer_wait(k_st);
        if (kTurn && first) turn_wait();
        issue_qk(s, q_stage, k_st.index);
      } else {
        pv_ring().consumer_wait(v_st);
        if (kTurn && first) turn_wait();
        issue_pv(o, pa, v_st.index);
      }
    };
    issue(std::integral_constant<int, kFirst>{}, true);
    if constexpr (kSecond != kNoGemm) issue(std::integral_constant<int, kSecond>{}, false);
    if (kTurn) turn_pass();
  }
  // S of the QK^T issued kPending groups ago is complete: the softmax (and with softcap the score
  // modifier) takes the block's factors from its K stage (block descales), and the stage goes back
  // (or is kept for O).
  template <int kPending>
  __device__ __forceinline__ void s_done(SFrag& s, bool keep_k, Softmax& softmax) {
    hopper::wgmma_wait<kPending>();
    hopper::fence_operand(s);
    if constexpr (Cfg::kBlockDescales) {
      const float4 f = hopper::ld_shared_f32x4(hopper::smem_u32(&smem.bars().k_factors[k_st.index]));
      softmax.begin_block(f);
      if constexpr (Feat::kSoftcap) scores.begin_block(f.x);
    }
    release_or_keep(smem.bars().k, k_st, keep_k, k_last, Releasers::kK);
  }
  // The PV issued kPending groups ago has finished reading P and its V stage.
  template <int kPending>
  __device__ __forceinline__ void pv_done(OFrag& o, bool keep_v = false) {
    hopper::wgmma_wait<kPending>();
    hopper::fence_operand(o);
    release_or_keep(pv_ring(), v_st, keep_v, v_last, Releasers::kPv);
  }

  // The tile's first block (n_max-1, the one that may hold the diagonal / the key tail) on its
  // own: S = QK^T, then the softmax into P. O starts at zero.
  // With blocks narrower than 128 keys, blocks this warpgroup sees nothing of (the upper rows'
  // share of a 64-key diagonal) are walked past before any GEMM, QK^T included (r shrinks for this
  // warpgroup; a skipped QK^T inside the wgmma stream makes ptxas serialise it): +1-2% at
  // d256 causal 512-2k. The 128-key tiles rarely have such blocks and measured 1-2% slower with
  // the loop. Never the tile's last block, whose stages may be kept for O (kOInKV); the
  // previous tile's kept stages go back first (the producer needs them).
  static constexpr bool kSkipHidden = kNarrowFirst && kN < 128;
  __device__ __forceinline__ void begin_tile(int m_block, const Seq& seq, BlockRange& r, int q_stage, OFrag& o,
                                             SFrag& s, PFrag& pa, Softmax& softmax) {
    while (kSkipHidden && r.n_max - 1 > r.n_min && first_block_width(r.n_max - 1, m_block, seq) == kNone) {
      if constexpr (Cfg::kOInKV)
        if (kept) release_kept();
      skip_block();
      --r.n_max;
    }
#pragma unroll
    for (int i = 0; i < kDv / 2; ++i) o[i] = 0.f;
    issue_step<kQk>(s, q_stage, o, pa);
    if constexpr (Cfg::kOInKV)
      if (kept) release_kept();
    s_done<0>(s, kKeepK && r.n_min == r.n_max - 1, softmax);
    first_softmax(first_block_width(r.n_max - 1, m_block, seq), s, pa, softmax, r.n_max - 1, m_block, seq);
  }

  // Blocks n_max-2 .. n_min. Overlap schedule: QK^T of block n goes out with PV of block n+1, and
  // the softmax of block n runs while that PV is in flight. On return P holds the last block's
  // probabilities, whose PV is still to do (end_tile / end_tile_start_next).
  __device__ __forceinline__ void middle_blocks(int m_block, const Seq& seq, const BlockRange& r, int q_stage,
                                                OFrag& o, SFrag& s, PFrag& pa, Softmax& softmax) {
    for (int n = r.n_max - 2; n >= r.n_min; --n) {
      issue_step<kQk, kPv>(s, q_stage, o, pa);
      s_done<1>(s, kKeepK && n == r.n_min, softmax);  // S of block n is ready; PV of block n+1 still runs
      middle_softmax(s, pa, o, softmax, n, m_block, seq);
    }
  }
  // A middle block's scores into P while (or after) the previous block's PV reads the old P: the
  // hooks in order — score modifier, mask, the softmax variant (stale max, or the full step with or
  // without the exponentials under the PV), O's rescale, P's conversion to the PV operand.
  __device__ __forceinline__ void middle_softmax(SFrag& s, PFrag& pa, OFrag& o, Softmax& softmax, int n, int m_block,
                                                 const Seq& seq) {
    float corr[2];
    scores.apply(s, p);
    if constexpr (kMasked) mask_if_needed(s, n, m_block, seq);
    bool any_rescale;
    if constexpr (kStaleMax) {
      pv_done<0>(o);  // P is free for the exponentials
      if (softmax.template exponentiate_stale<Mma>(s, pa)) return;
      any_rescale = softmax.update_max(s, corr);  // refused: the full step on S
    } else {
      any_rescale = softmax.update_max(s, corr);
      if constexpr (kExpUnderPv) {
        softmax.exponentiate(s);  // into S's registers: the PV in flight still reads P
        // Else ptxas hoists the PV wait above the exponentials (they would not hide under the PV).
        hopper::end_block_after(softmax.row_sum[0] + softmax.row_sum[1]);
      }
      pv_done<0>(o);
    }
    if (any_rescale) rescale(o, corr);
    if constexpr (!kExpUnderPv) softmax.exponentiate(s);
    Softmax::template pack<Mma>(s, pa);
  }

  // The tile's last PV (block n_min): O is complete on return.
  __device__ __forceinline__ void end_tile(OFrag& o, SFrag& s, const PFrag& pa) {
    issue_step<kPv, kNoGemm, /*kTurn=*/false>(s, 0, o, pa);
    pv_done<0>(o, Cfg::kOInKV);
  }

  // Cross-tile overlap (kCrossTile), in two calls around the epilogue: the tile's last PV goes out
  // together with the next tile's first QK^T; O is complete when end_tile_start_next returns, and
  // the epilogue then runs while that QK^T is still in flight; next_first_softmax turns its S into
  // P (and resets nothing else: the caller zeroes O after the epilogue). So a persistent CTA's
  // tiles run as one stream: no serial QK^T -> softmax at the start of each tile.
  __device__ __forceinline__ void end_tile_start_next(int q_stage_next, OFrag& o, SFrag& s, const PFrag& pa) {
    issue_step<kPv, kQk>(s, q_stage_next, o, pa);
    pv_done<1>(o);  // the PV (committed first) is done; the QK^T still runs
  }
  __device__ __forceinline__ void next_first_softmax(int m_next, const Seq& seq_next, const BlockRange& r_next,
                                                     SFrag& s, PFrag& pa, Softmax& next) {
    s_done<0>(s, false, next);
    first_softmax(first_block_width(r_next.n_max - 1, m_next, seq_next), s, pa, next, r_next.n_max - 1, m_next,
                  seq_next);
  }

  // A warpgroup whose 64 rows all lie past seqlen_q (the last tile of a 192-row tiling: a ninth of
  // the work at 512 and 1k) has nothing to compute: it only walks the rings with the others and
  // takes its pingpong turns (one per block, as in the overlap schedule). Per-tile flow, O staged
  // in a tile of its own (no shared barrier in the epilogue) only.
  static constexpr bool kCanIdle = kUseOverlap && !kCrossTile && !Cfg::kOInKV;
  __device__ __forceinline__ bool rows_past_end(int m_block, const Seq& seq) const {
    return kCanIdle && !kPacked && wg_row0(m_block) >= seq.seqlen_q(p);
  }
  __device__ void run_idle(const BlockRange& r) {
    for (int n = r.n_max - 1; n >= r.n_min; --n) skip_block();
  }
  // One key block this warpgroup does not compute: its stages go back once loaded, its turn passes.
  __device__ __forceinline__ void skip_block() {
    auto& bars = smem.bars();
    bars.k.consumer_wait(k_st);
    turn_wait();
    turn_pass();
    warpgroup_sync();  // no wgmma ties the warps here: each has waited before thread 0 releases
    if (thread == 0) bars.k.consumer_release(k_st, Releasers::kK);  // for the warpgroup
    k_st.advance();
    pv_ring().consumer_wait(v_st);
    warpgroup_sync();
    release(pv_ring(), v_st, Releasers::kPv);
  }

  // One whole tile without cross-tile overlap: the unnormalised O of this warpgroup's rows and the
  // softmax statistics. `q_done` runs once every QK^T of the tile has completed (Q's buffer may be
  // reused).
  template <class QDone>
  __device__ void run(int m_block, const Seq& seq, BlockRange r, int q_stage, OFrag& o, Softmax& softmax,
                      QDone&& q_done) {
    float s[kN / 2];
    uint32_t pa[kN / Mma::kK][4];
    begin_tile(m_block, seq, r, q_stage, o, s, pa, softmax);
    if constexpr (kUseOverlap) {
      middle_blocks(m_block, seq, r, q_stage, o, s, pa, softmax);
      q_done();
      end_tile(o, s, pa);
    } else {
      // Ablation: S -> softmax -> PV strictly in order for each block.
      float corr[2];
      for (int n = r.n_max - 1;;) {
        issue_step<kPv>(s, q_stage, o, pa);
        pv_done<0>(o);
        if (--n < r.n_min) break;
        issue_step<kQk>(s, q_stage, o, pa);
        s_done<0>(s, false, softmax);
        scores.apply(s, p);
        if constexpr (kMasked) mask_if_needed(s, n, m_block, seq);
        if (softmax.update_max(s, corr)) rescale(o, corr);
        softmax.exponentiate(s);
        Softmax::template pack<Mma>(s, pa);
      }
      q_done();
    }
  }
};

}  // namespace fa3::attn
