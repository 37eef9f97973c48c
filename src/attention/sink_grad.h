// The gradient of the attention sinks (fa3_fwd_params.sinks, fa3_bwd_params.dsinks). A sink is a
// logit with no value row, so with P_sink = exp(sink - LSE) of each query row and D = rowsum(dO * O):
//   dsink_h = sum over the head's rows of P_sink (dP_sink - D) = -sum exp(sink_h - LSE) D,
// since dP_sink = dO . 0. Nothing of it is in the main kernels (LSE already holds the sink, so their
// P is right); it reads each row's LSE and D once the backward's first kernel wrote D.
#pragma once
#include <cuda_runtime_api.h>

#include "src/api/status.h"
#include "src/attention/bwd_params.h"

namespace fa3::attn {

struct SinkGradParams {
  const float* sinks;  // [heads_q]
  float* dsinks;       // [heads_q], written
  const float* lse;    // per query row: LSE (natural log) or LSE * log2(e), as lse_to_log2 says
  const float* delta;  // per query row: D = rowsum(dO * O), laid out as lse
  float lse_to_log2;   // what turns lse into log2 units: log2(e) for natural log, 1 for LSE2
  int batch, heads_q, seqlen_q, total_q;
  const int* cu_seqlens_q;  // packed queries, or null
  const int* seqused_q;     // queries used per sequence, or null
  // Where (sequence b, head h)'s rows start in lse and delta: the API's LSE layout ([batch][heads_q]
  // [seqlen_q], packed: [heads_q][total_q]) when api_layout, else the Hopper backward's workspace rows.
  bool api_layout;
  BwdWorkspaceRows ws_rows;
};

// The parameters from the backward's arguments and the rows a backward wrote: lse (in natural log
// when lse_to_log2 is log2(e), LSE2 when 1) and D; ws_rows: where they lie in the Hopper backward's
// workspace, or null for the API's LSE layout (the reference backward's).
inline SinkGradParams sink_grad_params(const fa3_bwd_params& b, const float* lse, float lse_to_log2,
                                       const float* delta, const BwdWorkspaceRows* ws_rows) {
  const fa3_fwd_params& a = b.fwd;
  SinkGradParams p{};
  p.sinks = a.sinks;
  p.dsinks = b.dsinks;
  p.lse = lse;
  p.delta = delta;
  p.lse_to_log2 = lse_to_log2;
  p.batch = a.batch;
  p.heads_q = a.heads_q;
  p.seqlen_q = a.seqlen_q;
  p.total_q = a.total_q;
  p.cu_seqlens_q = a.cu_seqlens_q;
  p.seqused_q = a.seqused_q;
  p.api_layout = ws_rows == nullptr;
  if (ws_rows != nullptr) p.ws_rows = *ws_rows;
  return p;
}

// One CTA per query head, each summing its rows in a fixed order: bitwise reproducible. No
// allocation, no sync.
Status launch_sink_grad(const SinkGradParams& p, cudaStream_t stream);

}  // namespace fa3::attn
