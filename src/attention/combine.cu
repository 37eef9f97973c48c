// The combine kernel (combine.h). One warp per output row (query, head): the splits' LSEs, a lane
// per split, give the merged LSE = m + log(sum_s exp(lse_s - m)) and each split's weight
// exp(lse_s - LSE); then every lane owns 4 columns (float4 loads, 512 contiguous bytes per split
// and warp) and adds the weighted partial rows. A split of weight 0 (LSE -inf) is skipped, never
// read: its slot may hold anything. Rows whose splits are all empty get O = 0, LSE = -inf, as rows
// without a visible key do in the unsplit kernel. Sinks join each row's merged LSE once (sink.cuh).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <type_traits>

#include "src/attention/combine.h"
#include "src/attention/sink.cuh"
#include "src/hopper/launch.h"

namespace fa3::attn {
namespace {

constexpr int kWarps = 4;
constexpr int kSplitsPerLane = kMaxCombineSplits / 32;
constexpr int kChunks = kMaxCombineHeadDim / 128;  // 128 columns per warp and chunk

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
#pragma unroll
    for (int i = 0; i < kSplitsPerLane; ++i) {
      if (32 * i >= p.num_splits) break;
      for (int j = 0; j < 32 && 32 * i + j < p.num_splits; ++j) {
        const float wt = __shfl_sync(0xffffffffu, w[i], j);
        if (!(wt > 0.f)) continue;  // an empty split: its slot is never read
        const float* src = o_in + int64_t(32 * i + j) * p.op_split;
#pragma unroll
        for (int c = 0; c < kChunks; ++c) {
          const int col = 128 * c + 4 * lane;
          if (col < p.head_dim) {
            const float4 v = *reinterpret_cast<const float4*>(src + col);
            acc[c].x += wt * v.x;
            acc[c].y += wt * v.y;
            acc[c].z += wt * v.z;
            acc[c].w += wt * v.w;
          }
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
  if (row_blocks > 0x7fffffffLL) return Status(FA3_ERROR_INVALID_ARGUMENT, "combine: seqlen * heads too large");
  const dim3 grid(static_cast<unsigned>(row_blocks), static_cast<unsigned>(p.batch < 65535 ? p.batch : 65535));
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
