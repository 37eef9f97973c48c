// The producer warp: walks this CTA's tiles (tile_scheduler.cuh) and, for each, TMA-loads Q once,
// with a note that tells the consumers which tile it is (FwdSmem::TileNote), and streams K/V blocks
// through the stage rings in the order the consumers use them (K of block n-1 before V of block n,
// since the consumers' QK^T runs one block ahead of their PV).  One elected lane issues every copy.
#pragma once
#include "src/attention/block_info.cuh"
#include "src/attention/fwd_smem.cuh"
#include "src/attention/tile_scheduler.cuh"
#include "src/hopper/tma.cuh"

namespace fa3::attn {

template <class Cfg, bool kMasked>
struct MainloopLoad {
  using Smem = FwdSmem<Cfg>;

  const FwdKernelParams& p;
  Smem smem;

  __device__ __forceinline__ void load_tile(const CUtensorMap* map, uint8_t* dst, int panel_bytes, int row, int head,
                                            int batch, uint64_t* bar) const {
#pragma unroll
    for (int pn = 0; pn < Smem::kPanels; ++pn)
      hopper::tma_load_4d(dst + pn * panel_bytes, map, pn * 64, row, head, batch, bar);
  }

  struct NoNote {
    __device__ __forceinline__ void operator()(int) const {}
  };
  // Waits for a free buffer of the ring, then loads rows [row, row + rows) of one head into it.
  // `note(stage)` runs once the buffer is free and before the arrival that publishes it (Q's note).
  template <int kRing, class Note = NoNote>
  __device__ __forceinline__ void load_stage(const CUtensorMap* map, hopper::PipelineBarriers<kRing>& ring,
                                             hopper::PipelineState<kRing>& st, uint8_t* (Smem::*buffer)(int) const,
                                             int tile_bytes, int panel_bytes, int row, int head, int batch,
                                             Note&& note = {}) const {
    ring.producer_acquire(st);
    note(st.index);
    hopper::mbarrier_arrive_expect_tx(&ring.full[st.index], tile_bytes);
    load_tile(map, (smem.*buffer)(st.index), panel_bytes, row, head, batch, &ring.full[st.index]);
    st.advance();
  }
  __device__ __forceinline__ void load_kv(const CUtensorMap* map, hopper::PipelineBarriers<Cfg::kStages>& ring,
                                          hopper::PipelineState<Cfg::kStages>& st, uint8_t* (Smem::*buffer)(int) const,
                                          int n, int kv_head, int batch) const {
    load_stage(map, ring, st, buffer, Smem::kKVBytes, Smem::kKVPanelBytes, n * Cfg::kBlockN, kv_head, batch);
  }

  // Run by one elected lane of the producer warp.
  __device__ void run() const {
    if (!hopper::elect_one()) return;
    auto& bars = smem.bars();
    hopper::PipelineState<Cfg::kStages> k_st, v_st;
    hopper::PipelineState<Smem::kQStages> q_st;
    hopper::tma_prefetch_map(&p.tma_q);
    hopper::tma_prefetch_map(&p.tma_k);
    hopper::tma_prefetch_map(&p.tma_v);
    int step = 0;
    auto next_tile = [&](WorkTile& t, BlockRange& r) {
      return next_visible_tile<Cfg::kBlockM, Cfg::kBlockN>(step, blockIdx.x, gridDim.x, p, t, r);
    };
    auto load_first_k = [&](const WorkTile& t, const BlockRange& r) {
      load_kv(&p.tma_k, bars.k, k_st, &Smem::k, r.n_max - 1, t.head / p.head_ratio, t.batch);
    };
    // Q with the tile's note (fwd_smem.cuh): its step is step - 1, next_tile() having moved past it.
    auto load_q = [&](const WorkTile& t, const BlockRange& r) {
      load_stage(&p.tma_q, bars.q, q_st, &Smem::q, Smem::kQBytes, Smem::kQPanelBytes, t.m_block * Cfg::kBlockM, t.head,
                 t.batch, [&](int stage) { bars.note[stage] = {t.m_block, t.head, t.batch, r.n_min, r.n_max, step - 1}; });
    };
    // After the last tile: a note without Q, whose step is the walk's length.
    auto announce_end = [&] {
      bars.q.producer_acquire(q_st);
      bars.note[q_st.index] = {-1, 0, 0, 0, 0, step - 1};
      hopper::mbarrier_arrive(&bars.q.full[q_st.index]);
    };
    WorkTile w;
    BlockRange r;
    bool more = next_tile(w, r);
    if (more) {
      // The first K block does not depend on Q's buffer: start it before waiting for Q to drain.
      load_first_k(w, r);
      load_q(w, r);
    }
    while (more) {
      const int kv_head = w.head / p.head_ratio;
      for (int n = r.n_max - 2; n >= r.n_min; --n) {
        load_kv(&p.tma_k, bars.k, k_st, &Smem::k, n, kv_head, w.batch);
        load_kv(&p.tma_v, bars.v, v_st, &Smem::v, n + 1, kv_head, w.batch);
      }
      WorkTile w_next;
      BlockRange r_next;
      more = next_tile(w_next, r_next);
      // The next tile's first K block (and Q, given a second buffer) before this tile's last V:
      // with the cross-tile overlap the consumers use them together. A single Q buffer frees only
      // after this tile's last QK^T, and the consumers need the last V first: that Q comes after it.
      if (more) {
        load_first_k(w_next, r_next);
        if constexpr (Smem::kQStages == 2) load_q(w_next, r_next);
      }
      load_kv(&p.tma_v, bars.v, v_st, &Smem::v, r.n_min, kv_head, w.batch);
      if (more && Smem::kQStages == 1) load_q(w_next, r_next);
      w = w_next;
      r = r_next;
    }
    announce_end();
  }
};

}  // namespace fa3::attn
