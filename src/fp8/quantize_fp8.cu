// The quantization kernel (quantize_fp8.h). A CTA of 8 warps takes 128 rows of one (sequence,
// head), the heads of the same rows in consecutive CTAs; each lane holds 8 consecutive columns of a
// row (one 16-byte load), kLanes lanes a row. The rotation is a fast Walsh-Hadamard transform on
// those registers: three butterfly stages inside the lane, then log2(kLanes) across lanes by
// shuffles (columns c and c + h meet at stage h, stages h = 1, 2, 4, ... in that order: the CPU
// reference repeats it bit for bit). Each warp owns 16 consecutive rows, so a block of 16..128
// rows is one or more whole warps: its max |y| is a warp reduction and a max over those warps in
// shared memory. Blocks of more than 128 rows (multiples of 128) take a first pass for the max and
// read their rows again to write them.
// The rotated rows of blocks of up to 128 rows (kStaged, head dims up to 128): the transform is the
// kernel's work (the plain pass reads + writes 3.78 TB/s, the rotated one 1.58 with the transform
// done twice, for the max and for the store: perf-log step 66), so each row is transformed once
// and its floats wait in shared memory for the block's max (128 rows x d floats: 64 KB at d128,
// three CTAs per SM as the registers allow; d256's 128 KB would leave one, so it transforms twice).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cmath>
#include <type_traits>

#include "src/api/status.h"
#include "src/fp8/quantize_fp8.h"
#include "src/hopper/elem.cuh"
#include "src/hopper/launch.h"

