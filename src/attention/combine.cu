// The combine kernel (combine.h). One warp per output row (query, head): the splits' LSEs, a lane
// per split, give the merged LSE = m + log(sum_s exp(lse_s - m)) and each split's weight
// exp(lse_s - LSE); then every lane owns 4 columns (float4 loads, 512 contiguous bytes per split
// and warp) and adds the weighted partial rows. A split of weight 0 (LSE -inf) is skipped, never
// read: its slot may hold anything. Rows whose splits are all empty get O = 0, LSE = -inf, as rows
// without a visible key do in the unsplit kernel. Sinks join each row's merged LSE once (sink.cuh).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <string>
#include <type_traits>

#include "src/api/limits.h"
#include "src/attention/combine.h"
#include "src/attention/sink.cuh"
#include "src/hopper/launch.h"

namespace fa3::attn {
namespace {

constexpr int kWarps = 4;
constexpr int kSplitsPerLane = kMaxCombineSplits / 32;
constexpr int kChunks = kMaxCombineHeadDim / 128;  // 128 columns per warp and chunk
constexpr int kGroup = 8;  // splits whose partial rows are in flight at once (divides 32)

// Four output columns from float4: one 16-byte store (fp32) or two packed pairs in one 8-byte store.
template <class Elem>
__device__ __forceinline__ uint32_t pack2(float a, float b) {
  using Pair = std::conditional_t<std::is_same_v<Elem, __half>, __half2, __nv_bfloat162>;
  Pair h;
  if constexpr (std::is_same_v<Elem, __half>) h = __floats2half2_rn(a, b);
  else h = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<const uint32_t*>(&h);
}
template <class Elem>
__device__ __forceinline__ void store4(Elem* dst, float4 v) {
  if constexpr (std::is_same_v<Elem, float>) *reinterpret_cast<float4*>(dst) = v;
  else *reinterpret_cast<uint2*>(dst) = make_uint2(pack2<Elem>(v.x, v.y), pack2<Elem>(v.z, v.w));
}

template <class Elem>
__global__ void __launch_bounds__(kWarps * 32) combine_kernel(const __grid_constant__ CombineParams p) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int idx = blockIdx.x * kWarps + warp;  // (query, head) of the batch entry, head fastest
  for (int b = blockIdx.y; b < p.batch; b += gridDim.y) {
    const int q0 = p.cu_seqlens ? p.cu_seqlens[b] : 0;
    const int rows = p.seqused ? p.seqused[b] : p.cu_seqlens ? p.cu_seqlens[b + 1] - q0 : p.seqlen;
    if (idx >= rows * p.heads) continue;
    const int s = idx / p.heads, h = idx % p.heads;
    auto row = [&](int64_t batch_stride, int64_t row_stride, int64_t head_stride) {
      return (p.cu_seqlens ? int64_t(q0 + s) * row_stride : int64_t(b) * batch_stride + int64_t(s) * row_stride) +
             int64_t(h) * head_stride;
    };
    const float* lse_in = p.lse_partial + row(p.lp_batch, p.lp_row, p.lp_head);
    float w[kSplitsPerLane], m = -INFINITY;
#pragma unroll
    for (int i = 0; i < kSplitsPerLane; ++i) {
      const int split = 32 * i + lane;
      w[i] = split < p.num_splits ? lse_in[split * p.lp_split] : -INFINITY;
      m = fmaxf(m, w[i]);
    }
#pragma unroll
    for (int o = 16; o > 0; o /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    // A split with keys (finite LSE): the slot the loads of the others read instead of theirs.
    int full_split = 0;
#pragma unroll
    for (int i = kSplitsPerLane - 1; i >= 0; --i) {
      const unsigned has_keys = __ballot_sync(0xffffffffu, w[i] > -INFINITY);
      if (has_keys != 0u) full_split = 32 * i + __ffs(has_keys) - 1;
    }
    float sum = 0.f;
    if (m != -INFINITY) {
#pragma unroll
      for (int i = 0; i < kSplitsPerLane; ++i) sum += expf(w[i] - m);  // exp(-inf) = 0
    }
#pragma unroll
    for (int o = 16; o > 0; o /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    float lse = m == -INFINITY ? -INFINITY : m + logf(sum);
    if (p.sinks != nullptr) {
      float unused = 1.f;
      join_sink(p.sinks[h], unused, lse);
    }
#pragma unroll
    for (int i = 0; i < kSplitsPerLane; ++i) w[i] = m == -INFINITY ? 0.f : expf(w[i] - lse);

    const float* o_in = p.o_partial + row(p.op_batch, p.op_row, p.op_head);
    float4 acc[kChunks];
#pragma unroll
    for (int c = 0; c < kChunks; ++c) acc[c] = make_float4(0.f, 0.f, 0.f, 0.f);
    // kGroup splits' partial rows are loaded before any is added, so that their latencies overlap
    // (a load and its add per split in turn put a latency per split on the warp's path: b 1 x 128k
    // keys, 16 splits, took 10.7 us to combine after a 137-us decode; perf-log step 78). The loads
    // are unpredicated (ptxas interleaved predicated ones with the adds): an empty split's load
    // reads full_split's slot instead, a lane past the head dim its last four columns (neither is
    // stored), so only splits with keys are read, within their rows.
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      if (m == -INFINITY || 128 * c >= p.head_dim) break;
      const int col = min(128 * c + 4 * lane, p.head_dim - 4);
      for (int g = 0; g < p.num_splits; g += kGroup) {
        float wg = w[0];  // the weights of splits g..g+kGroup-1 are lanes of w[g / 32]
#pragma unroll
        for (int i = 1; i < kSplitsPerLane; ++i)
          if (g / 32 == i) wg = w[i];
        float wt[kGroup];
        float4 v[kGroup];
#pragma unroll
        for (int j = 0; j < kGroup; ++j) {
          wt[j] = __shfl_sync(0xffffffffu, wg, (g + j) % 32);
          if (g + j >= p.num_splits) wt[j] = 0.f;
          const int split = wt[j] > 0.f ? g + j : full_split;
          v[j] = *reinterpret_cast<const float4*>(o_in + int64_t(split) * p.op_split + col);
        }
#pragma unroll
        for (int j = 0; j < kGroup; ++j)
          if (wt[j] > 0.f) {
            acc[c].x += wt[j] * v[j].x;
            acc[c].y += wt[j] * v[j].y;
            acc[c].z += wt[j] * v[j].z;
            acc[c].w += wt[j] * v[j].w;
          }
      }
    }
    Elem* out = static_cast<Elem*>(p.out) + row(p.o_batch, p.o_row, p.o_head);
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const int col = 128 * c + 4 * lane;
      if (col < p.head_dim) store4<Elem>(out + col, acc[c]);
    }
    if (p.lse != nullptr && lane == 0) p.lse[row(p.l_batch, p.l_row, p.l_head)] = lse;
  }
}

template <class Elem>
Status launch_combine_as(const CombineParams& p, cudaStream_t stream) {
  if (p.batch == 0) return Status();
  const long long row_blocks = (static_cast<long long>(p.seqlen) * p.heads + kWarps - 1) / kWarps;
  if (row_blocks == 0) return Status();
  // A warp's (row, head) index is 32-bit (fa3_combine's validation bounds seqlen * heads the same
  // way; the split-KV path comes here directly).
  if (int64_t(p.seqlen) * p.heads > detail::kMaxIndex32)
    return Status(FA3_ERROR_INVALID_ARGUMENT, "combine: seqlen * heads must be <= " +
                                                  std::to_string(detail::kMaxIndex32) + "; got " +
                                                  std::to_string(p.seqlen) + " * " + std::to_string(p.heads));
  const dim3 grid(static_cast<unsigned>(row_blocks), static_cast<unsigned>(std::min<int64_t>(p.batch, detail::kMaxGridYz)));
  return hopper::launch<combine_kernel<Elem>>(grid, kWarps * 32, 0, stream, p);
}

}  // namespace

