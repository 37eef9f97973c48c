// The compile-time features of one forward kernel instantiation: what changes its instruction
// stream. Everything that costs nothing in the hot loop (lengths, windows, the softcap value,
// strides) stays a runtime parameter (FwdKernelParams).
#pragma once

namespace fa3::attn {

// kMasked: causal or a sliding window (mask.cuh); without it only the key tail is masked.
// kSoftcap: scores pass through softcap * tanh(s / softcap) once after QK^T, before the mask
//   (score_mod.cuh).
// kVarlen: sequence lengths and offsets per batch entry from cu_seqlens / seqused
//   (seqlen_info.cuh), the varlen tile walk (tile_scheduler.cuh) and O written by a masked direct
//   store, since a TMA store of a sequence's last tile would spill into the next one's rows
//   (epilogue.cuh).
template <bool kMasked_, bool kSoftcap_ = false, bool kVarlen_ = false>
struct FwdFeatures {
  static constexpr bool kMasked = kMasked_, kSoftcap = kSoftcap_, kVarlen = kVarlen_;
};

}  // namespace fa3::attn
