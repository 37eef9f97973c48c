// Tile shapes of the forward kernel per head dim (chosen by measurement: docs/perf-log.md).
// Shared memory must fit 227 KB: Q [kBlockM][kHeadDim] + kStages x (K + V) [kBlockN][kHeadDim]
// (+ a separate O staging tile unless O reuses Q's space).  Registers per consumer thread hold
// S (kBlockN/2 floats), P (kBlockN/4 words) and O (kHeadDim/2 floats).
#pragma once

namespace fa3::attn {

// Compile-time switches of the kernel's scheduling techniques (FlashAttention-3 3.1, 3.2 and two
// of ours); each tile's kSchedule below says which the product runs, the benchmark's ablation mode
// flips one at a time.
enum Schedule : int {
  kPingpong = 1,  // warpgroups take turns issuing GEMMs so one's softmax hides under the other's
  kOverlap = 2,   // issue QK^T of block n+1 before the softmax of block n, PV of block n under it
  kLazyRescale = 4,  // rescale O only when a row max grows by > 2^8 (FlashAttention-4); see softmax.cuh
  kExpUnderPv = 8,   // with kOverlap: the exponentials too run under the PV GEMM (P packed after it)
  kFullSchedule = kPingpong | kOverlap | kLazyRescale | kExpUnderPv,
};

// kAlt selects a head dim's second tile, for the problems use_alt_tile() gives it (defaults to the
// first).  kSchedule is what the product runs with a tile (the ablation removes one flag at a time).
template <int kHeadDim_, bool kAlt = false>
struct FwdConfig;
template <int kHeadDim_>
struct FwdConfig<kHeadDim_, true> : FwdConfig<kHeadDim_, false> {};

// d128: a 176-key block for long key sequences; d64: 128 query rows for short causal/local ones;
// d256: a 64-key block for short key sequences. has_alt_tile: which (head dim, mask) pairs have a
// second tile at all (CMakeLists.txt instantiates those).
constexpr bool has_alt_tile(int head_dim, bool masked) {
  return head_dim == 128 || head_dim == 256 || (head_dim == 64 && masked);
}
inline bool use_alt_tile(int head_dim, bool masked, int seqlen_q, int seqlen_k) {
  if (head_dim == 128) return seqlen_k >= 8192;
  if (head_dim == 64) return masked && seqlen_q < 2048;
  if (head_dim == 256) return seqlen_k < 4096;
  return false;
}

// d64 is softmax-bound (256 MMA FLOPs per exponential): a third consumer warpgroup adds softmax
// throughput, but 192-row tiles waste more of the diagonal on short causal sequences.
template <>
struct FwdConfig<64, false> {
  static constexpr int kHeadDim = 64, kBlockM = 192, kBlockN = 128, kStages = 2;
  static constexpr bool kOAliasesQ = false;
  static constexpr int kSchedule = kFullSchedule;
};
template <>
struct FwdConfig<64, true> {
  static constexpr int kHeadDim = 64, kBlockM = 128, kBlockN = 128, kStages = 2;
  static constexpr bool kOAliasesQ = false;
  static constexpr int kSchedule = kFullSchedule;
};
template <>
struct FwdConfig<96, false> {
  static constexpr int kHeadDim = 96, kBlockM = 128, kBlockN = 128, kStages = 2;
  static constexpr bool kOAliasesQ = false;
  static constexpr int kSchedule = kFullSchedule;
};
// d128 runs without pingpong: once the exponentials overlap the PV GEMM (kExpUnderPv), taking
// turns only delays the GEMMs (2-5% slower at 2k-16k, perf-log step 8).
template <>
struct FwdConfig<128, false> {
  static constexpr int kHeadDim = 128, kBlockM = 128, kBlockN = 128, kStages = 2;
  static constexpr bool kOAliasesQ = false;
  static constexpr int kSchedule = kFullSchedule & ~kPingpong;
};
// Long key sequences at d128: a wider key block cuts the per-block softmax overhead per FLOP by a quarter;
// the price (a single Q buffer that also stages O) only shows on short sequences, where 128 wins.
template <>
struct FwdConfig<128, true> {
  static constexpr int kHeadDim = 128, kBlockM = 128, kBlockN = 176, kStages = 2;
  static constexpr bool kOAliasesQ = true;
  static constexpr int kSchedule = kFullSchedule & ~kPingpong;
};
template <>
struct FwdConfig<192, false> {
  static constexpr int kHeadDim = 192, kBlockM = 128, kBlockN = 112, kStages = 2;
  static constexpr bool kOAliasesQ = true;
  static constexpr int kSchedule = kFullSchedule;
};
template <>
struct FwdConfig<256, false> {
  static constexpr int kHeadDim = 256, kBlockM = 128, kBlockN = 80, kStages = 2;
  static constexpr bool kOAliasesQ = true;
  static constexpr int kSchedule = kFullSchedule;
};
// Short key sequences at d256: 64-key blocks waste less of the last (partial) block and of the
// causal diagonal: +5% at 512, +1-4% at 1k-2k, but 2-4% slower at 8k-16k causal (perf-log step 11).
template <>
struct FwdConfig<256, true> {
  static constexpr int kHeadDim = 256, kBlockM = 128, kBlockN = 64, kStages = 2;
  static constexpr bool kOAliasesQ = true;
  static constexpr int kSchedule = kFullSchedule;
};

}  // namespace fa3::attn
