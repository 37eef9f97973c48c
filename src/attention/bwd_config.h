// Tile shapes of the Hopper backward. A CTA owns one block of kBlockN keys (its K and V stay in
// shared memory, its dK and dV in registers) and walks the query blocks of kBlockM rows that see
// them, with two consumer warpgroups.
// Register budget per consumer thread (232): the step's two accumulators S^T and dP^T, dK and dV,
// a dQ part or slice (64 x 64 fp32: 32 registers), the bf16 fragments of P and dS.
//  - d64, d128 (BwdConfig, rows are keys): 128 keys per CTA, 64 per warpgroup, each warpgroup all
//    of the head dim (dK and dV 64 x d each: d128 takes 128 registers, d64 64). d64 takes 128
//    queries a step (S^T and dP^T 64 registers each), d128 64: per step, the waits, the dS^T
//    barrier and the dQ hand-over are paid once for twice the GEMM work, and S^T / dP^T's wgmmas
//    (N = 128) read 96 bytes of shared memory a clock instead of 128 (perf-log step 106).
//  - d256 (BwdQueryRowsConfig, rows are queries): 64 x 256 dK and dV would take 256 registers, so
//    the warpgroups split the keys of S and dP and the head dims of the gradients.
#pragma once

namespace fa3::attn {

template <int kHeadDim_>
struct BwdConfig {
  static_assert(kHeadDim_ == 64 || kHeadDim_ == 128, "the keys-as-rows backward tile serves head dims 64 and 128");
  static constexpr int kHeadDim = kHeadDim_;  // padded; Q/K and V/dO tiles share it (TMA zero-fills)
  static constexpr int kBlockN = 128;         // keys per CTA
  static constexpr int kBlockM = kHeadDim == 64 ? 128 : 64;  // queries per step
  static constexpr int kStages = 2;           // Q, dO, LSE2 and D ring
  static constexpr int kDoStages = kStages;   // dO and D share the Q ring's stages
  static constexpr int kWgKeys = kBlockN / 2;  // S^T / dP^T / dK / dV rows of a warpgroup
  // dQ = dS K of a query block (kBlockM x d) is computed in 64 x 64 parts, one per warpgroup and
  // step: d128's two column blocks (64 columns of K: one panel), d64's two row blocks (64 queries
  // of dS: one panel of dS^T). Part c sits at c * 64 * 64 floats in the block's accumulator tile
  // either way (dq_accum_index: 64-row blocks of d / 64 parts).
  static constexpr int kDqParts = (kBlockM / 64) * (kHeadDim / 64);
  static_assert(kDqParts == 2, "a dQ part per warpgroup and step");
  static constexpr bool kDqRowParts = kBlockM == 128;  // the parts split the queries (else the columns)
  // Staging buffers per warpgroup for the dQ writer (a ring): two let the warpgroup write the next
  // part while the writer's bulk copy still reads the last; d64's 128-query tile has room for one
  // (its dS^T buffers are twice d128's), read by the writer long before the next step's part.
  static constexpr int kDqBuffers = kBlockM == 128 ? 1 : 2;
  static constexpr bool kQueryRows = false;  // rows of S / dP are keys (S^T = K Q^T)
  static constexpr bool kPTile = false;      // P^T stays in registers (dV's A operand)
  static constexpr bool kDqWriter = true;    // dQ parts staged for the writer warp's bulk adds
};

// d256: FlashAttention-3's d256 decomposition, rows are queries. A CTA owns 80 keys; warpgroup c
// computes S = Q K^T and dP = dO V^T for all 64 queries of the step and keys 40c..40c+39 (N = 40),
// writes P^T and dS^T to shared memory, and then owns head dims 128c..128c+127 of the transposed
// gradients: dV^T += dO^T P and dK^T += Q^T dS (M = its 128 dims in two m64 blocks, N = 80 keys:
// 2 x 2 x 40 registers), dQ^T = K^T dS^T (two 64 x 64 slices, reduce-added into the workspace from
// registers, the first under dK^T's GEMM). Against the split d tile it replaced (64 keys, rows
// keys, N = 32 / 64) its GEMMs read a quarter less shared memory per FLOP and its dQ leaves no
// staging in shared memory; the dQ adds bound it (perf-log step 88). Shared memory: K, V 40 KB
// each, Q 2 x 32 KB, dO 32 KB, P^T and dS^T 2 x 10 KB each (216 KB). Deterministic mode orders
// the adds by key block with the producer warpgroup's spare warps (bwd_dq_gate.cuh).
template <int kHeadDim_>
struct BwdQueryRowsConfig {
  static_assert(kHeadDim_ == 256, "the query-rows backward tile serves head dim 256");
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockN = 80, kBlockM = 64, kStages = 2, kDoStages = 1;
  static constexpr int kWgKeys = kBlockN / 2;    // S / dP columns of a warpgroup
  static constexpr int kWgDims = kHeadDim / 2;   // dK^T / dV^T / dQ^T rows of a warpgroup
  static constexpr bool kQueryRows = true, kPTile = true, kDqWriter = false;
  static constexpr int kDqBuffers = 1;  // (the staging barriers' type only: nothing is staged)
};

// The padded head dim of the backward tile that serves head dims d_qk and d_v, 0 when none does.
constexpr int bwd_padded_head_dim(int dqk, int dv) {
  const int d = dqk > dv ? dqk : dv;
  return d <= 64 ? 64 : d <= 128 ? 128 : d <= 256 ? 256 : 0;
}

// The query block of the tile that serves padded head dim d (the workspace's rows are rounded to it).
constexpr int bwd_block_m(int d) {
  return d == 64 ? BwdConfig<64>::kBlockM : d == 128 ? BwdConfig<128>::kBlockM : BwdQueryRowsConfig<256>::kBlockM;
}

}  // namespace fa3::attn
