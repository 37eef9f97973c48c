// Learnable attention sinks (fa3_fwd_params.sinks, gpt-oss): one logit per query head that joins
// every row's softmax denominator without a value row. The online softmax never sees it: a row's
// sum is finished first (finalize), then the sink joins once, so the key loop costs nothing and
// split-KV adds it once, in the combine, instead of once per split.
#pragma once
#include <cmath>

#include "src/attention/fwd_params.h"

namespace fa3::attn {

// A finished row (natural-log LSE, O's factor `scale`) takes the sink's logit into its sum:
// LSE' = log(e^LSE + e^sink), and O = sum_j e^(s_j) V_j / e^(LSE') shrinks by e^(LSE - LSE').
// A row without a visible key (LSE -inf) gets LSE' = sink and O = 0; NaN stays NaN (ternaries,
// where fmaxf would drop it).
__host__ __device__ __forceinline__ void join_sink(float sink, float& scale, float& lse) {
  const float hi = lse > sink ? lse : sink, lo = lse > sink ? sink : lse;
  if (hi == -INFINITY) return;  // no visible key and a sink of -inf: nothing to join
  const float joined = hi + log1pf(expf(lo - hi));
  scale *= expf(lse - joined);
  lse = joined;
}

// The LSE of a row that sees no key: the sink's alone, or -inf without sinks.
__device__ __forceinline__ float empty_row_lse(const FwdKernelParams& p, int head_q) {
  return p.sinks != nullptr ? p.sinks[head_q] : -INFINITY;
}

}  // namespace fa3::attn
