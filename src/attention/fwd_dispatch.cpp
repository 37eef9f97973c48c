// Routes a validated forward problem to the Hopper kernel instantiation that serves it.
#include <string>

#include "src/api/dispatch.h"
#include "src/attention/fwd_config.h"
#include "src/attention/fwd_launch.h"

namespace fa3::detail {

const char* hopper_fwd_unsupported_reason(const FwdProblem& f) {
  const fa3_fwd_params& p = *f.p;
  if (p.dtype != FA3_DTYPE_BF16 && p.dtype != FA3_DTYPE_FP16) return "fp8 inputs";
  if (p.head_dim_qk != p.head_dim_v) return "head_dim_v != head_dim_qk";
  if (f.varlen_q || f.varlen_k) return "variable-length batches";
  if (f.paged) return "paged KV";
  if (p.softcap != 0.f) return "softcap";
  if (!(f.scale > 0.f)) return "a non-positive softmax_scale";
  return nullptr;
}

namespace {

template <int kDtype, bool kMasked, int kHeadDim>
Status by_tile(const FwdProblem& f, cudaStream_t stream) {
  using attn::FwdConfig;
  if constexpr (attn::has_alt_tile(kHeadDim, kMasked))
    if (attn::use_alt_tile(kHeadDim, kMasked, f.p->seqlen_q, f.p->seqlen_k))
      return attn::launch_fwd<kDtype, FwdConfig<kHeadDim, true>, kMasked>(f, stream);
  return attn::launch_fwd<kDtype, FwdConfig<kHeadDim, false>, kMasked>(f, stream);
}

template <int kDtype, bool kMasked>
Status by_head_dim(const FwdProblem& f, cudaStream_t stream) {
  switch (attn::padded_head_dim(f.p->head_dim_qk)) {
    case 64: return by_tile<kDtype, kMasked, 64>(f, stream);
    case 96: return by_tile<kDtype, kMasked, 96>(f, stream);
    case 128: return by_tile<kDtype, kMasked, 128>(f, stream);
    case 192: return by_tile<kDtype, kMasked, 192>(f, stream);
    default: return by_tile<kDtype, kMasked, 256>(f, stream);
  }
}

template <int kDtype>
Status by_mask(const FwdProblem& f, cudaStream_t stream) {
  return f.has_mask() ? by_head_dim<kDtype, true>(f, stream) : by_head_dim<kDtype, false>(f, stream);
}

}  // namespace

Status hopper_fwd(const FwdProblem& f, cudaStream_t stream) {
  if (const char* why = hopper_fwd_unsupported_reason(f)) return not_supported(std::string("hopper kernel: ") + why);
  return f.p->dtype == FA3_DTYPE_BF16 ? by_mask<FA3_DTYPE_BF16>(f, stream) : by_mask<FA3_DTYPE_FP16>(f, stream);
}

}  // namespace fa3::detail

namespace fa3::detail {

Status hopper_fwd_schedule(const FwdProblem& f, int sched, cudaStream_t stream) {
  if (f.p->dtype != FA3_DTYPE_BF16 || attn::padded_head_dim(f.p->head_dim_qk) != 128 || f.has_mask() ||
      hopper_fwd_unsupported_reason(f) != nullptr)
    return not_supported("schedule ablation: only bf16, head dim 128, no mask");
  using Product = attn::FwdConfig<128, false>;  // the product's tile at the ablation's shape (s = 8448)
  constexpr int kProduct = Product::kSchedule, kNoOverlap = kProduct & ~attn::kOverlap,
                kPingpongFlipped = kProduct ^ attn::kPingpong;
  switch (sched) {
    case kProduct: return attn::launch_fwd<FA3_DTYPE_BF16, Product, false>(f, stream);
    case kNoOverlap:
      return attn::launch_fwd<FA3_DTYPE_BF16, attn::WithSchedule<Product, kNoOverlap>, false>(f, stream);
    case kPingpongFlipped:
      return attn::launch_fwd<FA3_DTYPE_BF16, attn::WithSchedule<Product, kPingpongFlipped>, false>(f, stream);
    default:
      return invalid("schedule ablation: sched must be the product's flags, without kOverlap, or with kPingpong flipped");
  }
}

}  // namespace fa3::detail
