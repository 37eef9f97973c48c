// The backward kernel's shell: one CTA per (key block, kv head, sequence), a producer warpgroup
// (warp 0: the TMA lane; warp 1, in deterministic mode warps 1-3: the dQ writer lanes, where the
// tile stages dQ; where it does not, in deterministic mode warps 1-3: the consumers' dQ gate) and
// two consumer warpgroups; registers move from the producer to the consumers as
// in the forward.
#pragma once
#include "src/attention/bwd_config.h"
#include "src/attention/bwd_dq_gate.cuh"
#include "src/attention/bwd_dq_writer.cuh"
#include "src/attention/bwd_load.cuh"
#include "src/attention/bwd_mma.cuh"
#include "src/attention/bwd_mma_query_rows.cuh"
#include "src/attention/bwd_smem.cuh"

namespace fa3::attn {

struct BwdLaunchShape {
  static constexpr int kThreads = 3 * hopper::kWarpgroupSize;
  // The consumers hold dK, dV, S^T, dP^T and P^T; the producer warpgroup runs two lanes (TMA, dQ writer),
  // which spilled at 24 (fixed lengths) and at 32 (varlen d64: the sequence's offsets stay live).
  // (168 - 40) x 128 covers (232 - 168) x 256 exactly.
  static constexpr int kProducerRegs = 40, kConsumerRegs = 232;
  static_assert((168 - kProducerRegs) * 128 >= (kConsumerRegs - 168) * 256, "setmaxnreg budget of one CTA per SM");
};

template <class Elem, class Cfg, class Feat>
__global__ void __launch_bounds__(BwdLaunchShape::kThreads, 1) bwd_kernel(const __grid_constant__ BwdKernelParams p) {
  const SeqlenInfo<Feat::kVarlen> seq(p.fwd, int(blockIdx.z));
  // Varlen: the grid covers the longest sequence's key blocks; a shorter one's CTAs past its keys
  // leave (the whole CTA at once, before any barrier).
  if (Feat::kVarlen && bwd_n_block(p) * Cfg::kBlockN >= seq.seqlen_k(p.fwd)) return;
  extern __shared__ uint8_t smem_raw[];
  const BwdSmem<Cfg> smem(smem_raw);
  auto& bars = smem.bars();
  if (threadIdx.x == 0) {
    hopper::mbarrier_init(&bars.kv, 1);
    bars.q.init(2 * hopper::kWarpgroupSize);  // every consumer thread releases a stage (bwd_mma.cuh)
    if constexpr (Cfg::kDoStages != Cfg::kStages) bars.dout.init(2 * hopper::kWarpgroupSize);
    for (auto& ring : bars.dq)
      for (int b = 0; b < Cfg::kDqBuffers; ++b) {
        hopper::mbarrier_init(&ring.full[b], hopper::kWarpgroupSize);  // a warpgroup's threads stage
        hopper::mbarrier_init(&ring.empty[b], 1);                      // the writer's lane releases
      }
    for (auto& turn : bars.dq_turn) hopper::mbarrier_init(&turn, 1);  // the previous writer arrives
    hopper::mbarrier_arrive(&bars.dq_turn[0]);                         // step 0 goes first
    hopper::mbarrier_init_fence();
  }
  __syncthreads();
  const int n_block = bwd_n_block(p), kv_head = blockIdx.y;
  const int wg = hopper::warpgroup_index();
  if (wg == 0) {
    hopper::setmaxnreg_dec<BwdLaunchShape::kProducerRegs>();
    const int warp = threadIdx.x / hopper::kWarpSize;
    if (warp == 0) BwdLoad<Cfg>{p, smem}.run(n_block, kv_head, seq);
    if constexpr (Cfg::kDqWriter) {
      static_assert(BwdSmem<Cfg>::kDeterministicWriters <= 3, "the writers are warps 1-3 of the producer warpgroup");
      const int writers = p.deterministic ? BwdSmem<Cfg>::kDeterministicWriters : 1;
      if (warp >= 1 && warp <= writers) BwdDqWriter<Cfg>{p, smem}.run(n_block, kv_head, seq, warp - 1, writers);
    } else {
      if (p.deterministic && warp == 1) BwdDqGate<Cfg>{p}.open(n_block, kv_head, seq);
      if (p.deterministic && warp >= 2) BwdDqGate<Cfg>{p}.close(n_block, kv_head, seq, warp - 2);
    }
    return;
  }
  hopper::setmaxnreg_inc<BwdLaunchShape::kConsumerRegs>();
  // Rows are keys (BwdConfig) or queries (BwdQueryRowsConfig: the consumers add dQ themselves).
  using Consumer = std::conditional_t<Cfg::kQueryRows, BwdQueryRowsConsumer<Elem, Cfg, Feat>, BwdConsumer<Elem, Cfg, Feat>>;
  Consumer(p, smem, wg - 1, int(threadIdx.x % hopper::kWarpgroupSize)).run(n_block, kv_head, seq);
}

}  // namespace fa3::attn
