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
// kSplit: the decode path. A tile's key blocks split into num_splits ranges (block_info.cuh), the
//   query heads of a kv head packed into one tile where they fit (pack-GQA, tile_rows.cuh), and each
//   (tile, split) writing fp32 partial O and its LSE into the workspace, which the combine kernel
//   (combine.cu) merges into O. Built on the varlen sequence info (it covers fixed lengths too) and
//   the masked instantiation (it covers unmasked problems too): one decode kernel per head dim.
template <bool kMasked_, bool kSoftcap_ = false, bool kVarlen_ = false, bool kSplit_ = false>
struct FwdFeatures {
  static constexpr bool kMasked = kMasked_, kSoftcap = kSoftcap_, kVarlen = kVarlen_, kSplit = kSplit_;
  static_assert(!kSplit || (kMasked && kVarlen && !kSoftcap), "the decode kernel: masked, varlen, no softcap");
};

}  // namespace fa3::attn
