// The forward kernel's threads and their registers: one producer warpgroup and kBlockM/64 consumer
// warpgroups, and what setmaxnreg moves between them.
#pragma once
#include "src/attention/fwd_smem.cuh"
#include "src/hopper/arch.cuh"

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
  // One consumer (the decode tile): 256 threads get every register at launch, no moving them.
  static constexpr bool kMoveRegs = kConsumers > 1;
  // The V transposer's warps (e4m3) and the gather warps: 56 / 224 with 2 consumers, 48 / 152 with
  // 3. The d256 128-key tile's consumers hold S 64 + P 16 + O 128 = 208 registers: at 232 ptxas
  // serialises every wgmma (C7512) and spills P, so they take FlashAttention-3's 240 and the
  // producer 24, where the ldmatrix transposer (v_transpose.cuh) fits with its ring states in
  // local memory (a few words per block; +12-16% at d256 on an H100, perf-log step 112).
  static constexpr bool kTransposeV = FwdSmem<Cfg>::kTransposeV;
  static constexpr int kFragRegs = Cfg::kBlockN / 2 + Cfg::kBlockN * Cfg::kOperandBytes / 8 + Cfg::kHeadDimV / 2;
  static constexpr bool kWideFp8 = kTransposeV && kConsumers == 2 && kFragRegs > 192;
  static constexpr int kProducerRegs =
      kTransposeV ? (kConsumers == 2 ? (kWideFp8 ? 24 : 56) : 48) : kConsumers == 2 ? 24 : 32;
  static constexpr int kConsumerRegs =
      kTransposeV ? (kConsumers == 2 ? (kWideFp8 ? 240 : 224) : 152) : kConsumers == 2 ? 240 : 160;
  static_assert(!kMoveRegs || kLaunchRegs - kProducerRegs >= (kConsumerRegs - kLaunchRegs) * kConsumers,
                "setmaxnreg.inc would wait forever for registers");
};

}  // namespace fa3::attn
