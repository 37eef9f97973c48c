// The forward kernel's shell: one producer warpgroup (a TMA warp, or two for paged caches' small
// boxes, and two gather warps for pages that are not a multiple of 16 rows; with e4m3 operands
// three more warps that transpose V, or two gather warps and one transposer) and kBlockM/64
// consumer warpgroups,
// persistent over tiles; registers move from the producer to the consumers.
#pragma once
#include "src/attention/consumer.cuh"
#include "src/attention/fwd_config.h"
#include "src/attention/fwd_features.h"
#include "src/attention/fwd_launch_shape.cuh"
#include "src/attention/fwd_params.h"
#include "src/attention/fwd_smem.cuh"
#include "src/attention/kv_gather.cuh"
#include "src/attention/mainloop_load.cuh"
#include "src/attention/v_transpose.cuh"

namespace fa3::attn {

template <class Elem, class Cfg, class Feat>
__global__ void __launch_bounds__(FwdLaunchShape<Cfg>::kThreads, 1) fwd_kernel(const __grid_constant__ FwdKernelParams p) {
  using Shape = FwdLaunchShape<Cfg>;
  extern __shared__ uint8_t smem_raw[];
  const FwdSmem<Cfg> smem(smem_raw);
  auto& bars = smem.bars();
  if (threadIdx.x == 0) {
    bars.q.init(Shape::kConsumers * hopper::kWarpgroupSize);  // every consumer thread releases Q (consumer.cuh)
    // A gathered stage is complete when each lane of its gather warp has arrived (kv_gather.cuh).
    const uint32_t fillers = p.page_gather ? hopper::kWarpSize : 1;
    bars.k.init(Shape::kConsumers * StageReleasers<Cfg, Feat>::kK, fillers);
    if constexpr (Shape::kTransposeV) {
      const uint32_t transposers = VTranspose<Cfg>::threads(p.page_gather);
      bars.v.init(transposers, fillers);  // V's readers are the transposer's threads,
      bars.vt.init(Shape::kConsumers * StageReleasers<Cfg, Feat>::kPv, transposers);  // V^T's writers too
    } else {
      bars.v.init(Shape::kConsumers * StageReleasers<Cfg, Feat>::kPv, fillers);
    }
    for (int s = 0; s < Cfg::kStages; ++s) {
      hopper::mbarrier_init(&bars.posted.k[s], 1);
      hopper::mbarrier_init(&bars.posted.v[s], 1);
    }
    hopper::mbarrier_init_fence();
  }
  __syncthreads();

  const int wg = hopper::warpgroup_index();
  if (wg == 0) {
    if constexpr (Shape::kMoveRegs) hopper::setmaxnreg_dec<Shape::kProducerRegs>();
    const int warp = threadIdx.x / hopper::kWarpSize;
    if constexpr (Shape::kTransposeV) {
      // Pages gathered row by row: warps 1 and 2 gather K and V into their stages as TMA would
      // have written them, and warp 3 transposes the V stages alone. Else warps 1-3 transpose.
      if (warp == 0) MainloopLoad<Cfg, Feat>{p, smem}.run(LoadRole::kAll);
      else if (p.page_gather && warp < 3) KvGather<Cfg>{p, smem}.run(warp == 1);
      else if (p.page_gather) VTranspose<Cfg>{smem, int(threadIdx.x) % hopper::kWarpSize}.run(1);
      else VTranspose<Cfg>{smem, int(threadIdx.x) - hopper::kWarpSize}.run();
    } else {
      // Key blocks that span several pages (pages of 16 are 8 boxes of K and 8 of V per 128 keys,
      // each after its own table entry's load): Q and K on warp 0, V on warp 1, so two lanes issue
      // them; one lane issuing all of them held pages of 16 at 0.51-0.84 of contiguous K/V
      // (perf-log step 95). Otherwise one warp, whose requests reach the TMA unit in the
      // consumers' order (K before V): two warps issuing together made small decodes (b1 x 4k keys,
      // contiguous or pages of 256) 3-5% slower, and pages of 256 on the 80-key tiles (boxes of 16
      // rows, one page a block) 2-8% slower at 4k.
      // (One call site: a second inlined copy of the walk made ptxas spill, in the producer and in
      // the consumers.)
      // Pages that are not a multiple of 16 rows: warps 2 and 3 gather the K and V rows the walkers
      // post (kv_gather.cuh).
      const bool split = p.page_table != nullptr && p.page_size < Cfg::kBlockN;
      if (warp == 0 || (warp == 1 && split))
        MainloopLoad<Cfg, Feat>{p, smem}.run(warp == 1 ? LoadRole::kV : split ? LoadRole::kQk : LoadRole::kAll);
      else if (warp >= 2 && p.page_gather)
        KvGather<Cfg>{p, smem}.run(warp == 2);
    }
    return;
  }

  if constexpr (Shape::kMoveRegs) hopper::setmaxnreg_inc<Shape::kConsumerRegs>();
  FwdConsumer<Elem, Cfg, Feat>(p, smem, wg - 1, threadIdx.x % hopper::kWarpgroupSize).run();
}

}  // namespace fa3::attn
