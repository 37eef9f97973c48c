// Persistent tile scheduler: a grid of (at most) one CTA per SM walks the tiles
// (m_block, head, batch) with a stride of gridDim.x.  Unmasked problems go m_block-fastest so that
// CTAs running at the same time share a head's K/V in L2.  Masked (causal/local) problems go
// longest-first (largest m_block first: bottom-right causal rows see the most keys), so the
// short tiles fill the machine at the end instead of a long one starting last, and snake across
// waves (odd waves reversed): with a plain stride CTA 0 would take the longest tile of every wave
// and finish one whole tile later than the last CTA.
#pragma once
#include "src/attention/fwd_params.h"

namespace fa3::attn {

struct WorkTile {
  int m_block, head, batch;
};

// The linear tile index of this CTA's step-th tile (>= num_tiles: done).
__device__ __forceinline__ int tile_at_step(int step, const FwdKernelParams& p) {
  const int grid = gridDim.x, cta = blockIdx.x;
  return step * grid + ((p.lpt_order && (step & 1)) ? grid - 1 - cta : cta);
}

__device__ __forceinline__ WorkTile decode_tile(int t, const FwdKernelParams& p) {
  if (p.lpt_order) {
    const int bh = t % (p.batch * p.heads_q), m = p.num_m_blocks - 1 - t / (p.batch * p.heads_q);
    return {m, bh % p.heads_q, bh / p.heads_q};
  }
  const int bh = t / p.num_m_blocks;
  return {t % p.num_m_blocks, bh % p.heads_q, bh / p.heads_q};
}

}  // namespace fa3::attn
