// The producer warp: for every tile of this CTA, TMA-loads Q once and streams K/V blocks through
// the stage rings, in the order the consumers use them (K of block n-1 before V of block n, since
// the consumers' QK^T runs one block ahead of their PV).  One elected lane issues every copy.
#pragma once
#include "src/attention/block_info.cuh"
#include "src/attention/fwd_smem.cuh"
#include "src/attention/tile_scheduler.cuh"
#include "src/hopper/tma.cuh"

namespace fa3::attn {

template <class Cfg, bool kMasked>
struct MainloopLoad {
  using Smem = FwdSmem<Cfg>;
  static constexpr int kConsumers = Cfg::kBlockM / 64;
  static constexpr int kQEmptyThreads = hopper::kWarpSize + kConsumers * hopper::kWarpgroupSize;

  const FwdKernelParams& p;
  Smem smem;

  __device__ __forceinline__ void load_tile(const CUtensorMap* map, uint8_t* dst, int panel_bytes, int row, int head,
                                            int batch, uint64_t* bar) const {
#pragma unroll
    for (int pn = 0; pn < Smem::kPanels; ++pn)
      hopper::tma_load_4d(dst + pn * panel_bytes, map, pn * 64, row, head, batch, bar);
  }

  __device__ __forceinline__ void load_kv(const CUtensorMap* map, hopper::PipelineBarriers<Cfg::kStages>& ring,
                                          hopper::PipelineState<Cfg::kStages>& st, uint8_t* (Smem::*stage)(int) const,
                                          int n, int kv_head, int batch) const {
    ring.producer_acquire(st);
    hopper::mbarrier_arrive_expect_tx(&ring.full[st.index], Smem::kKVBytes);
    load_tile(map, (smem.*stage)(st.index), Smem::kKVPanelBytes, n * Cfg::kBlockN, kv_head, batch, &ring.full[st.index]);
    st.advance();
  }

  // Run by the whole producer warp (the Q-empty barrier is warp-granular).
  __device__ void run() const {
    const bool leader = hopper::elect_one();
    auto& bars = smem.bars();
    hopper::PipelineState<Cfg::kStages> k_st, v_st;
    if (leader) {
      hopper::tma_prefetch_map(&p.tma_q);
      hopper::tma_prefetch_map(&p.tma_k);
      hopper::tma_prefetch_map(&p.tma_v);
    }
    for (int t = blockIdx.x; t < p.num_tiles; t += gridDim.x) {
      const WorkTile w = decode_tile(t, p);
      const BlockRange r = block_range<Cfg::kBlockM, Cfg::kBlockN>(w.m_block, p);
      if (r.empty()) continue;  // the consumers write zeros without touching smem
      const int kv_head = w.head / p.head_ratio;
      // The first K block does not depend on Q's buffer: start it before waiting for Q to drain.
      if (leader) load_kv(&p.tma_k, bars.k, k_st, &Smem::k, r.n_max - 1, kv_head, w.batch);
      __syncwarp();
      hopper::named_barrier_sync(kBarQEmpty, kQEmptyThreads);
      if (leader) {
        hopper::mbarrier_arrive_expect_tx(&bars.q_full, Smem::kQBytes);
        load_tile(&p.tma_q, smem.q(), Smem::kQPanelBytes, w.m_block * Cfg::kBlockM, w.head, w.batch, &bars.q_full);
        for (int n = r.n_max - 2; n >= r.n_min; --n) {
          load_kv(&p.tma_k, bars.k, k_st, &Smem::k, n, kv_head, w.batch);
          load_kv(&p.tma_v, bars.v, v_st, &Smem::v, n + 1, kv_head, w.batch);
        }
        load_kv(&p.tma_v, bars.v, v_st, &Smem::v, r.n_min, kv_head, w.batch);
      }
      __syncwarp();
    }
  }
};

}  // namespace fa3::attn
