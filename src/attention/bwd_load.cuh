// The backward's producer: one elected lane of warp 0 loads the CTA's K and V block once, then, for
// every query head of the kv head and every query block that sees the keys, Q and dO (TMA) with
// their LSE2 and D rows (bulk copies from the workspace) into one stage of the ring, in the order
// the consumers walk them.
#pragma once
#include "src/attention/block_info.cuh"
#include "src/attention/bwd_params.h"
#include "src/attention/bwd_smem.cuh"
#include "src/attention/seqlen_info.cuh"
#include "src/hopper/tma.cuh"

namespace fa3::attn {

// Deterministic mode's dQ order within one sequence (bwd_params.h, BwdDqOrder). The rotation needs
// at most as many key blocks as query blocks (every key block then starts at a query block of its
// own); a varlen sequence with more key blocks than query blocks takes the descending order, which
// the CTAs' launch order (bwd_n_block) serves as well.
struct BwdSeqOrder {
  int order, n_blocks, m_blocks;  // the sequence's key and query blocks
  template <class Cfg, class Seq>
  __device__ __forceinline__ static BwdSeqOrder of(const Seq& seq, const BwdKernelParams& p) {
    BwdSeqOrder o;
    o.n_blocks = ceil_div(seq.seqlen_k(p.fwd), Cfg::kBlockN);
    o.m_blocks = ceil_div(seq.seqlen_q(p.fwd), Cfg::kBlockM);
    o.order = p.dq_order == kDqOrderRotating && o.n_blocks > o.m_blocks ? kDqOrderDecreasing : p.dq_order;
    return o;
  }
};

// The steps of a CTA, (query head, query block), in the order producer and consumers take them:
// the query heads of the kv head one after another, each over the query blocks that see the keys,
// from `first` (rotating order: n * M / N, wrapping) and otherwise from the range's start.
template <class Cfg>
struct BwdWalk {
  int n_block, head0, m_min, blocks, first, steps;
  template <class Seq>
  __device__ __forceinline__ BwdWalk(int n, int kv_head, const Seq& seq, const BwdKernelParams& p) {
    // The query blocks that see at least one of the block's keys, for each query head.
    const BlockRange r = query_block_range<Cfg::kBlockM, Cfg::kBlockN>(n, seq, p.fwd);
    n_block = n;
    head0 = kv_head * p.fwd.head_ratio;
    m_min = r.n_min;
    blocks = max(0, r.n_max - r.n_min);
    steps = blocks * p.fwd.head_ratio;
    first = 0;
    if (p.deterministic && p.dq_order == kDqOrderRotating) {  // unmasked: blocks is the sequence's M
      const BwdSeqOrder o = BwdSeqOrder::of<Cfg>(seq, p);
      if (o.order == kDqOrderRotating) first = n * blocks / o.n_blocks;
    }
  }
  // A position of the walk, advanced step by step (no division in the loop).
  struct Cursor {
    int head, k;  // k: steps into this head's query blocks
  };
  __device__ __forceinline__ Cursor begin() const { return {head0, 0}; }
  __device__ __forceinline__ void advance(Cursor& c) const {
    if (++c.k == blocks) {
      c.k = 0;
      ++c.head;
    }
  }
  __device__ __forceinline__ int m_block(const Cursor& c) const {
    const int k = c.k + first;
    return m_min + (k < blocks ? k : k - blocks);
  }
};

// The first row of (the tile's sequence, query head) in lse2 / delta / dq_accum (BwdWorkspaceRows);
// its query block m's semaphore is at (row0 / kBlockM + m) kBwdDqSemaphoreStride.
template <int kBlockM, bool kVarlen>
__device__ __forceinline__ int64_t bwd_ws_row0(const BwdKernelParams& p, const SeqlenInfo<kVarlen>& seq, int head) {
  if constexpr (kVarlen) return p.ws_rows.template row0<kBlockM>(seq.batch, head, seq.q_row0());
  else return BwdWorkspaceRows::dense_row0(seq.batch, head, p.fwd.heads_q, p.seqlen_q_rounded);
}

// The CTA's key block: with a descending or rotating dQ order, CTAs launch from the last key block,
// so that a CTA waiting for a later key block's add never waits for one not yet launched.
__device__ __forceinline__ int bwd_n_block(const BwdKernelParams& p) {
  const int x = blockIdx.x;
  return p.deterministic && p.dq_order != kDqOrderIncreasing ? p.num_n_blocks - 1 - x : x;
}

// Deterministic mode: how many key blocks add into query block m's dQ before key block n (the order
// BwdDqOrder names).
template <class Cfg, class Seq>
__device__ __forceinline__ int bwd_dq_adds_before(int n, int m, const Seq& seq, const BwdKernelParams& p) {
  const BwdSeqOrder o = BwdSeqOrder::of<Cfg>(seq, p);
  int count;
  if (o.order == kDqOrderRotating) {
    // Key block n starts at m0(n) = n M / N; query block m sees first the largest k with
    // m0(k) <= m, then k-1, ..., 0, N-1, ..., k+1.
    const int N = o.n_blocks, M = o.m_blocks;
    const int k = min(N - 1, ((m + 1) * N + M - 1) / M - 1);
    count = (k - n + N) % N;
  } else {
    const BlockRange r = block_range<Cfg::kBlockM, Cfg::kBlockN>(m, seq, p.fwd);
    count = o.order == kDqOrderDecreasing ? r.n_max - 1 - n : n - r.n_min;
  }
  return count;
}

template <class Cfg>
struct BwdLoad {
  using Smem = BwdSmem<Cfg>;
  const BwdKernelParams& p;
  Smem smem;

