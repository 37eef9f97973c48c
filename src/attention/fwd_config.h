// Tile shapes of the forward kernel per head dim (chosen by measurement: docs/perf-log.md).
// Shared memory must fit 227 KB: Q [kBlockM][kHeadDim] + kStages x (K + V) [kBlockN][kHeadDim]
// (+ a separate O staging tile unless O reuses Q's space).  Registers per consumer thread hold
// S (kBlockN/2 floats), P (kBlockN/4 words) and O (kHeadDim/2 floats).
#pragma once

namespace fa3::attn {

template <int kHeadDim_>
struct FwdConfig;

template <>
struct FwdConfig<64> {
  static constexpr int kHeadDim = 64, kBlockM = 128, kBlockN = 128, kStages = 2;
  static constexpr bool kOAliasesQ = false;
};
template <>
struct FwdConfig<96> {
  static constexpr int kHeadDim = 96, kBlockM = 128, kBlockN = 128, kStages = 2;
  static constexpr bool kOAliasesQ = false;
};
template <>
struct FwdConfig<128> {
  static constexpr int kHeadDim = 128, kBlockM = 128, kBlockN = 128, kStages = 2;
  static constexpr bool kOAliasesQ = false;
};
template <>
struct FwdConfig<192> {
  static constexpr int kHeadDim = 192, kBlockM = 128, kBlockN = 112, kStages = 2;
  static constexpr bool kOAliasesQ = true;
};
template <>
struct FwdConfig<256> {
  static constexpr int kHeadDim = 256, kBlockM = 128, kBlockN = 80, kStages = 2;
  static constexpr bool kOAliasesQ = true;
};

// Compile-time switches of the kernel's two scheduling techniques (FlashAttention-3 3.1, 3.2);
// the product runs both, the benchmark's ablation mode turns them off one at a time.
enum Schedule : int {
  kPingpong = 1,  // warpgroups take turns issuing GEMMs so one's softmax hides under the other's
  kOverlap = 2,   // issue QK^T of block n+1 before the softmax of block n, PV of block n under it
  kFullSchedule = kPingpong | kOverlap,
};

}  // namespace fa3::attn
