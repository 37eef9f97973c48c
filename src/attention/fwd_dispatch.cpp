// Routes a validated forward problem to the Hopper kernel instantiation that serves it.
// Which instantiations exist (CMakeLists.txt, fwd_instance.cu.in, and the registry it writes):
//  - every (dtype, padded head dim, mask) with the head dim's tiles (fwd_config.h);
//  - softcap and/or varlen: each head dim's first tile (FwdConfig<d, false>);
//  - the d_qk 192 / d_v 128 tile (FwdConfigQkV), with and without varlen;
//  - the decode kernel (FwdSplitConfig, FwdFeatures<true, false, true, true>) per dtype at d64,
//    d128 and d256 (e4m3: FwdFp8SplitConfig, per-head descales), for the problems split_plan()
//    sends there (split_plan.h: decodes, explicit splits); its splits need the workspace, one
//    split none;
//  - e4m3 operands (FwdFp8Config: d64, d128, d256, other head dims padded) x mask x varlen x
//    softcap, each with and without block descales (WithBlockDescales).
// Other head-dim pairs run on the tile of the larger padded dim (TMA fills the other's columns
// with zeros and drops O's extra columns). The same walk either launches the instantiation or
// names it (hopper_fwd_instance: the tests check that every instantiation is reached and correct).
#include <algorithm>
#include <numeric>
#include <string>
#include <type_traits>

#include "src/api/dispatch.h"
#include "src/attention/bshd_map.h"
#include "src/attention/fwd_config.h"
#include "src/attention/fwd_launch.h"
#include "src/attention/split_plan.h"

