// Persistent tile scheduler: a grid of (at most) one CTA per SM; CTA `cta` runs the tiles
// (m_block, head, batch) that tile_at_step() gives for steps 0, 1, 2, ... until it returns false.
// Only the producer warp walks them (its divisions stay off the consumers' issue slots); the
// consumers learn each tile from its note in the Q stage (FwdSmem::TileNote), tiles without a
// visible key included.
//
// Unmasked problems: every tile costs the same; tiles go m_block-fastest with a stride of the
// grid, so CTAs running at the same time share one head's K/V in L2.
//
// Masked (causal) problems: tile m_block sees about m_block + 1 key blocks. Two parts:
//  1. Pairs. Tiles m and M-1-m of one head together always cost about M+1 blocks, so CTAs that
//     take one pair per round stay balanced whatever the order; the pairs go head by head, so the
//     CTAs running at the same time share a few heads' K/V in L2.  (A longest-first walk over all
//     heads at once balanced as well, but streamed every head's K/V through L2 for each wave of
//     m_blocks: 64% L2 hits and 30% of DRAM bandwidth at d128 causal 8k, against 92% and 7% now,
//     and 6-25% slower.)
//  2. The tail, longest first: the pairs that do not fill a round (and mostly one round more,
//     see pair_rounds()) would leave CTAs idle, and an odd M's middle tiles cost half a pair, so
//     these tiles go in decreasing m order, snaking across waves (odd waves reversed), and the
//     shortest tiles fill the gaps at the end.
//
// Varlen problems (VarlenTileWalk below): the lengths live in device memory, so the walk runs on
// the GPU from cu_seqlens / seqused.
#pragma once
#include "src/attention/fwd_params.h"

namespace fa3::attn {

struct WorkTile {
  int m_block, head, batch;
  int split = 0;  // the decode kernel's key split (SplitTileWalk)
};

// Part 1's rounds of pairs (set on the host as FwdKernelParams::pair_rounds). By default all full
// rounds but one, so the tail has two rounds' tiles to balance with. With fewer than four full rounds
// (d256's 128-row tiles on the 16k-token sweep: 3.9) that tail is half the walk, and the tail gives
// up the head-by-head order: every head's K/V went through L2 once per wave of m-blocks (ncu, d256
// causal 512: 257 MB read from DRAM where 201 MB are compulsory). Where the tiles are also short (at
// most 32 m-blocks), so that the DRAM time shows, only the pairs that do not fill a round go to the
// tail: d256 causal 512 +10%, 1k +6%, 2k-4k +0.5-1%; at 16k it cost 2.5% (balance), and with d128's
// 7.8 rounds 2-9%.
// pair_slack(): the rounds kept out of part 1 by that rule; pair_rounds(): part 1's rounds for a slack.
inline int full_pair_rounds(int num_bh, int m_blocks, int grid) { return num_bh * (m_blocks / 2) / grid; }
inline int pair_slack(int num_bh, int m_blocks, int grid) {
  return full_pair_rounds(num_bh, m_blocks, grid) < 4 && m_blocks <= 32 ? 0 : 1;
}
inline int pair_rounds(int num_bh, int m_blocks, int grid, int slack) {
  const int full = full_pair_rounds(num_bh, m_blocks, grid);
  return full > slack ? full - slack : 0;
}

// The tile of CTA `cta` (of `grid`) at its step-th step; false when the CTA has no more steps.
__host__ __device__ inline bool tile_at_step(int step, int cta, int grid, const FwdKernelParams& p, WorkTile& w) {
  const int num_bh = p.batch * p.heads_q, m_blocks = p.num_m_blocks;
  auto set = [&](int bh, int m) {
    w = {m, bh % p.heads_q, bh / p.heads_q};
    return true;
  };
  if (!p.lpt_order) {
    const int t = step * grid + cta;
    if (t >= p.num_tiles) return false;
    return set(t / m_blocks, t % m_blocks);
  }
  // 1. Pairs (i, M-1-i), i < slots, of each head in turn, for p.pair_rounds rounds (pair_rounds()).
  const int slots = m_blocks / 2, rounds = p.pair_rounds;
  if (step < 2 * rounds) {
    const int pair = (step / 2) * grid + cta, bh = pair / slots, i = pair % slots;
    return set(bh, step % 2 == 0 ? m_blocks - 1 - i : i);
  }
  // 2. The tail in decreasing m: head h0 has the band [i0, M-1-i0] of its m_blocks left (its outer
  // pairs were done in part 1), the nh heads after it have all of theirs, and with an odd M every
  // head has its middle tile left.  Each run of rows (consecutive m) has the same heads left.
  const int j = step - 2 * rounds;
  int u = j * grid + (j % 2 ? grid - 1 - cta : cta);
  const int done = rounds * grid, h0 = slots ? done / slots : 0, i0 = slots ? done % slots : 0;
  const int nh = num_bh - 1 - h0;
  auto rows = [&](int n_rows, int top_m, int first_bh, int count) {  // false: u lies past them
    if (u < n_rows * count) return set(first_bh + u % count, top_m - u / count);
    u -= n_rows * count;
    return false;
  };
  const int top_band = m_blocks - 1 - i0;
  if (rows(i0, m_blocks - 1, h0 + 1, nh)) return true;  // above the band
  if (m_blocks % 2 == 0) {
    if (rows(top_band - i0 + 1, top_band, h0, nh + 1)) return true;
  } else {
    const int mid = m_blocks / 2;
    if (rows(top_band - mid, top_band, h0, nh + 1) || rows(1, mid, 0, num_bh) ||
        rows(mid - i0, mid - 1, h0, nh + 1))
      return true;
  }
  return rows(i0, i0 - 1, h0 + 1, nh);  // below the band
}

// Varlen: the sequences in order, in each its heads, in each head its m-blocks as pairs (M-1-i, i)
// of about equal causal cost together (M + 1 blocks), a CTA taking both tiles of a pair on two
// steps (pair j * grid + cta on steps 2j, 2j + 1), as the fixed-length causal order does. As there,
// the CTAs running at the same time work on a few heads, so their K/V stays in L2: a walk in rows of
// equal m-block across all sequences (longest first for causal costs) kept ~130 heads' K/V in
// flight, read it from DRAM for every tile and ran a third slower; without the pairs, causal costs
// falling inside each head left the busiest CTA 15-25% above the average (the CPU test's cost
// model). Steps must come in increasing order (each CTA's do): the walk keeps a cursor on its
// current sequence, so a CTA reads each sequence's length once (one lane, as the producer runs).
struct VarlenTileWalk {
  enum Step : int { kEnd, kTile, kSkip };  // kSkip: the empty second half of an odd head's middle pair
  int batch = -1;     // the current sequence
  int start = 0;      // slot index of its first slot (two per pair)
  int slots = 0;      // its slots: 2 x pairs x heads
  int m_blocks = 0, pairs = 0;

