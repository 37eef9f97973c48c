// Tile shapes of the Hopper backward. A CTA owns one block of kBlockN keys (its K and V stay in
// shared memory, its dK and dV in registers) and walks the query blocks of kBlockM rows that see
// them; two consumer warpgroups own 64 keys each, so every GEMM with keys as rows has M = 64 per
// warpgroup. Register budget per consumer thread (240): S^T and dP^T (64 x kBlockM fp32 each), dK
// and dV (64 x d each), dQ (64 x 64), the bf16 P^T and dS^T fragments: d64 fits 128-query blocks,
// d128 64-query blocks; d64 with 128-query blocks spilled (S^T and dP^T alone are 128 registers).
#pragma once

namespace fa3::attn {

template <int kHeadDim_>
struct BwdConfig {
  static_assert(kHeadDim_ == 64 || kHeadDim_ == 128, "the Hopper backward has tiles for head dims 64 and 128");
  static constexpr int kHeadDim = kHeadDim_;  // padded; Q/K and V/dO tiles share it (TMA zero-fills)
  static constexpr int kBlockN = 128;         // keys per CTA
  static constexpr int kBlockM = 64;          // queries per step
  static constexpr int kStages = 2;           // Q / dO / LSE / D ring
  // dQ = dS K of a query block (64 x d) is computed in parts of 64 x 64 (64 columns of K: one
  // panel): d128 has two, one per warpgroup; d64 has one, taken by the warpgroups in turn (step
  // parity), so both do the same work over two steps.
  static constexpr int kDqParts = kHeadDim / 64;
};
// The padded head dim of the backward tile that serves head dims d_qk and d_v, 0 when none does.
constexpr int bwd_padded_head_dim(int dqk, int dv) {
  const int d = dqk > dv ? dqk : dv;
  return d <= 64 ? 64 : d <= 128 ? 128 : 0;
}

}  // namespace fa3::attn
