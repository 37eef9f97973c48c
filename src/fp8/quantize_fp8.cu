// The quantization kernel (quantize_fp8.h). A CTA of 8 warps takes a chunk: 128 rows of one
// (sequence, head), the heads of the same rows in consecutive chunks; each lane holds 8 consecutive
// columns of a row (one 16-byte load), kLanes lanes a row. The rotation is a fast Walsh-Hadamard
// transform on those registers: three butterfly stages inside the lane, then log2(kLanes) across
// lanes by shuffles (columns c and c + h meet at stage h, stages h = 1, 2, 4, ... in that order:
// the CPU reference repeats it bit for bit). Each warp owns 16 consecutive rows, so a block of
// 16..128 rows is one or more whole warps: its max |y| is a warp reduction and a max over those
// warps in shared memory. Blocks of more than 128 rows (multiples of 128) are chunks of their own:
// a first pass for the max, then their rows again.
// The rotated rows of blocks of up to 128 rows (kStaged, head dims up to 128): the transform is the
// kernel's work (the plain pass reads + writes 3.78 TB/s, the rotated one 1.58 with the transform
// done twice, for the max and for the store: perf-log step 66), so each row is transformed once
// and its floats wait in shared memory for the block's max (128 rows x d floats: 64 KB at d128,
// three CTAs per SM as the registers allow; d256's 128 KB would leave one, so it transforms twice).
// The rotated kernels' CTAs walk several chunks (blocks of up to 128 rows), loading the next one's
// rows while they transform the current one (perf-log step 93).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "src/api/status.h"
#include "src/fp8/quantize_fp8.h"
#include "src/hopper/elem.cuh"
#include "src/hopper/launch.h"
#include "src/hopper/sm_count.h"