  // The query length of batch entry b (seqused_q / cu_seqlens_q / seqlen_q).
  __host__ __device__ __forceinline__ static int seqlen_q_of(const FwdKernelParams& p, int b) {
    if (p.seqused_q) return p.seqused_q[b];
    if (p.cu_seqlens_q) return p.cu_seqlens_q[b + 1] - p.cu_seqlens_q[b];
    return p.seqlen_q;
  }

  // The tile of this CTA's step `step` (steps in increasing order).
  template <int kBlockM>
  __host__ __device__ __forceinline__ Step tile(int step, int cta, int grid, const FwdKernelParams& p, WorkTile& w) {
    const int slot = 2 * ((step / 2) * grid + cta) + step % 2;
    while (slot >= start + slots) {
      start += slots;
      if (++batch >= p.batch) return kEnd;
      const int len = seqlen_q_of(p, batch);
      m_blocks = len > 0 ? (len + kBlockM - 1) / kBlockM : 0;
      pairs = (m_blocks + 1) / 2;
      slots = 2 * pairs * p.heads_q;
    }
    const int i = slot - start, pair = i / 2, k = pair % pairs;
    const int m = i % 2 == 0 ? m_blocks - 1 - k : k;
    if (i % 2 == 1 && m == m_blocks - 1 - k) return kSkip;
    w = {m, pair / pairs, batch};
    return kTile;
  }
};

// The decode kernel (FwdFeatures::kSplit): tiles (m_block, head, split, batch), m_block fastest,
// then the tile head (a kv head when packed), then the split, so that the CTAs running at the same
// time read one sequence's keys, each split its own part. Decodes have a tile or a few per head;
// every tile costs about the same (its split's share of the keys), so the plain order balances.
// m_block runs over the longest sequence's query tiles (varlen): the producer skips those past a
// shorter one (no rows, nothing to store).
__host__ __device__ __forceinline__ bool split_tile_at_step(int step, int cta, int grid, const FwdKernelParams& p,
                                                            WorkTile& w) {
  int t = step * grid + cta;
  if (t >= p.num_tiles) return false;
  const int heads = p.heads_q / p.pack_group;
  w.m_block = t % p.num_m_blocks;
  t /= p.num_m_blocks;
  w.head = t % heads;
  t /= heads;
  w.split = t % p.num_splits;
  w.batch = t / p.num_splits;
  return true;
}

}  // namespace fa3::attn