namespace fa3::fp8 {
namespace {

constexpr int kChunkRows = 128;  // rows a CTA holds at once: 8 warps x 16
constexpr int kWarps = kChunkRows / 16;

// CTAs per SM each lane width is built for: its registers (128 / 80 / 48 / 40), and no spills
// (left to itself ptxas chose those counts with 16-48 bytes of spills at d128 and d256).
template <int kLanes>
constexpr int kMinCtasPerSm = kLanes == 32 ? 2 : kLanes == 16 ? 3 : kLanes == 8 ? 5 : 6;

// kStaged: a row's floats in shared memory, kStagedStride floats apart (+4: the two 16-byte stores
// of a lane's 8 floats hit 2-way bank conflicts, not 4-way).
template <int kLanes>
constexpr int kStagedStride = 8 * kLanes + 4;
template <int kLanes>
constexpr size_t staged_bytes() {
  return size_t(kChunkRows) * kStagedStride<kLanes> * sizeof(float);
}

template <class T, int kLanes, bool kStaged>
__global__ void __launch_bounds__(kWarps * 32, kMinCtasPerSm<kLanes>) quantize_kernel(const fa3_quantize_params p) {
  constexpr int kRowsPerStep = 32 / kLanes;  // rows a warp holds per register set
  constexpr int kSteps = 16 / kRowsPerStep;  // register sets: the warp's 16 rows
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int sub = lane / kLanes, lane_in_row = lane % kLanes, col0 = lane_in_row * 8;
  // Consecutive CTAs take the heads of the same rows: together they read whole rows of a BSHD tensor
  // (a lone head's rows lie a row stride apart).
  const int b = blockIdx.y, h = blockIdx.x % p.heads, row_block = blockIdx.x / p.heads;
  int64_t row_base = 0;
  int len = p.seqlen;
  if (p.cu_seqlens) {
    row_base = p.cu_seqlens[b];
    len = p.cu_seqlens[b + 1] - p.cu_seqlens[b];
  }
  const int span = p.block_size > kChunkRows ? p.block_size : kChunkRows;  // rows of this CTA
  const int first = row_block * span;
  if (first >= len) return;
  const int end = min(first + span, len);
  const bool active = col0 < p.head_dim;
  const T* in = static_cast<const T*>(p.in.data) + (p.cu_seqlens ? 0 : b * p.in.batch_stride) +
                int64_t(h) * p.in.head_stride + col0;
  uint8_t* out = static_cast<uint8_t*>(p.out.data) + (p.cu_seqlens ? 0 : b * p.out.batch_stride) +
                 int64_t(h) * p.out.head_stride + col0;
  float sign[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) sign[e] = p.hadamard ? hadamard_sign(p.seed, col0 + e) : 1.f;

  // This lane's 8 columns of row `pos` as stored (zeros past the end and past head_dim), and their
  // transform.
  auto load_raw = [&](int pos) {
    uint4 raw = make_uint4(0, 0, 0, 0);
    if (active && pos < end) raw = *reinterpret_cast<const uint4*>(in + (row_base + pos) * p.in.row_stride);
    return raw;
  };
  auto transform = [&](const uint4& raw, float (&x)[8]) {
    hopper::to_float8<T>(raw, x);
    if (!p.hadamard) return;
#pragma unroll
    for (int e = 0; e < 8; ++e) x[e] *= sign[e];
#pragma unroll
    for (int hs = 1; hs < 8; hs <<= 1)
#pragma unroll
      for (int e = 0; e < 8; ++e)
        if ((e & hs) == 0) {
          const float a = x[e], c = x[e + hs];
          x[e] = a + c;
          x[e + hs] = a - c;
        }
#pragma unroll
    for (int m = 1; m < kLanes; m <<= 1)
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const float other = __shfl_xor_sync(0xffffffff, x[e], m);
        x[e] = (lane_in_row & m) ? other - x[e] : x[e] + other;
      }
  };
  auto row_in_chunk = [&](int i) { return warp * 16 + i * kRowsPerStep + sub; };
  auto row_of = [&](int chunk0, int i) { return chunk0 + row_in_chunk(i); };
  extern __shared__ float4 staged_rows[];  // kStaged: [kChunkRows][kStagedStride] floats
  auto staged = [&](int i) {
    return reinterpret_cast<float*>(staged_rows) + row_in_chunk(i) * kStagedStride<kLanes> + col0;
  };
  auto warp_max = [&](float m) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, o));
    return m;
  };
  auto store = [&](int pos, const float (&x)[8], float factor) {
    if (!active || pos >= end) return;
    uint32_t w[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const __nv_fp8x2_storage_t lo =
          __nv_cvt_float2_to_fp8x2(make_float2(x[4 * i] * factor, x[4 * i + 1] * factor), __NV_SATFINITE, __NV_E4M3);
      const __nv_fp8x2_storage_t hi = __nv_cvt_float2_to_fp8x2(
          make_float2(x[4 * i + 2] * factor, x[4 * i + 3] * factor), __NV_SATFINITE, __NV_E4M3);
      w[i] = uint32_t(lo) | (uint32_t(hi) << 16);
    }
    *reinterpret_cast<uint2*>(out + (row_base + pos) * p.out.row_stride) = make_uint2(w[0], w[1]);
  };
  __shared__ float warp_amax[kWarps];
  const float norm = p.hadamard ? rotation_norm(p.head_dim) : 1.f;
  float* descale = p.descale + b * p.descale_batch_stride + int64_t(h) * p.descale_head_stride;

  if (p.block_size <= kChunkRows) {
    // One pass over memory: the rows stay in registers as loaded (16-bit: half the registers of
    // floats, so twice the CTAs per SM and loads in flight; 1.98 TB/s with floats), transformed
    // once for the max and again for the store.
    uint4 raw[kSteps];
#pragma unroll
    for (int i = 0; i < kSteps; ++i) raw[i] = load_raw(row_of(first, i));
    float m = 0.f;
#pragma unroll
    for (int i = 0; i < kSteps; ++i) {
      float x[8];
      transform(raw[i], x);
#pragma unroll
      for (int e = 0; e < 8; ++e) m = fmaxf(m, fabsf(x[e]));
      if constexpr (kStaged) {
        float4* at = reinterpret_cast<float4*>(staged(i));
        at[0] = make_float4(x[0], x[1], x[2], x[3]);
        at[1] = make_float4(x[4], x[5], x[6], x[7]);
      }
    }
    m = warp_max(m);
    if (lane == 0) warp_amax[warp] = m;
    __syncthreads();
    const int warps_per_block = p.block_size / 16;
    const int blk0 = warp / warps_per_block * warps_per_block;
    float amax = 0.f;
    for (int w = blk0; w < blk0 + warps_per_block; ++w) amax = fmaxf(amax, warp_amax[w]);
    const float factor = quant_factor(amax);
#pragma unroll
    for (int i = 0; i < kSteps; ++i) {
      float x[8];
      if constexpr (kStaged) {  // this thread's own floats (no other thread's: no barrier needed)
        const float4* at = reinterpret_cast<const float4*>(staged(i));
        const float4 a = at[0], c = at[1];
        x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w, x[4] = c.x, x[5] = c.y, x[6] = c.z, x[7] = c.w;
      } else {
        // An empty asm that "changes" raw: else the compiler keeps the first transform's floats
        // alive across the barrier instead of recomputing them (bf16 d128: 122 registers, not ~80).
        asm volatile("" : "+r"(raw[i].x), "+r"(raw[i].y), "+r"(raw[i].z), "+r"(raw[i].w));
        transform(raw[i], x);
      }
      store(row_of(first, i), x, factor);
    }
    const int block_first = first + warp * 16;  // the warp that starts a block writes its descale
    if (lane == 0 && warp == blk0 && block_first < end) descale[block_first / p.block_size] = descale_of(amax, norm);
    return;
  }
  // Blocks of span rows: the max over every chunk, then the rows again.
  float m = 0.f;
  for (int chunk = first; chunk < end; chunk += kChunkRows) {
#pragma unroll
    for (int i = 0; i < kSteps; ++i) {
      float x[8];
      transform(load_raw(row_of(chunk, i)), x);
#pragma unroll
      for (int e = 0; e < 8; ++e) m = fmaxf(m, fabsf(x[e]));
    }
  }
  m = warp_max(m);
  if (lane == 0) warp_amax[warp] = m;
  __syncthreads();
  float amax = 0.f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) amax = fmaxf(amax, warp_amax[w]);
  const float factor = quant_factor(amax);
  for (int chunk = first; chunk < end; chunk += kChunkRows) {
#pragma unroll
    for (int i = 0; i < kSteps; ++i) {
      float x[8];
      transform(load_raw(row_of(chunk, i)), x);
      store(row_of(chunk, i), x, factor);
    }
  }
  if (threadIdx.x == 0) descale[first / p.block_size] = descale_of(amax, norm);
}

