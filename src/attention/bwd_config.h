// Tile shapes of the Hopper backward. A CTA owns one block of kBlockN keys (its K and V stay in
// shared memory, its dK and dV in registers) and walks the query blocks of kBlockM rows that see
// them, with two consumer warpgroups; every GEMM with keys as rows has M = 64 per warpgroup.
// Register budget per consumer thread (232): S^T and dP^T, dK and dV, a dQ part (64 x 64 fp32:
// 32 registers), the bf16 P^T fragments.
//  - d64, d128: 128 keys per CTA, 64 per warpgroup, each warpgroup all of the head dim (dK and dV
//    64 x d each: d128 takes 128 registers); d64 with 128-query blocks spilled (S^T and dP^T alone
//    are 128 registers).
//  - d256 ("split d"): 64 x 256 dK and dV would take 256 registers, so the CTA owns 64 keys and the
//    warpgroups split the work: warpgroup c computes S^T and dP^T for queries 32c..32c+31 of the
//    block (N = 32), both write P^T and dS^T to shared memory, and warpgroup c then owns columns
//    128c..128c+127 of dK and dV (GEMMs over all 64 queries from shared memory) and dQ's parts
//    2c and 2c+1 (one dO stage, as FlashAttention-3 keeps at d256). Shared memory: K, V 32 KB
//    each, Q 2 x 32 KB, dO 1 x 32 KB, P^T and dS^T 2 x 8 KB each, dQ staging 2 x 16 KB. Since the
//    query-rows tile below (the default mode's d256), it serves deterministic mode, whose ordered
//    dQ adds need the staging.
#pragma once

namespace fa3::attn {

template <int kHeadDim_>
struct BwdConfig {
  static_assert(kHeadDim_ == 64 || kHeadDim_ == 128 || kHeadDim_ == 256,
                "the Hopper backward has tiles for head dims 64, 128 and 256");
  static constexpr int kHeadDim = kHeadDim_;  // padded; Q/K and V/dO tiles share it (TMA zero-fills)
  static constexpr bool kSplitD = kHeadDim == 256;
  static constexpr int kBlockN = kSplitD ? 64 : 128;  // keys per CTA
  static constexpr int kBlockM = 64;                  // queries per step
  static constexpr int kStages = 2;                   // Q / LSE2 ring (and dO / D where they share it)
  // dO and D: the Q ring's stages, or (split d, for shared memory) a ring of one stage of their own.
  static constexpr int kDoStages = kSplitD ? 1 : kStages;
  // Consumer warpgroup c: the keys of its S^T / dP^T rows and dK / dV rows start at kWgKeyOffset c,
  // the queries of its S^T / dP^T columns at kWgQueryOffset c, its dK / dV columns at kDkvCols c.
  static constexpr int kWgKeyOffset = kSplitD ? 0 : 64;
  static constexpr int kWgQueries = kSplitD ? kBlockM / 2 : kBlockM;
  static constexpr int kWgQueryOffset = kSplitD ? kBlockM / 2 : 0;
  static constexpr int kDkvCols = kSplitD ? kHeadDim / 2 : kHeadDim;
  // dQ = dS K of a query block (64 x d) is computed in parts of 64 x 64 (64 columns of K: one
  // panel): d128 has two, one per warpgroup; d64 has one, taken by the warpgroups in turn (step
  // parity), so both do the same work over two steps; d256 has four, two per warpgroup.
  static constexpr int kDqParts = kHeadDim / 64;
  static constexpr int kDqPartsPerWg = kSplitD ? 2 : 1;
  // Staging buffers per warpgroup for the dQ writer (a ring): two where shared memory allows.
  static constexpr int kDqBuffers = kSplitD ? 1 : 2;
  static constexpr bool kQueryRows = false;     // rows of S / dP are keys (S^T = K Q^T)
  static constexpr bool kPTile = kSplitD;       // P^T goes through shared memory
  static constexpr bool kDqWriter = true;       // dQ parts staged for the writer warp's bulk adds
};

// d256 in the default (non-deterministic) mode: FlashAttention-3's d256 decomposition, rows are
// queries. A CTA owns 80 keys; warpgroup c computes S = Q K^T and dP = dO V^T for all 64 queries of
// the step and keys 40c..40c+39 (N = 40), writes P^T and dS^T to shared memory, and then owns head
// dims 128c..128c+127 of the transposed gradients: dV^T += dO^T P and dK^T += Q^T dS (M = its 128
// dims in two m64 blocks, N = 80 keys: 2 x 2 x 40 registers), dQ^T = K^T dS^T (two 64 x 64 slices,
// reduce-added into the workspace from registers, the first under dK^T's GEMM). Against the split
// d tile its GEMMs read a quarter less shared memory per FLOP (N = 40 / 80 instead of 32 / 64) and
// its dQ leaves no staging in shared memory; the dQ adds bound it (perf-log step 88). Shared memory:
// K, V 40 KB each, Q 2 x 32 KB, dO 32 KB, P^T and dS^T 2 x 10 KB each (216 KB): no room for dQ
// staging, so its adds are unordered and deterministic mode keeps the split d tile.
template <int kHeadDim_>
struct BwdQueryRowsConfig {
  static_assert(kHeadDim_ == 256, "the query-rows backward tile serves head dim 256");
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockN = 80, kBlockM = 64, kStages = 2, kDoStages = 1;
  static constexpr int kWgKeys = kBlockN / 2;    // S / dP columns of a warpgroup
  static constexpr int kWgDims = kHeadDim / 2;   // dK^T / dV^T / dQ^T rows of a warpgroup
  static constexpr bool kSplitD = false, kQueryRows = true, kPTile = true, kDqWriter = false;
  static constexpr int kDqBuffers = 1;  // (the staging barriers' type only: nothing is staged)
};
// The padded head dim of the backward tile that serves head dims d_qk and d_v, 0 when none does.
constexpr int bwd_padded_head_dim(int dqk, int dv) {
  const int d = dqk > dv ? dqk : dv;
  return d <= 64 ? 64 : d <= 128 ? 128 : d <= 256 ? 256 : 0;
}

}  // namespace fa3::attn
