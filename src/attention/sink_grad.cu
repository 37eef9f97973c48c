// The sinks' gradient kernel (sink_grad.h). The reads are 8 bytes per query row and head, a few MB
// at most next to the backward's GEMMs: one CTA per head is enough, and its fixed thread-to-row map
// and reduction tree make the sum the same on every run.
#include <cmath>

#include "src/attention/sink_grad.h"
#include "src/hopper/launch.h"

namespace fa3::attn {
namespace {

constexpr int kThreads = 512;

__global__ void __launch_bounds__(kThreads) sink_grad_kernel(const SinkGradParams p) {
  const int h = blockIdx.x;
  const float sink_log2 = p.sinks[h] * 1.4426950408889634f;
  float acc = 0.f;
  for (int b = 0; b < p.batch; ++b) {
    const int row0 = p.cu_seqlens_q ? p.cu_seqlens_q[b] : 0;
    const int len = p.seqused_q ? p.seqused_q[b] : p.cu_seqlens_q ? p.cu_seqlens_q[b + 1] - row0 : p.seqlen_q;
    const int64_t base = !p.api_layout       ? p.ws_rows.row0(b, h, row0)
                         : p.cu_seqlens_q ? int64_t(h) * p.total_q + row0
                                          : (int64_t(b) * p.heads_q + h) * p.seqlen_q;
    for (int r = threadIdx.x; r < len; r += kThreads) {
      const float lse_log2 = p.lse[base + r] * p.lse_to_log2;
      // LSE -inf only where a row sees no key and the sink is -inf too: P_sink is 0 there (D is 0).
      if (lse_log2 != -INFINITY) acc += exp2f(sink_log2 - lse_log2) * p.delta[base + r];
    }
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, off);
  __shared__ float warp_sums[kThreads / 32];
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = acc;
  __syncthreads();
  if (threadIdx.x < 32) {
    float s = threadIdx.x < kThreads / 32 ? warp_sums[threadIdx.x] : 0.f;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
    if (threadIdx.x == 0) p.dsinks[h] = -s;
  }
}

}  // namespace

Status launch_sink_grad(const SinkGradParams& p, cudaStream_t stream) {
  return hopper::launch<sink_grad_kernel>(p.heads_q, kThreads, 0, stream, p);
}

}  // namespace fa3::attn
