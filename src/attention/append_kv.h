// The work before the attention of a forward call, one small kernel: the KV-cache append with
// rotary embedding (fa3_fwd_params: cache_seqlens, k_new / v_new, rotary_cos / rotary_sin,
// rotary_seqlens), left-padded caches (leftpad_k) and a negative softmax scale. It writes the new
// keys (rotated) and values into the cache at each sequence's end, a copy of Q (rotated, and
// negated for a negative scale) and each sequence's key count into the workspace, and for a
// left-padded cache where each sequence's keys start as rows of a packed K (cu_seqlens_k); the
// attention then runs on parameters that point there (attention_params), so every attention kernel
// serves it unchanged. cache_seqlens without new keys or left padding is the attention's seqused_k
// as it is: no kernel, no workspace.
//
// A negative scale: softmax(s Q K^T) = softmax(|s| (-Q) K^T), and -Q is Q with its sign bits
// flipped (exact in every dtype, e4m3 included; (-Q) K^T accumulates the same products negated, so
// the scores are bit for bit those of s Q K^T). The kernels' online softmax tracks each row's
// maximum of the raw scores, which is right for a positive scale only; a sign branch inside them
// cost the 16-bit forward 7-19% even untaken (docs/perf-log.md, step 113), the copy costs a pass
// over Q. The backward (api.cpp) runs the same copy: dK comes out right from -Q, and dQ, the
// gradient of -Q, takes its sign back in the postprocess (FwdProblem::q_negated).
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "fa3/fa3_c.h"
#include "src/api/status.h"

namespace fa3::attn {

// Whether the call has work before its attention (new keys to write, a Q to rotate or negate, or
// the packed rows of a left-padded cache to count).
inline bool has_append(const fa3_fwd_params& a) {
  return a.k_new.data != nullptr || a.rotary_cos != nullptr || a.leftpad_k != nullptr || a.softmax_scale < 0.f;
}

// A left-padded cache read as packed rows (leftpad_k): sequence b's rows start at b x K's batch
// stride in rows (validated a whole number, the same for V; unused with one sequence), and the
// packed rows end with the last sequence's seqlen_k rows.
inline int64_t leftpad_rows_per_batch(const fa3_fwd_params& a) {
  return a.batch > 1 ? a.k.batch_stride / a.k.row_stride : 0;
}
inline int64_t leftpad_total_rows(const fa3_fwd_params& a) {
  return (int64_t(a.batch) - 1) * leftpad_rows_per_batch(a) + a.seqlen_k;
}

// Its share of the workspace, first in it: the key counts (int32 [batch], with new keys or left
// padding: `counts`), the packed keys' starts (int32 [batch + 1], with left padding) and Q's copy
// (rotated and / or negated: contiguous [batch, seqlen_q, heads_q, head_dim_qk] in dtype, or
// [total_q, heads_q, head_dim_qk] for packed queries), each 256-byte aligned;
// the attention's own scratch (split-KV partials, or the backward's) follows at `bytes`.
struct AppendWorkspace {
  size_t seqused = 0, cu_k = 0, q = 0, bytes = 0;
  bool rotate_q = false, negate_q = false, counts = false;
  bool copies_q() const { return rotate_q || negate_q; }
};
AppendWorkspace append_workspace(const fa3_fwd_params& a);

// The attention's parameters after the append (w = append_workspace(a)): seqused_k = the key
// counts in the workspace, cu_seqlens_k = the packed keys' starts (with left padding: K and V read
// as packed rows), q = the copy (with rotary or a negative scale; softmax_scale then |scale|), the
// append's fields cleared, the workspace past the append's share.
fa3_fwd_params attention_params(const fa3_fwd_params& a, const AppendWorkspace& w);

// The append kernel on `stream` (validated parameters whose workspace holds w.bytes).
Status launch_append(const fa3_fwd_params& a, const AppendWorkspace& w, cudaStream_t stream);

}  // namespace fa3::attn
