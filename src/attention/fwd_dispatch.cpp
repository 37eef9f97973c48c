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

template <int kDtype, bool kMasked>
Status by_head_dim(const FwdProblem& f, cudaStream_t stream) {
  constexpr int kSched = attn::kFullSchedule;
  switch (attn::padded_head_dim(f.p->head_dim_qk)) {
    case 64: return attn::launch_fwd<kDtype, 64, kMasked, kSched>(f, stream);
    case 96: return attn::launch_fwd<kDtype, 96, kMasked, kSched>(f, stream);
    case 128:
      if (f.p->seqlen_k >= attn::kLongKeysThreshold) return attn::launch_fwd<kDtype, 128, kMasked, kSched, true>(f, stream);
      return attn::launch_fwd<kDtype, 128, kMasked, kSched>(f, stream);
    case 192: return attn::launch_fwd<kDtype, 192, kMasked, kSched>(f, stream);
    default: return attn::launch_fwd<kDtype, 256, kMasked, kSched>(f, stream);
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
  constexpr int kFull = attn::kFullSchedule, kNoOverlap = kFull & ~attn::kOverlap, kNoPingpong = kFull & ~attn::kPingpong;
  switch (sched) {
    case kFull: return attn::launch_fwd<FA3_DTYPE_BF16, 128, false, kFull>(f, stream);
    case kNoOverlap: return attn::launch_fwd<FA3_DTYPE_BF16, 128, false, kNoOverlap>(f, stream);
    case kNoPingpong: return attn::launch_fwd<FA3_DTYPE_BF16, 128, false, kNoPingpong>(f, stream);
    default: return invalid("schedule ablation: sched must be the product's flags with at most one of pingpong/overlap removed");
  }
}

}  // namespace fa3::detail
