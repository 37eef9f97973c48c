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
  int num_splits = 0;
  int64_t rows = 0;
  int64_t o_elems = 0, lse_elems = 0;
  size_t bytes = 0;
};
inline SplitWorkspace split_workspace(const fa3_fwd_params& a, int num_splits) {
  SplitWorkspace w;
  w.num_splits = num_splits;
  w.rows = a.cu_seqlens_q ? int64_t(a.total_q) : int64_t(a.batch) * a.seqlen_q;
  w.lse_elems = int64_t(num_splits) * a.heads_q * w.rows;
  w.o_elems = w.lse_elems * a.head_dim_v;
  w.bytes = size_t(w.o_elems + w.lse_elems) * sizeof(float);
  return w;
}

// Those partials and the call's O and LSE as fa3_combine's parameters (the combine kernel's one
// description of its tensors).
inline fa3_combine_params combine_params(const fa3_fwd_params& a, const SplitWorkspace& w, const float* o_partial,
                                         const float* lse_partial) {
  fa3_combine_params c{};
  c.struct_size = sizeof(c);
  c.out_dtype = a.out_dtype;
  const int64_t dv = a.head_dim_v, rows = w.rows;
  c.out_partial = o_partial;
  c.out_partial_split_stride = a.heads_q * rows * dv;
  c.out_partial_batch_stride = int64_t(a.seqlen_q) * dv;
  c.out_partial_row_stride = dv;
  c.out_partial_head_stride = rows * dv;
  c.lse_partial = lse_partial;
  c.lse_partial_split_stride = a.heads_q * rows;
  c.lse_partial_batch_stride = a.seqlen_q;
  c.lse_partial_row_stride = 1;
  c.lse_partial_head_stride = rows;
  c.out = a.out;
  c.lse = a.lse;  // [batch][heads_q][seqlen_q], packed Q: [heads_q][total_q]
  c.lse_batch_stride = int64_t(a.heads_q) * a.seqlen_q;
  c.lse_row_stride = 1;
  c.lse_head_stride = a.cu_seqlens_q ? a.total_q : a.seqlen_q;
  c.num_splits = w.num_splits;
  c.batch = a.batch;
  c.seqlen = a.seqlen_q;
  c.heads = a.heads_q;
  c.head_dim = a.head_dim_v;
  c.cu_seqlens = a.cu_seqlens_q;
  c.seqused = a.seqused_q;
  c.sinks = a.sinks;  // joined once per row here, not per split
  return c;
}

}  // namespace fa3::attn