namespace fa3::fp8 {
namespace {

constexpr int kWarps = kChunkRows / 16;  // a chunk of 128 rows at once: 8 warps x 16

// CTAs per SM each kernel is built for, so its registers: the most that leave no spills (rotated
// 128 / 80 / 64 / 48 / 40 registers from d256 down, plain 128 / 64 / 48 / 40 / 40). The plain
// pass is bound by the loads in flight, so its d128 kernel takes a fourth CTA (64 registers; with
// the rest of perf-log step 93, 3.74 -> 4.14 TB/s).
template <int kLanes, bool kRotate>
constexpr int kMinCtasPerSm = kRotate ? (kLanes == 32 ? 2 : kLanes == 16 ? 3 : kLanes == 8 ? 4 : kLanes == 4 ? 5 : 6)
                                      : (kLanes == 32 ? 2 : kLanes == 16 ? 4 : kLanes == 8 ? 5 : 6);

// kStaged: a row's floats in shared memory, kStagedStride floats apart (+4: the two 16-byte stores
// of a lane's 8 floats hit 2-way bank conflicts, not 4-way).
template <int kLanes>
constexpr int kStagedStride = 8 * kLanes + 4;
template <int kLanes>
constexpr size_t staged_bytes() {
  return size_t(kChunkRows) * kStagedStride<kLanes> * sizeof(float);
}

// Sixteen bytes of global memory. A volatile asm keeps the loads' order among the transforms'
// volatile asms in PTX (ptxas still schedules them as it likes); the plain kernels read the same
// with ordinary loads, the rotated ones were measured with this form only (perf-log step 93).
__device__ __forceinline__ uint4 ld_global_16(const void* ptr) {
  uint4 v;
  asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(ptr));
  return v;
}

// A chunk: up to `span` rows of one (sequence, head), from position `first` to `end` (end <= first:
// a chunk past a short sequence's end, nothing to do), `in` at this lane's columns of the sequence's
// position 0. (Its output pointer is made where it is stored: the narrow kernels' 48 registers
// hold the walk's state only so.)
template <class T>
struct Chunk {
  const T* in;
  int first, end;
};

// kRotate: p.hadamard as a template argument: with the rotation a branch of each row's transform,
// the compiler moved each row's load down to its branch, one load in flight at a time (perf-log
// step 93).
template <class T, int kLanes, bool kRotate, bool kStaged>
__global__ void __launch_bounds__(kWarps * 32, kMinCtasPerSm<kLanes, kRotate>) quantize_kernel(const fa3_quantize_params p) {
  static_assert(kRotate || !kStaged, "only the rotation stages floats");
  // The rotated kernels walk several chunks (blocks of up to 128 rows), a grid stride apart, each
  // loading its next chunk while it transforms and stores the current one; the plain ones take one
  // chunk per CTA (launch_typed's grid), as walking made them slower (d64 -20%: perf-log step 93).
  constexpr bool kWalk = kRotate;
  constexpr int kRowsPerStep = 32 / kLanes;  // rows a warp holds per register set
  constexpr int kSteps = 16 / kRowsPerStep;  // register sets: the warp's 16 rows
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int sub = lane / kLanes, lane_in_row = lane % kLanes, col0 = lane_in_row * 8;
  const bool active = col0 < p.head_dim;
  const int span = chunk_rows(p.block_size);
  const int row_blocks = (p.seqlen + span - 1) / span;
  const int chunks = row_blocks * p.heads * p.batch;  // <= 2^30 (validate_quantize): t + grid fits
  // Chunk t: heads fastest, so that the CTAs at work together read whole rows of a BSHD tensor (a
  // lone head's rows lie a row stride apart), then the sequence's row blocks, then the batch.
  auto batch_of = [&](int t) { return t / p.heads / row_blocks; };
  auto head_of = [&](int t) { return t % p.heads; };
  auto row_base_of = [&](int b) { return p.cu_seqlens ? int64_t(p.cu_seqlens[b]) : int64_t(0); };
  auto chunk_of = [&](int t) {
    Chunk<T> c{nullptr, 0, 0};
    if (t >= chunks) return c;
    const int b = batch_of(t), h = head_of(t);
    const int len = p.cu_seqlens ? p.cu_seqlens[b + 1] - p.cu_seqlens[b] : p.seqlen;
    c.first = t / p.heads % row_blocks * span;
    c.end = min(c.first + span, len);
    c.in = static_cast<const T*>(p.in.data) + (p.cu_seqlens ? 0 : b * p.in.batch_stride) + int64_t(h) * p.in.head_stride +
           row_base_of(b) * p.in.row_stride + col0;
    return c;
  };
  auto out_of = [&](int t) {
    const int b = batch_of(t);
    return static_cast<uint8_t*>(p.out.data) + (p.cu_seqlens ? 0 : b * p.out.batch_stride) +
           int64_t(head_of(t)) * p.out.head_stride + row_base_of(b) * p.out.row_stride + col0;
  };
  // The rotation's signs as sign bits of the 16-bit values as loaded: flipping a sign bit is an
  // exact multiplication by -1 in both formats, and costs 4 registers (not 8 floats) and 4 LOP3s
  // per row (not 8 FMULs).
  uint32_t flip[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    flip[i] = 0;
    if (kRotate) {
      if (hadamard_sign(p.seed, col0 + 2 * i) < 0.f) flip[i] |= 0x8000u;
      if (hadamard_sign(p.seed, col0 + 2 * i + 1) < 0.f) flip[i] |= 0x80000000u;
    }
  }

  // This lane's 8 columns of row `pos` as stored (zeros past the chunk's end and past head_dim), and
  // their transform.
  auto load_raw = [&](const Chunk<T>& c, int pos) {
    uint4 raw = make_uint4(0, 0, 0, 0);
    if (active && pos < c.end) raw = ld_global_16(c.in + pos * p.in.row_stride);
    return raw;
  };
  auto transform = [&](const uint4& raw, float (&x)[8]) {
    if constexpr (!kRotate) {
      hopper::to_float8<T>(raw, x);
      return;
    }
    hopper::to_float8<T>(make_uint4(raw.x ^ flip[0], raw.y ^ flip[1], raw.z ^ flip[2], raw.w ^ flip[3]), x);
#pragma unroll
    for (int hs = 1; hs < 8; hs <<= 1)
#pragma unroll
      for (int e = 0; e < 8; ++e)
        if ((e & hs) == 0) {
          const float a = x[e], c = x[e + hs];
          x[e] = a + c;
          x[e + hs] = a - c;
        }
    // Across lanes the lane with bit m set keeps the difference, its partner the sum: other - x and
    // x + other as one fma with a per-lane sign (exact: x * +-1 rounds nothing), not both and a
    // select (an FADD pair and an FSEL per value and stage).
    // The signs come from a copy of the lane the compiler cannot see through: hoisted out of the
    // rows they would hold log2(kLanes) registers for the whole kernel (d64 spilled at 48).
    int lane_bits = lane_in_row;
    asm volatile("" : "+r"(lane_bits));
#pragma unroll
    for (int m = 1; m < kLanes; m <<= 1) {
      const float keep = (lane_bits & m) ? -1.f : 1.f;
#pragma unroll
      for (int e = 0; e < 8; ++e) x[e] = fmaf(x[e], keep, __shfl_xor_sync(0xffffffff, x[e], m));
    }
  };
  auto row_in_chunk = [&](int i) { return warp * 16 + i * kRowsPerStep + sub; };
  auto row_of = [&](int chunk0, int i) { return chunk0 + row_in_chunk(i); };
  extern __shared__ float4 staged_rows[];  // kStaged: [kChunkRows][kStagedStride] floats
  auto staged = [&](int i) {
    return reinterpret_cast<float*>(staged_rows) + row_in_chunk(i) * kStagedStride<kLanes> + col0;
  };
  auto fold_max = [](const float (&x)[8], float& m) {
#pragma unroll
    for (int e = 0; e < 8; ++e) m = fmaxf(m, fabsf(x[e]));
  };
  auto warp_max = [&](float m) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, o));
    return m;
  };
  auto store = [&](const Chunk<T>& c, uint8_t* out, int pos, const float (&x)[8], float factor) {
    if (!active || pos >= c.end) return;
    uint32_t w[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const __nv_fp8x2_storage_t lo =
          __nv_cvt_float2_to_fp8x2(make_float2(x[4 * i] * factor, x[4 * i + 1] * factor), __NV_SATFINITE, __NV_E4M3);
      const __nv_fp8x2_storage_t hi = __nv_cvt_float2_to_fp8x2(
          make_float2(x[4 * i + 2] * factor, x[4 * i + 3] * factor), __NV_SATFINITE, __NV_E4M3);
      w[i] = uint32_t(lo) | (uint32_t(hi) << 16);
    }
    *reinterpret_cast<uint2*>(out + pos * p.out.row_stride) = make_uint2(w[0], w[1]);
  };
  auto descale = [&](int t, int block) -> float& {
    return p.descale[batch_of(t) * p.descale_batch_stride + int64_t(head_of(t)) * p.descale_head_stride + block];
  };
  // The warps' maxima, two sets: a chunk's are read after its barrier, and a warp can write the set
  // again only two chunks on, past the next chunk's barrier, which every reader has reached by then.
  __shared__ float warp_amax[2][kWarps];
  const float norm = kRotate ? rotation_norm(p.head_dim) : 1.f;

  // The CTAs walk the chunks, a grid stride apart (launch_typed sizes the grid).
  int t = blockIdx.x;
  if (p.block_size <= kChunkRows) {
    // One pass over memory: the rows stay in registers as loaded (16-bit: half the registers of
    // floats, so twice the CTAs per SM and loads in flight; 1.98 TB/s with floats), transformed
    // once for the max and, unless kStaged keeps the floats, again for the store. A row's
    // registers load the next chunk's row as soon as they are free, so the loads of a chunk fly
    // while the one before it is transformed and stored.
    Chunk<T> cur = chunk_of(t);
    uint4 raw[kSteps];
#pragma unroll
    for (int i = 0; i < kSteps; ++i) raw[i] = load_raw(cur, row_of(cur.first, i));
    for (int parity = 0;; parity ^= 1) {
      const int t_next = t + gridDim.x;
      const Chunk<T> next = kWalk ? chunk_of(t_next) : Chunk<T>{nullptr, 0, 0};
      float m = 0.f;
#pragma unroll
      for (int i = 0; i < kSteps; ++i) {
        float x[8];
        transform(raw[i], x);
        fold_max(x, m);
        if constexpr (kStaged) {
          float4* at = reinterpret_cast<float4*>(staged(i));
          at[0] = make_float4(x[0], x[1], x[2], x[3]);
          at[1] = make_float4(x[4], x[5], x[6], x[7]);
          raw[i] = load_raw(next, row_of(next.first, i));
        }
      }
      m = warp_max(m);
      if (lane == 0) warp_amax[parity][warp] = m;
      __syncthreads();
      const int warps_per_block = p.block_size / 16;
      const int blk0 = warp / warps_per_block * warps_per_block;
      float amax = 0.f;
      for (int w = blk0; w < blk0 + warps_per_block; ++w) amax = fmaxf(amax, warp_amax[parity][w]);
      const float factor = quant_factor(amax);
      uint8_t* const out = out_of(t);
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
          raw[i] = load_raw(next, row_of(next.first, i));
        }
        store(cur, out, row_of(cur.first, i), x, factor);
      }
      const int block_first = cur.first + warp * 16;  // the warp that starts a block writes its descale
      if (lane == 0 && warp == blk0 && block_first < cur.end) descale(t, block_first / p.block_size) = descale_of(amax, norm);
      if (!kWalk || t_next >= chunks) return;
      t = t_next;
      cur = next;
    }
  }
  // Blocks of span rows: the max over every part of the chunk, then its rows again.
  for (int parity = 0; t < chunks; t += gridDim.x, parity ^= 1) {
    const Chunk<T> cur = chunk_of(t);
    float m = 0.f;
    for (int part = cur.first; part < cur.end; part += kChunkRows) {
      uint4 raw[kSteps];  // every row's load issued before the first transform
#pragma unroll
      for (int i = 0; i < kSteps; ++i) raw[i] = load_raw(cur, row_of(part, i));
#pragma unroll
      for (int i = 0; i < kSteps; ++i) {
        float x[8];
        transform(raw[i], x);
        fold_max(x, m);
      }
    }
    m = warp_max(m);
    if (lane == 0) warp_amax[parity][warp] = m;
    __syncthreads();
    float amax = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) amax = fmaxf(amax, warp_amax[parity][w]);
    const float factor = quant_factor(amax);
    uint8_t* const out = out_of(t);
    for (int part = cur.first; part < cur.end; part += kChunkRows) {
      uint4 raw[kSteps];
#pragma unroll
      for (int i = 0; i < kSteps; ++i) raw[i] = load_raw(cur, row_of(part, i));
#pragma unroll
      for (int i = 0; i < kSteps; ++i) {
        float x[8];
        transform(raw[i], x);
        store(cur, out, row_of(part, i), x, factor);
      }
    }
    if (threadIdx.x == 0 && cur.first < cur.end) descale(t, cur.first / p.block_size) = descale_of(amax, norm);
  }
}

