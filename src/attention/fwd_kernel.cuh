// The forward kernel's shell: one producer warpgroup (a TMA warp; with e4m3 operands three more
// warps that transpose V) and kBlockM/64 consumer warpgroups, persistent over tiles; registers move
// from the producer to the consumers.
#pragma once
#include "src/attention/consumer.cuh"
#include "src/attention/fwd_config.h"
#include "src/attention/fwd_features.h"
#include "src/attention/fwd_launch_shape.cuh"
#include "src/attention/fwd_params.h"
#include "src/attention/fwd_smem.cuh"
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
    bars.k.init(Shape::kConsumers);
    if constexpr (Shape::kTransposeV) {
      bars.v.init(VTranspose<Cfg>::kThreads);  // V's readers are the transposer's threads,
      bars.vt.init(Shape::kConsumers, VTranspose<Cfg>::kThreads);  // V^T's writers too
    } else {
      bars.v.init(Shape::kConsumers);
    }
    hopper::mbarrier_init_fence();
  }
  __syncthreads();

  const int wg = hopper::warpgroup_index();
  if (wg == 0) {
    if constexpr (Shape::kMoveRegs) hopper::setmaxnreg_dec<Shape::kProducerRegs>();
    if (threadIdx.x / hopper::kWarpSize == 0) MainloopLoad<Cfg, Feat>{p, smem}.run();
    else if constexpr (Shape::kTransposeV) VTranspose<Cfg>{smem, int(threadIdx.x) - hopper::kWarpSize}.run();
    return;
  }

  if constexpr (Shape::kMoveRegs) hopper::setmaxnreg_inc<Shape::kConsumerRegs>();
  FwdConsumer<Elem, Cfg, Feat>(p, smem, wg - 1, threadIdx.x % hopper::kWarpgroupSize).run();
}

}  // namespace fa3::attn