template <class T>
Status launch_typed(const fa3_quantize_params& p, cudaStream_t stream) {
  const int span = p.block_size > kChunkRows ? p.block_size : kChunkRows;
  const dim3 grid(unsigned((p.seqlen + span - 1) / span) * unsigned(p.heads), p.batch);
  if (grid.x == 0) return detail::ok();
  const int lanes = (p.head_dim + 7) / 8;
  const int threads = kWarps * 32;
  // Rotated blocks of up to 128 rows at head dims up to 128: transformed once (kStaged).
  const bool staged = p.hadamard && p.block_size <= kChunkRows;
  auto go = [&](auto lanes_c) {
    constexpr int kL = decltype(lanes_c)::value;
    if constexpr (kL <= 16) {
      if (staged) return hopper::launch<quantize_kernel<T, kL, true>>(grid, threads, staged_bytes<kL>(), stream, p);
    }
    return hopper::launch<quantize_kernel<T, kL, false>>(grid, threads, 0, stream, p);
  };
  if (lanes <= 2) return go(std::integral_constant<int, 2>{});
  if (lanes <= 4) return go(std::integral_constant<int, 4>{});
  if (lanes <= 8) return go(std::integral_constant<int, 8>{});
  if (lanes <= 16) return go(std::integral_constant<int, 16>{});
  return go(std::integral_constant<int, 32>{});
}

}  // namespace

Status launch_quantize(const fa3_quantize_params& p, cudaStream_t stream) {
  return p.in_dtype == FA3_DTYPE_BF16 ? launch_typed<__nv_bfloat16>(p, stream) : launch_typed<__half>(p, stream);
}

}  // namespace fa3::fp8
