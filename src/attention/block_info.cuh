// Which key blocks a query tile visits, and which of them need masking.  Masks are bottom-right
// aligned (FlashAttention): query row i of a sequence sees key j iff
//   i + sk - sq - window_left <= j <= i + sk - sq + window_right   (each side only when bounded),
// with sq, sk the sequence's lengths (SeqlenInfo).
#pragma once
#include "src/attention/fwd_params.h"
#include "src/attention/seqlen_info.cuh"
#include "src/attention/tile_scheduler.cuh"

namespace fa3::attn {

struct BlockRange {
  int n_min, n_max;  // visit n_max-1 down to n_min; empty when n_max <= n_min
  __host__ __device__ __forceinline__ bool empty() const { return n_max <= n_min; }
};

__host__ __device__ __forceinline__ int ceil_div(int a, int b) { return (a + b - 1) / b; }
__host__ __device__ __forceinline__ int floor_div(int a, int b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

// The key blocks that queries [first_query, first_query + queries) of a sequence see (the tile's
// queries inside the sequence: first_query < seqlen_q).
template <int kBlockN, class Seq>
__host__ __device__ __forceinline__ BlockRange block_range_of_queries(int first_query, int queries, const Seq& s,
                                                                      const FwdKernelParams& p) {
  const int offset = s.seqlen_k(p) - s.seqlen_q(p);
  int n_max = ceil_div(s.seqlen_k(p), kBlockN);
  int n_min = 0;
  if (p.window_right >= 0) {  // the tile's last query sees up to key last + offset + right
    const int last = min(first_query + queries, s.seqlen_q(p)) - 1;
    n_max = min(n_max, max(0, floor_div(last + offset + p.window_right, kBlockN) + 1));
  }
  if (p.window_left >= 0)  // the tile's first query sees from key first + offset - left
    n_min = max(0, floor_div(first_query + offset - p.window_left, kBlockN));
  return {n_min, n_max};
}
// Query tile m_block of kBlockM queries.
template <int kBlockM, int kBlockN, class Seq>
__host__ __device__ __forceinline__ BlockRange block_range(int m_block, const Seq& s, const FwdKernelParams& p) {
  return block_range_of_queries<kBlockN>(m_block * kBlockM, kBlockM, s, p);
}
// Fixed-length batches (the tile scheduler's CPU tests).
template <int kBlockM, int kBlockN>
__host__ __device__ __forceinline__ BlockRange block_range(int m_block, const FwdKernelParams& p) {
  return block_range<kBlockM, kBlockN>(m_block, SeqlenInfo<false>(p, 0), p);
}

// The backward's view (rows are keys): the query m-blocks that see at least one key of key block
// n_block, as [n_min, n_max) = [first m-block, one past the last) of a BlockRange.
template <int kBlockM, int kBlockN, class Seq>
__host__ __device__ __forceinline__ BlockRange query_block_range(int n_block, const Seq& s, const FwdKernelParams& p) {
  const int offset = s.seqlen_k(p) - s.seqlen_q(p);
  const int first_key = n_block * kBlockN, last_key = min((n_block + 1) * kBlockN, s.seqlen_k(p)) - 1;
  int first_row = 0, last_row = s.seqlen_q(p) - 1;
  // Row i sees key j iff i + offset - left <= j <= i + offset + right (each side when bounded).
  if (p.window_right >= 0) first_row = max(first_row, first_key - offset - p.window_right);
  if (p.window_left >= 0) last_row = min(last_row, last_key - offset + p.window_left);
  if (last_key < first_key || last_row < first_row) return {0, 0};
  return {first_row / kBlockM, last_row / kBlockM + 1};
}

// Split-KV: split `split` of `num_splits` of a tile's key blocks, contiguous and of equal length
// up to one block (the first splits take the extra blocks); empty when there are fewer blocks than
// splits.
__host__ __device__ __forceinline__ BlockRange split_block_range(const BlockRange& r, int split, int num_splits) {
  const int blocks = max(0, r.n_max - r.n_min), base = blocks / num_splits, extra = blocks % num_splits;
  const int begin = r.n_min + split * base + min(split, extra);
  return {begin, begin + base + (split < extra ? 1 : 0)};
}

// True when some element of key block n is invisible to some query of [first_query, first_query +
// queries): the key tail, the causal/right edge, or the left window edge. Only those blocks pay for
// the mask.
template <int kBlockN, bool kMasked, class Seq>
__device__ __forceinline__ bool block_needs_mask_for_queries(int n, int first_query, int queries, const Seq& s,
                                                             const FwdKernelParams& p) {
  if ((n + 1) * kBlockN > s.seqlen_k(p)) return true;
  if constexpr (kMasked) {
    const int offset = s.seqlen_k(p) - s.seqlen_q(p);
    if (p.window_right >= 0 && (n + 1) * kBlockN - 1 > first_query + offset + p.window_right) return true;
    if (p.window_left >= 0 && n * kBlockN < first_query + queries - 1 + offset - p.window_left) return true;
  }
  return false;
}
// Query tile m_block of kBlockM queries (its rows past seqlen_q included: they are never stored).
template <int kBlockM, int kBlockN, bool kMasked, class Seq>
__device__ __forceinline__ bool block_needs_mask(int n, int m_block, const Seq& s, const FwdKernelParams& p) {
  return block_needs_mask_for_queries<kBlockN, kMasked>(n, m_block * kBlockM, kBlockM, s, p);
}

}  // namespace fa3::attn
