// Which key blocks a query tile visits, and which of them need masking.  Masks are bottom-right
// aligned (FlashAttention): query row i sees key j iff
//   i + sk - sq - window_left <= j <= i + sk - sq + window_right   (each side only when bounded).
#pragma once
#include "src/attention/fwd_params.h"
#include "src/attention/tile_scheduler.cuh"

namespace fa3::attn {

struct BlockRange {
  int n_min, n_max;  // visit n_max-1 down to n_min; empty when n_max <= n_min
  __host__ __device__ __forceinline__ bool empty() const { return n_max <= n_min; }
};

__host__ __device__ __forceinline__ int ceil_div(int a, int b) { return (a + b - 1) / b; }
__host__ __device__ __forceinline__ int floor_div(int a, int b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

template <int kBlockM, int kBlockN>
__host__ __device__ __forceinline__ BlockRange block_range(int m_block, const FwdKernelParams& p) {
  const int offset = p.seqlen_k - p.seqlen_q;
  int n_max = ceil_div(p.seqlen_k, kBlockN);
  int n_min = 0;
  if (p.window_right >= 0) {  // the tile's last row sees up to key last_row + offset + right
    const int last_row = min((m_block + 1) * kBlockM, p.seqlen_q) - 1;
    n_max = min(n_max, max(0, floor_div(last_row + offset + p.window_right, kBlockN) + 1));
  }
  if (p.window_left >= 0)  // the tile's first row sees from key first_row + offset - left
    n_min = max(0, floor_div(m_block * kBlockM + offset - p.window_left, kBlockN));
  return {n_min, n_max};
}

// The CTA's next tile with at least one visible key, from its step `step` on (advanced past it, so
// the tile's own step is step - 1). The producer walks the tiles and passes them on to the consumers
// (FwdSmem::TileNote); those it skips here, the consumers fill with zeros. False when the CTA has no
// more tiles (step - 1 is then the walk's length). (The CPU tests replay it: test_tile_scheduler.cu.)
template <int kBlockM, int kBlockN>
__host__ __device__ __forceinline__ bool next_visible_tile(int& step, int cta, int grid, const FwdKernelParams& p,
                                                           WorkTile& w, BlockRange& r) {
  while (tile_at_step(step++, cta, grid, p, w)) {
    r = block_range<kBlockM, kBlockN>(w.m_block, p);
    if (!r.empty()) return true;
  }
  return false;
}

// True when some element of key block n is invisible to some row of the tile: the key tail,
// the causal/right edge, or the left window edge.  Only those blocks pay for the mask.
template <int kBlockM, int kBlockN, bool kMasked>
__device__ __forceinline__ bool block_needs_mask(int n, int m_block, const FwdKernelParams& p) {
  if ((n + 1) * kBlockN > p.seqlen_k) return true;
  if constexpr (kMasked) {
    const int offset = p.seqlen_k - p.seqlen_q, first_row = m_block * kBlockM;
    if (p.window_right >= 0 && (n + 1) * kBlockN - 1 > first_row + offset + p.window_right) return true;
    if (p.window_left >= 0 && n * kBlockN < first_row + kBlockM - 1 + offset - p.window_left) return true;
  }
  return false;
}

}  // namespace fa3::attn
