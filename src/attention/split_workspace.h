// The decode path's workspace (host only): the layout of the partial results the decode kernel
// writes and the combine kernel reads (FwdFeatures::kSplit, combine.h).
#pragma once
#include <cstddef>
#include <cstdint>

#include "fa3/fa3_c.h"
#include "src/attention/combine.h"

namespace fa3::attn {

// The partials in the workspace: O [num_splits][heads_q][rows][head_dim_v] then LSE
// [num_splits][heads_q][rows], fp32, rows = packed Q's rows (total_q) or batch * seqlen_q.
struct SplitWorkspace {
  int num_splits = 0, rows = 0;
  int64_t o_elems = 0, lse_elems = 0;
  size_t bytes = 0;
};
inline SplitWorkspace split_workspace(const fa3_fwd_params& a, int num_splits) {
  SplitWorkspace w;
  w.num_splits = num_splits;
  w.rows = a.cu_seqlens_q ? a.total_q : a.batch * a.seqlen_q;
  w.lse_elems = int64_t(num_splits) * a.heads_q * w.rows;
  w.o_elems = w.lse_elems * a.head_dim_v;
  w.bytes = size_t(w.o_elems + w.lse_elems) * sizeof(float);
  return w;
}

// The combine kernel's view of those partials and of the call's O and LSE.
inline CombineParams combine_params(const fa3_fwd_params& a, const SplitWorkspace& w, const float* o_partial,
                                    const float* lse_partial) {
  CombineParams c{};
  const int64_t dv = a.head_dim_v, rows = w.rows;
  c.o_partial = o_partial;
  c.op_split = a.heads_q * rows * dv;
  c.op_batch = int64_t(a.seqlen_q) * dv;
  c.op_row = dv;
  c.op_head = rows * dv;
  c.lse_partial = lse_partial;
  c.lp_split = a.heads_q * rows;
  c.lp_batch = a.seqlen_q;
  c.lp_row = 1;
  c.lp_head = rows;
  c.out = a.out.data;
  c.o_batch = a.out.batch_stride;
  c.o_row = a.out.row_stride;
  c.o_head = a.out.head_stride;
  c.lse = a.lse;  // [batch][heads_q][seqlen_q], packed Q: [heads_q][total_q]
  c.l_batch = int64_t(a.heads_q) * a.seqlen_q;
  c.l_row = 1;
  c.l_head = a.cu_seqlens_q ? a.total_q : a.seqlen_q;
  c.num_splits = w.num_splits;
  c.batch = a.batch;
  c.seqlen = a.seqlen_q;
  c.heads = a.heads_q;
  c.head_dim = a.head_dim_v;
  c.cu_seqlens = a.cu_seqlens_q;
  c.seqused = a.seqused_q;
  return c;
}

}  // namespace fa3::attn