template <class T>
Status launch_typed(const fa3_quantize_params& p, cudaStream_t stream) {
  const int chunks = int(chunk_count(p));  // <= 2^30: validate_quantize
  if (chunks == 0) return detail::ok();
  int sms = 0;
  FA3_TRY(hopper::sm_count(&sms));
  const int lanes = (p.head_dim + 7) / 8;
  const int threads = kWarps * 32;
  // Rotated blocks of up to 128 rows at head dims up to 128: transformed once (kStaged).
  const bool staged = p.hadamard && p.block_size <= kChunkRows;
  auto go = [&](auto lanes_c) {
    constexpr int kL = decltype(lanes_c)::value;
    // A CTA per chunk, but for the walking (rotated, one-pass) kernels: as many CTAs as the SMs hold
    // at once (the registers' count; their shared memory fits it).
    const dim3 one_each{unsigned(chunks)}, walkers{unsigned(std::min(chunks, sms * kMinCtasPerSm<kL, true>))};
    if (!p.hadamard) return hopper::launch<quantize_kernel<T, kL, false, false>>(one_each, threads, 0, stream, p);
    if constexpr (kL <= 16) {
      if (staged)
        return hopper::launch<quantize_kernel<T, kL, true, true>>(walkers, threads, staged_bytes<kL>(), stream, p);
    }
    return hopper::launch<quantize_kernel<T, kL, true, false>>(p.block_size > kChunkRows ? one_each : walkers, threads,
                                                               0, stream, p);
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
