// Routes a validated backward problem to the Hopper backward instantiation that serves it:
// (dtype) x (padded head dim 64 / 128 / 256) x (masked) x (softcap) x (varlen). Head-dim pairs run
// on the tile of the larger padded dim (TMA zero-fills the missing columns, the stores drop them).
#include <string>

#include "src/api/dispatch.h"
#include "src/attention/bwd_config.h"
#include "src/attention/bwd_launch.h"
#include "src/attention/fwd_features.h"

namespace fa3::attn {

BwdWorkspace bwd_workspace_layout(const fa3_fwd_params& a, int block_m, int head_dim_padded) {
  BwdWorkspace w;
  auto align = [](size_t x) { return (x + 255) / 256 * 256; };
  const int m_blocks = (a.seqlen_q + block_m - 1) / block_m;
  w.seqlen_q_rounded = m_blocks * block_m;
  w.rows.heads_q = a.heads_q;
  w.rows.seqlen_q_rounded = w.seqlen_q_rounded;
  w.rows.block_m = block_m;
  w.rows.packed_rows =
      a.cu_seqlens_q ? (int64_t(a.total_q) + int64_t(a.batch) * block_m + block_m - 1) / block_m * block_m : 0;
  const size_t rows = a.cu_seqlens_q ? size_t(a.heads_q) * size_t(w.rows.packed_rows)
                                     : size_t(a.batch) * a.heads_q * w.seqlen_q_rounded;
  w.lse2 = 0;
  w.delta = align(w.lse2 + rows * sizeof(float));
  w.dq_accum = align(w.delta + rows * sizeof(float));
  w.dq_semaphore = align(w.dq_accum + rows * head_dim_padded * sizeof(float));
  w.bytes = align(w.dq_semaphore + rows / block_m * kBwdDqSemaphoreStride * sizeof(int));
  return w;
}

}  // namespace fa3::attn

namespace fa3::detail {

const char* hopper_bwd_unsupported_reason(const FwdProblem& f) {
  const fa3_fwd_params& p = *f.p;
  if (p.dtype != FA3_DTYPE_BF16 && p.dtype != FA3_DTYPE_FP16) return "fp8 inputs";
  if (!(f.scale > 0.f)) return "a non-positive softmax_scale";
  if (attn::bwd_padded_head_dim(p.head_dim_qk, p.head_dim_v) == 0) return "head dims above 256";
  return nullptr;
}

namespace {

template <int kDtype, bool kMasked, bool kSoftcap, bool kVarlen>
Status by_head_dim(const fa3_bwd_params& b, const FwdProblem& f, cudaStream_t stream) {
  using Feat = attn::FwdFeatures<kMasked, kSoftcap, kVarlen>;
  switch (attn::bwd_padded_head_dim(f.p->head_dim_qk, f.p->head_dim_v)) {
    case 64: return attn::launch_bwd<kDtype, attn::BwdConfig<64>, Feat>(b, f, stream);
    case 128: return attn::launch_bwd<kDtype, attn::BwdConfig<128>, Feat>(b, f, stream);
    default: return attn::launch_bwd<kDtype, attn::BwdQueryRowsConfig<256>, Feat>(b, f, stream);
  }
}

template <int kDtype, bool kMasked, bool kVarlen>
Status by_softcap(const fa3_bwd_params& b, const FwdProblem& f, cudaStream_t stream) {
  return f.p->softcap > 0.f ? by_head_dim<kDtype, kMasked, true, kVarlen>(b, f, stream)
                            : by_head_dim<kDtype, kMasked, false, kVarlen>(b, f, stream);
}

// Varlen problems run on the masked kernels whatever their mask: the last key block of a
// sequence masks the keys past it (bwd_mma.cuh), and a window of -1 costs only that.
template <int kDtype>
Status by_mask(const fa3_bwd_params& b, const FwdProblem& f, cudaStream_t stream) {
  if (f.varlen_q || f.varlen_k) return by_softcap<kDtype, true, true>(b, f, stream);
  return f.has_mask() ? by_softcap<kDtype, true, false>(b, f, stream) : by_softcap<kDtype, false, false>(b, f, stream);
}

}  // namespace

size_t hopper_bwd_workspace_bytes(const FwdProblem& f) {
  const int d = attn::bwd_padded_head_dim(f.p->head_dim_qk, f.p->head_dim_v);
  return attn::bwd_workspace_layout(*f.p, attn::bwd_block_m(d), d).bytes;
}

Status hopper_bwd(const fa3_bwd_params& b, const FwdProblem& f, cudaStream_t stream) {
  if (const char* why = hopper_bwd_unsupported_reason(f)) return not_supported(std::string("hopper backward: ") + why);
  return b.fwd.dtype == FA3_DTYPE_BF16 ? by_mask<FA3_DTYPE_BF16>(b, f, stream) : by_mask<FA3_DTYPE_FP16>(b, f, stream);
}

}  // namespace fa3::detail