  template <bool kVarlen>
  __device__ void run(int n_block, int kv_head, const SeqlenInfo<kVarlen>& seq) const {
    if (!hopper::elect_one()) return;
    const FwdKernelParams& f = p.fwd;
    auto& bars = smem.bars();
    hopper::tma_prefetch_map(&f.tma_q);
    hopper::tma_prefetch_map(&p.tma_do);
    const int key_row = seq.k_row0() + n_block * Cfg::kBlockN;
    hopper::mbarrier_arrive_expect_tx(&bars.kv, 2 * Smem::KTile::kBytes);
    hopper::tma_load_tile<typename Smem::KTile>(&f.tma_k, smem.k(), key_row, kv_head, seq.k_batch(f), &bars.kv);
    hopper::tma_load_tile<typename Smem::KTile>(&f.tma_v, smem.v(), key_row, kv_head, seq.k_batch(f), &bars.kv);

    const BwdWalk<Cfg> walk(n_block, kv_head, seq, p);
    constexpr uint32_t kRowBytes = Cfg::kBlockM * sizeof(float);
    constexpr bool kDoRing = Cfg::kDoStages != Cfg::kStages;  // dO and D in a ring of their own
    hopper::PipelineState<Cfg::kStages> st;
    hopper::PipelineState<Cfg::kDoStages> st_do;
    auto cur = walk.begin();
    for (int it = 0; it < walk.steps; ++it, walk.advance(cur)) {
      const int h = cur.head, m = walk.m_block(cur);
      const int64_t row0 = bwd_ws_row0<Cfg::kBlockM>(p, seq, h) + int64_t(m) * Cfg::kBlockM;
      const int q_row = seq.q_row0() + m * Cfg::kBlockM;
      bars.q.producer_acquire(st);
      uint64_t* full = &bars.q.full[st.index];
      hopper::mbarrier_arrive_expect_tx(full, (kDoRing ? 1 : 2) * (Smem::QTile::kBytes + kRowBytes));
      hopper::tma_load_tile<typename Smem::QTile>(&f.tma_q, smem.q(st.index), q_row, h, seq.q_batch(f), full);
      // dO and D go into the Q ring's stage, or (kDoRing) into the dO ring's, whose single stage
      // the consumers free after the step's dV GEMM.
      int do_stage = st.index;
      if constexpr (kDoRing) {
        hopper::ptx::cp_async_bulk(hopper::ptx::space_shared, hopper::ptx::space_global, smem.lse2(st.index),
                                   p.lse2 + row0, kRowBytes, full);
        bars.dout.producer_acquire(st_do);
        full = &bars.dout.full[st_do.index];
        hopper::mbarrier_arrive_expect_tx(full, Smem::QTile::kBytes + kRowBytes);
        do_stage = st_do.index;
        st_do.advance();
      }
      hopper::tma_load_tile<typename Smem::QTile>(&p.tma_do, smem.dout(do_stage), q_row, h, seq.q_batch(f), full);
      if constexpr (!kDoRing)
        hopper::ptx::cp_async_bulk(hopper::ptx::space_shared, hopper::ptx::space_global, smem.lse2(st.index),
                                   p.lse2 + row0, kRowBytes, full);
      hopper::ptx::cp_async_bulk(hopper::ptx::space_shared, hopper::ptx::space_global, smem.delta(do_stage),
                                 p.delta + row0, kRowBytes, full);
      st.advance();
    }
  }
};

}  // namespace fa3::attn
