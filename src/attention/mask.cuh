// Sets invisible scores of one S fragment (64 x kBlockN per warpgroup) to -inf: keys past the
// sequence end, and keys outside the causal/sliding window of each row (bottom-right aligned), the
// sequence's lengths from its SeqlenInfo.
#pragma once
#include <cmath>

#include "src/attention/fwd_params.h"
#include "src/attention/seqlen_info.cuh"
#include "src/hopper/wgmma.cuh"

namespace fa3::attn {

// rows: the queries (indices in the sequence) of this thread's two rows, fragment rows r and r + 8
// (consecutive queries r0, r0 + 8 but for pack-GQA tiles, tile_rows.cuh).
// col0: global key index of this thread's first column in block n (n * kBlockN + 2 * (lane % 4)).
// kBlockN: the fragment's width (a narrow first block's half, or the whole block).
// kRelative: the bounds are taken relative to col0, once per row, so each score costs one compare
// against a constant and one select, and without a left window edge (causal, key tails) the lower
// bound is skipped: +0.5-2% at d64/d128 causal 512-2k, where the softmax is bound by instruction
// issue and diagonal blocks are up to 40% of all; the narrower d192/d256 blocks measured 1.5%
// slower that way and compare global columns against both bounds.
// Where every query row sees at least one key (SeqlenInfo::every_row_sees_a_key), that form
// runs on the FMA pipe instead of the ALU pipe (ISETP + FSEL, two issue cycles each per warp on
// sm_90): t = saturate(col - (hi - 1)) is 0 for a visible score and 1 for a hidden one, and
// s - t * 2^100 leaves visible scores exact and hidden ones so low that exp2 gives 0 against any
// visible row max. A row hidden in a whole block gets a finite max from it, and its exponentials
// of 1 are wiped (correction exp2(-2^100 * scale) = 0) by the first block where the row sees a
// key, which that condition guarantees; the exact -inf form keeps every other problem right.
template <int kBlockN, bool kMasked, bool kRelative, class Seq>
__device__ __forceinline__ void apply_mask(float (&s)[kBlockN / 2], const int (&rows)[2], int col0, const Seq& seq,
                                           const FwdKernelParams& p) {
  const int origin = kRelative ? col0 : 0;  // columns and bounds are measured from here
  int lo[2] = {0, 0}, hi[2] = {seq.seqlen_k(p) - origin, seq.seqlen_k(p) - origin};  // visible: lo <= col < hi
  if constexpr (kMasked) {
    const int offset = seq.seqlen_k(p) - seq.seqlen_q(p) - origin;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (p.window_right >= 0) hi[h] = min(hi[h], rows[h] + offset + p.window_right + 1);
      if (p.window_left >= 0) lo[h] = rows[h] + offset - p.window_left;
    }
  }
  if (!kRelative || (kMasked && p.window_left >= 0)) {
#pragma unroll
    for (int i = 0; i < kBlockN / 2; ++i) {  // fully unrolled: the fragment stays in registers
      const int h = (i >> 1) & 1, col = col0 - origin + hopper::acc_col(i);
      if (col < lo[h] || col >= hi[h]) s[i] = -INFINITY;
    }
  } else if (!kMasked || seq.every_row_sees_a_key(p)) {
    constexpr float kHidden = 1.2676506e30f;  // 2^100
    const float last[2] = {float(hi[0] - 1), float(hi[1] - 1)};  // a row's last visible column
#pragma unroll
    for (int i = 0; i < kBlockN / 2; ++i)
      s[i] = fmaf(__saturatef(float(hopper::acc_col(i)) - last[(i >> 1) & 1]), -kHidden, s[i]);
  } else {
#pragma unroll
    for (int i = 0; i < kBlockN / 2; ++i)
      if (hopper::acc_col(i) >= hi[(i >> 1) & 1]) s[i] = -INFINITY;
  }
}

}  // namespace fa3::attn