namespace fa3::detail {

using attn::has_block_descales;

// (A negative scale reaches the kernels as |scale| on -Q's copy: append_kv.h.)
const char* hopper_fwd_unsupported_reason(const FwdProblem& f) {
  if (!(f.scale > 0.f)) return "a non-positive softmax_scale";
  return nullptr;
}

namespace {

using attn::FwdFeatures;

// What the walk does with the instantiation it reaches: launch it, or name it as CMakeLists.txt
// names its generated file ("fwd_bf16_d128alt_mtrue_sfalse_vfalse").
struct Launch {
  cudaStream_t stream;
  template <int kDtype, class Cfg, class Feat>
  Status run(const FwdProblem& f, const char*) const {
    return attn::launch_fwd<kDtype, Cfg, Feat>(f, stream);
  }
};
struct Describe {
  std::string* name;
  template <int kDtype, class Cfg, class Feat>
  Status run(const FwdProblem&, const char* tag) const {
    auto flag = [](bool b) { return b ? "true" : "false"; };
    *name = std::string("fwd_") + (kDtype == FA3_DTYPE_BF16 ? "bf16" : kDtype == FA3_DTYPE_E4M3 ? "e4m3" : "fp16") +
            "_" + tag + "_m" +
            flag(Feat::kMasked) + "_s" + flag(Feat::kSoftcap) + "_v" + flag(Feat::kVarlen);
    return Status();
  }
};

// A paged cache is read in boxes of gcd(kBlockN, page_size) rows (mainloop_load.cuh), and small
// boxes cost (pages 256 on the d128 causal tile of 80 keys, boxes of 16: 0.68-0.74 of contiguous,
// 2026-12-01): with pages, the tile whose boxes are larger wins; at equal boxes, the usual rule.
template <int kHeadDim>
bool use_alt_tile_for(const FwdProblem& f, bool masked) {
  using attn::FwdConfig;
  if (f.paged && f.p->page_size % 16 == 0) {  // (gathered pages have no boxes)
    const int alt = std::gcd(FwdConfig<kHeadDim, true>::kBlockN, f.p->page_size);
    const int first = std::gcd(FwdConfig<kHeadDim, false>::kBlockN, f.p->page_size);
    if (alt != first) return alt > first;
  }
  return attn::use_alt_tile(kHeadDim, masked, f.p->seqlen_q, f.p->seqlen_k);
}

template <int kDtype, class Feat, int kHeadDim, class Op>
Status by_tile(const FwdProblem& f, const Op& op) {
  using attn::FwdConfig;
  static const std::string tag = "d" + std::to_string(kHeadDim), alt_tag = tag + "alt";
  // Softcap and varlen have each head dim's first tile only.
  if constexpr (!Feat::kSoftcap && !Feat::kVarlen && attn::has_alt_tile(kHeadDim, Feat::kMasked))
    if (use_alt_tile_for<kHeadDim>(f, Feat::kMasked))
      return op.template run<kDtype, FwdConfig<kHeadDim, true>, Feat>(f, alt_tag.c_str());
  return op.template run<kDtype, FwdConfig<kHeadDim, false>, Feat>(f, tag.c_str());
}

template <int kDtype, class Feat, class Op>
Status by_head_dim(const FwdProblem& f, const Op& op) {
  const int dqk = attn::padded_head_dim(f.p->head_dim_qk), dv = attn::padded_head_dim(f.p->head_dim_v);
  if constexpr (!Feat::kSoftcap)
    if (attn::has_qkv_tile(dqk, dv)) return op.template run<kDtype, attn::FwdConfigQkV<192, 128>, Feat>(f, "d192v128");
  switch (std::max(dqk, dv)) {
    case 64: return by_tile<kDtype, Feat, 64>(f, op);
    case 96: return by_tile<kDtype, Feat, 96>(f, op);
    case 128: return by_tile<kDtype, Feat, 128>(f, op);
    case 192: return by_tile<kDtype, Feat, 192>(f, op);
    default: return by_tile<kDtype, Feat, 256>(f, op);
  }
}

template <int kDtype, bool kMasked, bool kSoftcap, class Op>
Status by_varlen(const FwdProblem& f, const Op& op) {
  return f.varlen_q || f.varlen_k ? by_head_dim<kDtype, FwdFeatures<kMasked, kSoftcap, true>>(f, op)
                                  : by_head_dim<kDtype, FwdFeatures<kMasked, kSoftcap, false>>(f, op);
}

template <int kDtype, bool kMasked, class Op>
Status by_softcap(const FwdProblem& f, const Op& op) {
  return f.p->softcap > 0.f ? by_varlen<kDtype, kMasked, true>(f, op) : by_varlen<kDtype, kMasked, false>(f, op);
}

template <int kDtype, class Op>
Status by_mask(const FwdProblem& f, const Op& op) {
  return f.has_mask() ? by_softcap<kDtype, true>(f, op) : by_softcap<kDtype, false>(f, op);
}

// The decode kernel's tile for the problem's head dims (the larger, padded: d96 on d128, d192 on d256).
int split_head_dim_of(const FwdProblem& f) {
  return attn::split_head_dim(
      std::max(attn::padded_head_dim(f.p->head_dim_qk), attn::padded_head_dim(f.p->head_dim_v)));
}
int split_key_block(int head_dim) {
  return head_dim == 64 ? attn::FwdSplitConfig<64>::kBlockN
                        : head_dim == 128 ? attn::FwdSplitConfig<128>::kBlockN : attn::FwdSplitConfig<256>::kBlockN;
}

// The decode plan (split_plan.h). The SM count (a CUDA call) only for num_splits = 0: the SMs the
// decode grid may take (less sm_margin).
Status decode_plan(const FwdProblem& f, attn::SplitPlan* plan) {
  *plan = {};
  const fa3_fwd_params& a = *f.p;
  if (!attn::takes_decode_path(a)) return Status();
  int sms = 0;
  if (a.num_splits == 0) FA3_TRY(attn::persistent_ctas(a, &sms));
  *plan = attn::split_plan(a, split_key_block(split_head_dim_of(f)), sms);
  return Status();
}

// The decode plan for the workspace the call has. Splits need one (fa3_fwd_workspace_size): an
// explicit num_splits > 1 without it is an error; automatic splits take what fits, down to one
// split, which needs none (the decode kernel then writes O itself).
Status plan_for_workspace(const FwdProblem& f, attn::SplitPlan* plan) {
  const fa3_fwd_params& a = *f.p;
  FA3_TRY(decode_plan(f, plan));
  if (plan->num_splits <= 1) return Status();
  const size_t need = attn::split_workspace(a, plan->num_splits).bytes;
  if (a.workspace != nullptr && a.workspace_bytes >= need) return Status();
  if (a.num_splits > 1)
    return invalid("workspace_bytes must be at least fa3_fwd_workspace_size() = " + std::to_string(need) +
                   " for num_splits " + std::to_string(a.num_splits) + "; got " + std::to_string(a.workspace_bytes) +
                   (a.workspace ? "" : " (workspace NULL)"));
  const size_t fit = a.workspace == nullptr ? 0 : a.workspace_bytes / attn::split_workspace(a, 1).bytes;
  plan->num_splits = static_cast<int>(std::max<size_t>(1, std::min<size_t>(plan->num_splits, fit)));
  return Status();
}

// The decode tile of a head dim: 16-bit, or with e4m3 operands the same tile as an Fp8Tile (V
// transposed by the producer's warps 1-3, as in the FP8 prefill tiles).
template <int kDtype, int kHeadDim>
using SplitTileOf = std::conditional_t<kDtype == FA3_DTYPE_E4M3, attn::FwdFp8SplitConfig<kHeadDim>,
                                      attn::FwdSplitConfig<kHeadDim>>;
template <int kDtype, class Op>
Status by_split_head_dim(const FwdProblem& f, const Op& op) {
  using Feat = FwdFeatures<true, false, true, true>;
  switch (split_head_dim_of(f)) {
    case 64: return op.template run<kDtype, SplitTileOf<kDtype, 64>, Feat>(f, "d64split");
    case 128: return op.template run<kDtype, SplitTileOf<kDtype, 128>, Feat>(f, "d128split");
    default: return op.template run<kDtype, SplitTileOf<kDtype, 256>, Feat>(f, "d256split");
  }
}

// e4m3 operands: the FP8 tiles (fwd_config.h), by padded head dim, block descales, mask and varlen.
template <int kDim, bool kMasked, bool kBlock, bool kAlt = false>
using Fp8TileOf = std::conditional_t<kBlock, attn::WithBlockDescales<attn::FwdFp8Config<kDim, kMasked, kAlt>>,
                                   attn::FwdFp8Config<kDim, kMasked, kAlt>>;
template <class Feat, bool kBlock, class Op>
Status by_fp8_head_dim(const FwdProblem& f, const Op& op) {
  const int dim = attn::fp8_head_dim(
      std::max(attn::padded_head_dim(f.p->head_dim_qk), attn::padded_head_dim(f.p->head_dim_v)));
  // The second tiles (d64: long sequences; d128: long key sequences with per-head descales; d256:
  // short key sequences unmasked, long ones masked), fixed-length batches without softcap only, as
  // the 16-bit second tiles.
  if constexpr (!Feat::kVarlen && !Feat::kSoftcap)
    if (attn::use_fp8_alt_tile(dim, Feat::kMasked, f.p->seqlen_q, f.p->seqlen_k, kBlock)) {
      if (dim == 64)
        return op.template run<FA3_DTYPE_E4M3, Fp8TileOf<64, Feat::kMasked, kBlock, true>, Feat>(
            f, kBlock ? "d64altblk" : "d64alt");
      if (dim == 256)
        return op.template run<FA3_DTYPE_E4M3, Fp8TileOf<256, Feat::kMasked, kBlock, true>, Feat>(
            f, kBlock ? "d256altblk" : "d256alt");
      if constexpr (!kBlock)
        if (dim == 128) return op.template run<FA3_DTYPE_E4M3, Fp8TileOf<128, Feat::kMasked, false, true>, Feat>(f, "d128alt");
      // Anything else has no second tile: the first tiles below (a slower kernel, never a wrong one).
    }
  switch (dim) {
    case 64:
      return op.template run<FA3_DTYPE_E4M3, Fp8TileOf<64, Feat::kMasked, kBlock>, Feat>(f, kBlock ? "d64blk" : "d64");
    case 128:
      return op.template run<FA3_DTYPE_E4M3, Fp8TileOf<128, Feat::kMasked, kBlock>, Feat>(f, kBlock ? "d128blk" : "d128");
    default:
      return op.template run<FA3_DTYPE_E4M3, Fp8TileOf<256, Feat::kMasked, kBlock>, Feat>(f, kBlock ? "d256blk" : "d256");
  }
}
template <bool kBlock, bool kSoftcap, class Op>
Status by_fp8_features(const FwdProblem& f, const Op& op) {
  const bool varlen = f.varlen_q || f.varlen_k;
  if (f.has_mask())
    return varlen ? by_fp8_head_dim<FwdFeatures<true, kSoftcap, true>, kBlock>(f, op)
                  : by_fp8_head_dim<FwdFeatures<true, kSoftcap, false>, kBlock>(f, op);
  return varlen ? by_fp8_head_dim<FwdFeatures<false, kSoftcap, true>, kBlock>(f, op)
                : by_fp8_head_dim<FwdFeatures<false, kSoftcap, false>, kBlock>(f, op);
}
template <class Op>
Status by_fp8(const FwdProblem& f, const Op& op) {
  const bool softcap = f.p->softcap > 0.f;
  if (has_block_descales(*f.p)) return softcap ? by_fp8_features<true, true>(f, op) : by_fp8_features<true, false>(f, op);
  return softcap ? by_fp8_features<false, true>(f, op) : by_fp8_features<false, false>(f, op);
}

template <class Op>
Status dispatch(const FwdProblem& f, const Op& op) {
  if (const char* why = hopper_fwd_unsupported_reason(f)) return not_supported(std::string("hopper kernel: ") + why);
  const int dtype = f.p->dtype;
  attn::SplitPlan plan;
  FA3_TRY(plan_for_workspace(f, &plan));
  if (plan.num_splits > 0) {
    FwdProblem split = f;
    split.num_splits = plan.num_splits;
    split.pack_group = plan.pack_group;
    return dtype == FA3_DTYPE_BF16   ? by_split_head_dim<FA3_DTYPE_BF16>(split, op)
           : dtype == FA3_DTYPE_FP16 ? by_split_head_dim<FA3_DTYPE_FP16>(split, op)
                                     : by_split_head_dim<FA3_DTYPE_E4M3>(split, op);
  }
  if (dtype == FA3_DTYPE_E4M3) return by_fp8(f, op);
  return dtype == FA3_DTYPE_BF16 ? by_mask<FA3_DTYPE_BF16>(f, op) : by_mask<FA3_DTYPE_FP16>(f, op);
}

}  // namespace

Status hopper_fwd(const FwdProblem& f, cudaStream_t stream) { return dispatch(f, Launch{stream}); }

Status hopper_fwd_instance(const FwdProblem& f, std::string* name) { return dispatch(f, Describe{name}); }

Status hopper_fwd_workspace_bytes(const FwdProblem& f, size_t* bytes) {
  *bytes = 0;
  if (hopper_fwd_unsupported_reason(f) != nullptr) return Status();
  attn::SplitPlan plan;
  FA3_TRY(decode_plan(f, &plan));
  if (plan.num_splits > 1) *bytes = attn::split_workspace(*f.p, plan.num_splits).bytes;
  return Status();
}

}  // namespace fa3::detail
