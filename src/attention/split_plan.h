// The decode path's plan (host only, no CUDA call): whether a problem runs on the decode kernel
// (FwdFeatures::kSplit), how many key splits, how many query heads a tile packs. The workspace it
// needs: split_workspace.h.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "fa3/fa3_c.h"
#include "src/attention/combine.h"
#include "src/attention/split_workspace.h"

namespace fa3::attn {

// Pack-GQA: the query heads of a kv head share a 64-row tile when their number divides 64 (the Q
// box is 64 / G queries x G heads, tile_rows.cuh); other ratios keep a tile per query head.
inline int pack_group_for(const fa3_fwd_params& a) {
  const int ratio = a.heads_q / a.heads_kv;
  return ratio > 1 && 64 % ratio == 0 ? ratio : 1;
}

// The number of splits when num_splits = 0. One CTA per SM is what the decode tile's shared memory
// allows, so a (tile, split) is a unit of work of 1/splits of a tile's time, and the call takes
// ceil(tiles * splits / SMs) / splits tiles' times. Where the tiles alone fill 80% of the SMs, no
// split; else the fewest splits within 5% of the best time over 1..128 splits, each split at least
// four key blocks: a split's fixed cost (its Q load, the ring's first fill, its partial rows) must
// stay small against its K/V (b 1 x 4k keys x GQA 32:8 = 8 tiles of 32 blocks: 16 splits of 2
// blocks 0.85 TB/s, 8 splits of 4 blocks 0.94, 4 of 8 0.82; perf-log step 64).
// (FlashAttention-3's rule, the fewest splits within 85% of the best wave efficiency, took 15
// splits for 8 tiles on 132 SMs: 120 CTAs, a wave of 1/15 where 16 splits give 1/16.)
inline int auto_num_splits(int64_t tiles, int key_blocks, int sms) {
  if (tiles <= 0 || sms <= 0 || tiles * 5 >= int64_t(sms) * 4) return 1;
  const int max_splits = std::min<int>(kMaxCombineSplits, key_blocks / 4);
  if (max_splits <= 1) return 1;
  auto time = [&](int s) { return double((tiles * s + sms - 1) / sms) / s; };
  double best = time(1);
  for (int s = 2; s <= max_splits; ++s) best = std::min(best, time(s));
  for (int s = 1; s <= max_splits; ++s)
    if (time(s) <= 1.05 * best) return s;
  return 1;
}

struct SplitPlan {
  int num_splits = 0;  // 0: not the decode path
  int pack_group = 1;
};

// e4m3 with block descales (the WithBlockDescales tiles; the decode tiles take per-head ones only).
inline bool has_block_descales(const fa3_fwd_params& a) {
  return a.q_block_descale.data || a.k_block_descale.data || a.v_block_descale.data;
}

// Decodes (a kv head's query rows, seqlen_q x pack_group, fit two 64-row tiles) and explicit
// num_splits > 1 take the decode path (no softcap there, and for e4m3 no block descales: those
// problems keep their kernels).
inline bool takes_decode_path(const fa3_fwd_params& a) {
  if (a.softcap > 0.f) return false;
  if (a.dtype == FA3_DTYPE_E4M3 && has_block_descales(a)) return false;
  return a.num_splits > 1 || int64_t(a.seqlen_q) * pack_group_for(a) <= 128;
}

// key_block: the decode tile's kBlockN for the problem's head dims; sms is read for num_splits = 0
// only (the dispatch asks the device only then).
inline SplitPlan split_plan(const fa3_fwd_params& a, int key_block, int sms) {
  if (!takes_decode_path(a)) return {};
  const int group = pack_group_for(a), queries = 64 / group;
  const int64_t tiles = int64_t(a.batch) * (a.heads_q / group) * ((a.seqlen_q + queries - 1) / queries);
  const int key_blocks = std::max(1, (a.seqlen_k + key_block - 1) / key_block);
  const int splits = a.num_splits > 0 ? std::min(a.num_splits, key_blocks) : auto_num_splits(tiles, key_blocks, sms);
  return {splits, group};
}

}  // namespace fa3::attn
