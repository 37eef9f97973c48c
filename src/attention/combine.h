// The combine kernel: merges the partial results of key splits (each split's normalised O and its
// LSE) into O and LSE. The decode path (FwdFeatures::kSplit) runs it on the workspace after the
// split kernel; the layout of every tensor is strided, so any partials (context parallelism,
// cascade attention) can be merged by it.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "fa3/fa3_c.h"
#include "src/api/status.h"

namespace fa3::attn {

// The kernel's parameters (fa3_combine_params, the public description of the same tensors, as the
// kernel reads it).
struct CombineParams {
  // Partials, fp32, element strides. The split's slot of row (b, s, h): o_partial + split * op_split
  // + row offset + h * op_head, with row offset b * op_batch + s * op_row, or (cu_seqlens) the
  // packed row (cu_seqlens[b] + s) * op_row. LSE: natural log; -inf marks a split in which the row
  // sees no key (its O slot is not read).
  const float* o_partial;
  int64_t op_split, op_batch, op_row, op_head;
  const float* lse_partial;
  int64_t lp_split, lp_batch, lp_row, lp_head;
  // Outputs: O in the output dtype (rows addressed as above), LSE (optional, fp32).
  void* out;
  int64_t o_batch, o_row, o_head;
  float* lse;
  int64_t l_batch, l_row, l_head;
  int num_splits;  // <= kMaxCombineSplits
  int batch, seqlen, heads, head_dim;  // seqlen: rows per batch entry (varlen: the longest); head_dim % 4 == 0
  const int* cu_seqlens;  // optional: packed rows
  const int* seqused;     // optional: rows used per batch entry (the others are not written)
  const float* sinks;     // optional: a logit per head joining each row's sum once (sink.cuh)
};

constexpr int kMaxCombineSplits = 128;
constexpr int kMaxCombineHeadDim = 256;

// One combine kernel for validated parameters (out_dtype fp16, bf16 or fp32): the public
// fa3_combine and the decode path's second launch. No allocation, no sync.
Status launch_combine(const fa3_combine_params& p, cudaStream_t stream);

}  // namespace fa3::attn