Status launch_combine(const fa3_combine_params& a, cudaStream_t stream) {
  CombineParams c{};
  c.o_partial = a.out_partial;
  c.op_split = a.out_partial_split_stride;
  c.op_batch = a.out_partial_batch_stride;
  c.op_row = a.out_partial_row_stride;
  c.op_head = a.out_partial_head_stride;
  c.lse_partial = a.lse_partial;
  c.lp_split = a.lse_partial_split_stride;
  c.lp_batch = a.lse_partial_batch_stride;
  c.lp_row = a.lse_partial_row_stride;
  c.lp_head = a.lse_partial_head_stride;
  c.out = a.out.data;
  c.o_batch = a.out.batch_stride;
  c.o_row = a.out.row_stride;
  c.o_head = a.out.head_stride;
  c.lse = a.lse;
  c.l_batch = a.lse_batch_stride;
  c.l_row = a.lse_row_stride;
  c.l_head = a.lse_head_stride;
  c.num_splits = a.num_splits;
  c.batch = a.batch;
  c.seqlen = a.seqlen;
  c.heads = a.heads;
  c.head_dim = a.head_dim;
  c.cu_seqlens = a.cu_seqlens;
  c.seqused = a.seqused;
  c.sinks = a.sinks;
  switch (a.out_dtype) {
    case FA3_DTYPE_FP16: return launch_combine_as<__half>(c, stream);
    case FA3_DTYPE_BF16: return launch_combine_as<__nv_bfloat16>(c, stream);
    default: return launch_combine_as<float>(c, stream);
  }
}

}  // namespace fa3::attn
