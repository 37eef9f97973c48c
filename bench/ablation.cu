#include "bench/ablation.h"

#include "src/api/dispatch.h"
#include "src/attention/fwd_launch.cuh"

namespace fa3::bench {

Status run_schedule_ablation(const detail::FwdProblem& f, int sched, cudaStream_t stream) {
  if (f.p->dtype != FA3_DTYPE_BF16 || attn::padded_head_dim(f.p->head_dim_qk) != 128 || f.p->head_dim_v != f.p->head_dim_qk ||
      f.has_mask() || f.varlen_q || f.varlen_k || f.p->softcap != 0.f || detail::hopper_fwd_unsupported_reason(f) != nullptr)
    return detail::not_supported("schedule ablation: only bf16, head dim 128, no mask, softcap or varlen");
  using Product = attn::FwdConfig<128, false>;  // the product's tile at the ablation's shape (s = 8448)
  using Feat = attn::FwdFeatures<false>;
  constexpr int kProduct = Product::kSchedule, kNoOverlap = kProduct & ~attn::kOverlap,
                kPingpongFlipped = kProduct ^ attn::kPingpong;
  switch (sched) {
    case kProduct: return attn::launch_fwd<FA3_DTYPE_BF16, Product, Feat>(f, stream);
    case kNoOverlap: return attn::launch_fwd<FA3_DTYPE_BF16, attn::WithSchedule<Product, kNoOverlap>, Feat>(f, stream);
    case kPingpongFlipped:
      return attn::launch_fwd<FA3_DTYPE_BF16, attn::WithSchedule<Product, kPingpongFlipped>, Feat>(f, stream);
    default:
      return detail::invalid(
          "schedule ablation: sched must be the product's flags, without kOverlap, or with kPingpong flipped");
  }
}

}  // namespace fa3::bench
