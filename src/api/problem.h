// The forward's arguments after validation, with defaults resolved: what every kernel launch reads.
#pragma once
#include <cmath>

#include "fa3/fa3_c.h"

namespace fa3::detail {

struct FwdProblem {
  const fa3_fwd_params* p = nullptr;
  float scale = 0.f;       // softmax scale, default 1/sqrt(head_dim_qk) resolved
  int window_left = -1;    // -1: unbounded
  int window_right = -1;   // -1: unbounded; causal sets 0
  bool varlen_q = false, varlen_k = false, paged = false;
  // The decode path's plan (fwd_dispatch.cpp, split_plan.h): key splits (0: not the decode path)
  // and the query heads packed per tile (pack-GQA).
  int num_splits = 0, pack_group = 1;
  // The backward reads -Q (a negative softmax scale run as |scale|: append_kv.h), so its dQ is the
  // gradient of -Q: the postprocess negates it.
  bool q_negated = false;

  bool has_mask() const { return window_left >= 0 || window_right >= 0; }
};

inline FwdProblem make_problem(const fa3_fwd_params& p) {
  FwdProblem f;
  f.p = &p;
  f.scale = p.softmax_scale != 0.f ? p.softmax_scale : 1.f / std::sqrt(static_cast<float>(p.head_dim_qk));
  // A window that reaches every key of every row is no window (FlashAttention-3's rule too): query
  // i sees keys up to i + seqlen_k - seqlen_q + window_right, so from row 0 window_right >=
  // seqlen_q - 1 reaches the last key, and from the last row window_left >= seqlen_k - 1 the first
  // (per sequence too: varlen lengths are at most these). As -1 such windows run the unmasked
  // kernels, and the kernels' 32-bit edge arithmetic never sees a value like INT32_MAX.
  f.window_left = p.window_left >= p.seqlen_k - 1 ? -1 : p.window_left;
  f.window_right = p.causal ? 0 : p.window_right >= p.seqlen_q - 1 ? -1 : p.window_right;
  f.varlen_q = p.cu_seqlens_q != nullptr || p.seqused_q != nullptr;
  f.varlen_k = p.cu_seqlens_k != nullptr || p.seqused_k != nullptr;
  f.paged = p.page_table != nullptr;
  return f;
}

}  // namespace fa3::detail
