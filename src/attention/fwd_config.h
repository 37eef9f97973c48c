// Tile shapes of the forward kernel per head dim (chosen by measurement: docs/perf-log.md).
// Shared memory must fit 227 KB: Q [kBlockM][kHeadDim] + kStages x (K + V) [kBlockN][kHeadDim]
// (+ a separate O staging tile unless O reuses Q's space).  Registers per consumer thread hold
// S (kBlockN/2 floats), P (kBlockN/4 words) and O (kHeadDim/2 floats).
#pragma once

namespace fa3::attn {

// kLongKeys: the variant used when seqlen_k >= kLongKeysThreshold (defaults to the same tile).
template <int kHeadDim_, bool kLongKeys = false>
struct FwdConfig;
template <int kHeadDim_>
struct FwdConfig<kHeadDim_, true> : FwdConfig<kHeadDim_, false> {};
constexpr int kLongKeysThreshold = 8192;

template <>
struct FwdConfig<64, false> {
  static constexpr int kHeadDim = 64, kBlockM = 192, kBlockN = 128, kStages = 2;
  static constexpr bool kOAliasesQ = false;
};
template <>
struct FwdConfig<96, false> {
  static constexpr int kHeadDim = 96, kBlockM = 128, kBlockN = 128, kStages = 2;
  static constexpr bool kOAliasesQ = false;
};
template <>
struct FwdConfig<128, false> {
  static constexpr int kHeadDim = 128, kBlockM = 128, kBlockN = 128, kStages = 2;
  static constexpr bool kOAliasesQ = false;
};
// Long key sequences at d128: a wider key block halves the per-block softmax overhead per FLOP;
// the price (a single Q buffer that also stages O) only shows on short sequences, where 128 wins.
template <>
struct FwdConfig<128, true> {
  static constexpr int kHeadDim = 128, kBlockM = 128, kBlockN = 176, kStages = 2;
  static constexpr bool kOAliasesQ = true;
};
template <>
struct FwdConfig<192, false> {
  static constexpr int kHeadDim = 192, kBlockM = 128, kBlockN = 112, kStages = 2;
  static constexpr bool kOAliasesQ = true;
};
template <>
struct FwdConfig<256, false> {
  static constexpr int kHeadDim = 256, kBlockM = 128, kBlockN = 80, kStages = 2;
  static constexpr bool kOAliasesQ = true;
};

// Compile-time switches of the kernel's two scheduling techniques (FlashAttention-3 3.1, 3.2);
// the product runs both, the benchmark's ablation mode turns them off one at a time.
enum Schedule : int {
  kPingpong = 1,  // warpgroups take turns issuing GEMMs so one's softmax hides under the other's
  kOverlap = 2,   // issue QK^T of block n+1 before the softmax of block n, PV of block n under it
  kLazyRescale = 4,  // rescale O only when a row max grows by > 2^8 (FlashAttention-4); see softmax.cuh
  kFullSchedule = kPingpong | kOverlap | kLazyRescale,  // what the product runs
};

}  // namespace fa3::attn
