// The forward kernel's shell: one producer warpgroup (a TMA warp) and kBlockM/64 consumer
// warpgroups, persistent over tiles; registers move from the producer to the consumers.
#pragma once
#include "src/attention/epilogue.cuh"
#include "src/attention/fwd_config.h"
#include "src/attention/fwd_params.h"
#include "src/attention/fwd_smem.cuh"
#include "src/attention/mainloop_load.cuh"
#include "src/attention/mainloop_mma.cuh"
#include "src/attention/tile_scheduler.cuh"

namespace fa3::attn {

template <class Cfg>
struct FwdLaunchShape {
  static constexpr int kConsumers = Cfg::kBlockM / 64;
  static constexpr int kThreads = (kConsumers + 1) * hopper::kWarpgroupSize;
  // Registers move from the TMA warpgroup to the consumers (FlashAttention-3's budgets). The
  // consumers' setmaxnreg.inc draws only on what this CTA's warps released, not on the SM's
  // unallocated registers, so from the launch share (65536 / threads, rounded down to 8) the
  // producer must release at least what the consumers take: 32 / 240 with 2 consumers hung.
  static constexpr int kLaunchRegs = 65536 / kThreads / 8 * 8;
  static constexpr int kProducerRegs = kConsumers == 2 ? 24 : 32;
  static constexpr int kConsumerRegs = kConsumers == 2 ? 240 : 160;
  static_assert(kLaunchRegs - kProducerRegs >= (kConsumerRegs - kLaunchRegs) * kConsumers,
                "setmaxnreg.inc would wait forever for registers");
};

template <class Elem, class Cfg, bool kMasked>
__global__ void __launch_bounds__(FwdLaunchShape<Cfg>::kThreads, 1) fwd_kernel(const __grid_constant__ FwdKernelParams p) {
  using Shape = FwdLaunchShape<Cfg>;
  extern __shared__ uint8_t smem_raw[];
  const FwdSmem<Cfg> smem(smem_raw);
  auto& bars = smem.bars();
  if (threadIdx.x == 0) {
    bars.q.init(Shape::kConsumers);
    bars.k.init(Shape::kConsumers);
    bars.v.init(Shape::kConsumers);
    hopper::mbarrier_init_fence();
  }
  __syncthreads();

  const int wg = hopper::warpgroup_index();
  if (wg == 0) {
    hopper::setmaxnreg_dec<Shape::kProducerRegs>();
    if (threadIdx.x / hopper::kWarpSize == 0) MainloopLoad<Cfg, kMasked>{p, smem}.run();
    return;
  }

  hopper::setmaxnreg_inc<Shape::kConsumerRegs>();
  const int consumer = wg - 1, thread = threadIdx.x % hopper::kWarpgroupSize;
  using Mainloop = MainloopMma<Elem, Cfg, kMasked>;
  using Softmax = typename Mainloop::Softmax;
  Mainloop mainloop{p, smem, consumer, thread};
  const Epilogue<Elem, Cfg> epilogue{p, smem, consumer, thread};
  mainloop.start_turns();
  hopper::PipelineState<FwdSmem<Cfg>::kQStages> q_st;
  // Q's buffer goes back to the producer once this warpgroup no longer reads it.
  auto release_q = [&] {
    if (thread == 0) bars.q.consumer_release(q_st);
  };
  if constexpr (Mainloop::kCrossTile) {
    // One stream of key blocks across this CTA's tiles (the next tile's Q is in the second buffer).
    // next_tile: the CTA's next tile with at least one visible key; tiles without any get their
    // zeros on the way (the producer skips them as well).
    int step = 0;
    auto next_tile = [&](WorkTile& w, BlockRange& r) {
      while (tile_at_step(step++, blockIdx.x, gridDim.x, p, w)) {
        r = block_range<Cfg::kBlockM, Cfg::kBlockN>(w.m_block, p);
        if (!r.empty()) return true;
        epilogue.store_zero(w);
      }
      return false;
    };
    WorkTile w;
    BlockRange r;
    if (next_tile(w, r)) {
      float o[Cfg::kHeadDim / 2], s[Cfg::kBlockN / 2];
      uint32_t pa[Cfg::kBlockN / 16][4];
      Softmax softmax(p.scale_log2);
      bars.q.consumer_wait(q_st);
      mainloop.begin_tile(w.m_block, r, q_st.index, o, s, pa, softmax);
      for (;;) {
        mainloop.middle_blocks(w.m_block, r, q_st.index, o, s, pa, softmax);
        release_q();
        q_st.advance();
        WorkTile w_next;
        BlockRange r_next;
        if (!next_tile(w_next, r_next)) {
          mainloop.end_tile(o, pa);
          epilogue.store(w, o, softmax, epilogue.own_staging(), Cfg::kBlockM);
          break;
        }
        bars.q.consumer_wait(q_st);
        mainloop.end_tile_start_next(q_st.index, o, s, pa);
        epilogue.store(w, o, softmax, epilogue.own_staging(), Cfg::kBlockM);  // under the next tile's first QK^T
        softmax = Softmax(p.scale_log2);
        mainloop.next_first_softmax(w_next.m_block, r_next, s, pa, softmax);
#pragma unroll
        for (int i = 0; i < Cfg::kHeadDim / 2; ++i) o[i] = 0.f;
        w = w_next;
        r = r_next;
      }
    }
  } else {
    WorkTile w;
    BlockRange r;
    for (int step = 0; tile_at_step(step, blockIdx.x, gridDim.x, p, w); ++step) {
      r = block_range<Cfg::kBlockM, Cfg::kBlockN>(w.m_block, p);
      if (r.empty()) {
        epilogue.store_zero(w);
        continue;
      }
      bars.q.consumer_wait(q_st);
      float o[Cfg::kHeadDim / 2];
      Softmax softmax(p.scale_log2);
      mainloop.run(w.m_block, r, q_st.index, o, softmax, release_q);
      if constexpr (Cfg::kOInKV) {
        // No room for an O tile: the last key block's stages, kept from the producer, take the
        // two warpgroups' O (K's for consumer 0, V's for 1) once both warpgroups' GEMMs are done;
        // they go back from the next tile's begin (MainloopMma::kept). The next Q does not wait.
        hopper::named_barrier_sync(kBarOInKV, 2 * hopper::kWarpgroupSize);
        uint8_t* staging = consumer == 0 ? smem.k(mainloop.k_last.index) : smem.v(mainloop.v_last.index);
        epilogue.store(w, o, softmax, staging, 64);
        mainloop.kept = true;
      } else {
        epilogue.store(w, o, softmax, epilogue.own_staging(), Cfg::kBlockM);
      }
      q_st.advance();
    }
  }
  epilogue.drain();
}

}  // namespace fa3::attn
