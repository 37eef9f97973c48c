// Sets invisible scores of one S fragment (64 x kBlockN per warpgroup) to -inf: keys past the
// sequence end, and keys outside the causal/sliding window of each row (bottom-right aligned).
#pragma once
#include <cmath>

#include "src/attention/fwd_params.h"
#include "src/hopper/wgmma.cuh"

namespace fa3::attn {

// row0: this thread's first row (global query index); its second row is row0 + 8.
// col0: global key index of this thread's first column in block n (n * kBlockN + 2 * (lane % 4)).
template <int kBlockN, bool kMasked>
__device__ __forceinline__ void apply_mask(float (&s)[kBlockN / 2], int row0, int col0, const FwdKernelParams& p) {
  int lo[2] = {0, 0}, hi[2] = {p.seqlen_k, p.seqlen_k};  // visible: lo <= col < hi
  if constexpr (kMasked) {
    const int offset = p.seqlen_k - p.seqlen_q;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = row0 + 8 * h;
      if (p.window_right >= 0) hi[h] = min(hi[h], row + offset + p.window_right + 1);
      if (p.window_left >= 0) lo[h] = row + offset - p.window_left;
    }
  }
#pragma unroll
  for (int i = 0; i < kBlockN / 2; ++i) {  // fully unrolled: the fragment stays in registers
    const int h = (i >> 1) & 1, col = col0 + hopper::acc_col(i);
    if (col < lo[h] || col >= hi[h]) s[i] = -INFINITY;
  }
}

}  // namespace fa3::attn
