// The quantization kernels (quantize_fp8.h). A chunk is 128 rows of one (sequence, head), or one
// block of more; the heads of the same rows are consecutive chunks. The rotation is a fast
// Walsh-Hadamard transform: stage h (h = 1, 2, 4, ... in that order: the CPU reference repeats it
// bit for bit) pairs columns c and c + h, an add where both lie in one thread, a shuffle and an fma
// where they lie in two. A block of 16..128 rows is one or more whole warps: its max |y| is a warp
// reduction and a max over those warps in shared memory. Two kernels:
// - quantize_kernel, a CTA of 8 warps per chunk, a lane 8 consecutive columns of a row (one 16-byte
//   load), kLanes = d / 8 lanes a row: the plain pass (no rotation: conversion only, bound by the
//   loads in flight), and rotated blocks of more than 128 rows (a first pass over the block for its
//   max, then its rows again; three stages in the lane, log2(kLanes) across lanes).
// - rotate_kernel, rotated blocks of up to 128 rows (Q and K for the FP8 forward): CTAs walk the
//   chunks through a ring of three in shared memory (cp.async), two or four threads a row, each
//   transforming up to 64 of its columns in registers and keeping them there until the block's max
//   is known (perf-log step 94).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "src/api/status.h"
#include "src/fp8/quantize_fp8.h"
#include "src/hopper/cp_async.cuh"
#include "src/hopper/elem.cuh"
#include "src/hopper/launch.h"
#include "src/hopper/sm_count.h"

namespace fa3::fp8 {
namespace {

// ---- The pieces both kernels use ----

// The problem's chunks: chunk t has heads fastest, so that the CTAs at work together read whole
// rows of a BSHD tensor (a lone head's rows lie a row stride apart), then the sequence's row
// blocks, then the batch. count <= 2^30 (validate_quantize): t plus a grid stride or two fits.
struct Chunks {
  int span, row_blocks, count;
};
__device__ __forceinline__ Chunks chunks_of(const fa3_quantize_params& p) {
  const int span = chunk_rows(p.block_size);
  const int row_blocks = (p.seqlen + span - 1) / span;
  return {span, row_blocks, row_blocks * p.heads * p.batch};
}
__device__ __forceinline__ int64_t row_base_of(const fa3_quantize_params& p, int b) {
  return p.cu_seqlens ? int64_t(p.cu_seqlens[b]) : int64_t(0);
}

// Chunk t: up to `span` rows of head h of sequence b, from position `first` to `end` (end <= first:
// a chunk past a short sequence's end or past the last chunk, nothing to do), `in` at this lane's
// columns of the sequence's position 0. Decoded once per chunk (unsigned divisions: shorter).
template <class T>
struct Chunk {
  const T* in;
  int first, end, b, h;
};
template <class T>
__device__ __forceinline__ Chunk<T> chunk_at(const fa3_quantize_params& p, const Chunks& g, int t, int col0) {
  Chunk<T> c{nullptr, 0, 0, 0, 0};
  if (t >= g.count) return c;
  const unsigned th = unsigned(t) / unsigned(p.heads);
  c.b = int(th / unsigned(g.row_blocks));
  c.h = int(unsigned(t) - th * unsigned(p.heads));
  const int len = p.cu_seqlens ? p.cu_seqlens[c.b + 1] - p.cu_seqlens[c.b] : p.seqlen;
  c.first = int(th - unsigned(c.b) * unsigned(g.row_blocks)) * g.span;
  c.end = min(c.first + g.span, len);
  c.in = static_cast<const T*>(p.in.data) + (p.cu_seqlens ? 0 : c.b * p.in.batch_stride) +
         int64_t(c.h) * p.in.head_stride + row_base_of(p, c.b) * p.in.row_stride + col0;
  return c;
}
template <class T>
__device__ __forceinline__ uint8_t* out_at(const fa3_quantize_params& p, const Chunk<T>& c, int col0) {
  return static_cast<uint8_t*>(p.out.data) + (p.cu_seqlens ? 0 : c.b * p.out.batch_stride) +
         int64_t(c.h) * p.out.head_stride + row_base_of(p, c.b) * p.out.row_stride + col0;
}
template <class T>
__device__ __forceinline__ float& descale_at(const fa3_quantize_params& p, const Chunk<T>& c, int block) {
  return p.descale[c.b * p.descale_batch_stride + int64_t(c.h) * p.descale_head_stride + block];
}

// The rotation's signs for this lane's 8 columns as sign bits of the 16-bit values as loaded:
// flipping a sign bit is an exact multiplication by -1 in both formats, and costs 4 registers (not
// 8 floats) and 4 LOP3s per row (not 8 FMULs). Computed once and pinned by an empty asm: left
// visible, the compiler recomputes the eight hashes (64-bit multiplies) where they are used to save
// the registers: for each pass over a block (blocks of 256 rows ran 9% slower), and in a walking
// kernel for every chunk (~3 instructions an element at d128 there: ncu, perf-log step 94).
template <bool kRotate>
__device__ __forceinline__ void sign_flips(uint64_t seed, int col0, uint32_t (&flip)[4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    flip[i] = 0;
    if (kRotate) {
      if (hadamard_sign(seed, col0 + 2 * i) < 0.f) flip[i] |= 0x8000u;
      if (hadamard_sign(seed, col0 + 2 * i + 1) < 0.f) flip[i] |= 0x80000000u;
    }
  }
#pragma unroll
  for (int i = 0; i < 4; ++i)
    if (kRotate) asm volatile("" : "+r"(flip[i]));
}

// Sixteen bytes of global memory. A volatile asm keeps the loads' order among the transforms'
// volatile asms in PTX (ptxas still schedules them as it likes); the plain kernels read the same
// with ordinary loads (perf-log step 93).
__device__ __forceinline__ uint4 ld_global_16(const void* ptr) {
  uint4 v;
  asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(ptr));
  return v;
}

// The butterfly on values o apart inside a thread: the lower keeps the sum, the higher the
// difference.
template <int kN>
__device__ __forceinline__ void butterfly_in_thread(float (&x)[kN], int o) {
#pragma unroll
  for (int e = 0; e < kN; ++e)
    if ((e & o) == 0) {
      const float a = x[e], c = x[e + o];
      x[e] = a + c;
      x[e + o] = a - c;
    }
}
// The stages across the kThreads adjacent lanes that share a row (`place`: this lane's among them).
// The lane with bit m set keeps the difference, its partner the sum: other - x and x + other as
// one fma with a per-lane sign (exact: x * +-1 rounds nothing), not both and a select (an FADD pair
// and an FSEL per value and stage). The signs come from a copy of `place` the compiler cannot see
// through: hoisted out of the rows they would hold log2(kThreads) registers for the whole kernel
// (d64 spilled at 48).
template <int kThreads, int kN>
__device__ __forceinline__ void butterfly_across(float (&x)[kN], int place) {
  asm volatile("" : "+r"(place));
#pragma unroll
  for (int m = 1; m < kThreads; m <<= 1) {
    const float keep = (place & m) ? -1.f : 1.f;
#pragma unroll
    for (int e = 0; e < kN; ++e) x[e] = fmaf(x[e], keep, __shfl_xor_sync(0xffffffff, x[e], m));
  }
}

// A row's 8 columns of this lane as floats, rotated when kRotate (unnormalised: the 1 / sqrt(d)
// goes into the descale).
template <class T, int kLanes, bool kRotate>
__device__ __forceinline__ void transform(const uint4& raw, const uint32_t (&flip)[4], int lane_in_row, float (&x)[8]) {
  if constexpr (!kRotate) {
    hopper::to_float8<T>(raw, x);
    return;
  }
  hopper::to_float8<T>(make_uint4(raw.x ^ flip[0], raw.y ^ flip[1], raw.z ^ flip[2], raw.w ^ flip[3]), x);
#pragma unroll
  for (int h = 1; h < 8; h <<= 1) butterfly_in_thread(x, h);
  butterfly_across<kLanes>(x, lane_in_row);
}

__device__ __forceinline__ void fold_max(const float (&x)[8], float& m) {
#pragma unroll
  for (int e = 0; e < 8; ++e) m = fmaxf(m, fabsf(x[e]));
}
__device__ __forceinline__ float warp_max(float m) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, o));
  return m;
}

// 8 values times `factor`, rounded to e4m3 (saturating), in memory order.
__device__ __forceinline__ uint2 e4m3x8(const float* x, float factor) {
  uint32_t w[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const __nv_fp8x2_storage_t lo =
        __nv_cvt_float2_to_fp8x2(make_float2(x[4 * i] * factor, x[4 * i + 1] * factor), __NV_SATFINITE, __NV_E4M3);
    const __nv_fp8x2_storage_t hi =
        __nv_cvt_float2_to_fp8x2(make_float2(x[4 * i + 2] * factor, x[4 * i + 3] * factor), __NV_SATFINITE, __NV_E4M3);
    w[i] = uint32_t(lo) | (uint32_t(hi) << 16);
  }
  return make_uint2(w[0], w[1]);
}

// A lane's 8 values times `factor` as 8 bytes at `at`.
__device__ __forceinline__ void store_e4m3(uint8_t* at, const float (&x)[8], float factor) {
  *reinterpret_cast<uint2*>(at) = e4m3x8(x, factor);
}

// ---- quantize_kernel: a CTA per chunk, the plain pass and rotated blocks of more than 128 rows ----

constexpr int kWarps = kChunkRows / 16;  // a chunk of 128 rows at once: 8 warps x 16

// CTAs per SM each kernel is built for, so its registers: the most that leave no spills (rotated
// 128 / 80 / 64 / 48 / 40 registers from d256 down, plain 128 / 64 / 48 / 40 / 40). The plain
// pass is bound by the loads in flight, so its d128 kernel takes a fourth CTA (64 registers; with
// the rest of perf-log step 93, 3.74 -> 4.14 TB/s).
template <int kLanes, bool kRotate>
constexpr int kMinCtasPerSm = kRotate ? (kLanes == 32 ? 2 : kLanes == 16 ? 3 : kLanes == 8 ? 4 : kLanes == 4 ? 5 : 6)
                                      : (kLanes == 32 ? 2 : kLanes == 16 ? 4 : kLanes == 8 ? 5 : 6);

// kRotate: p.hadamard as a template argument: with the rotation a branch of each row's transform,
// the compiler moved each row's load down to its branch, one load in flight at a time (perf-log
// step 93).
template <class T, int kLanes, bool kRotate>
__global__ void __launch_bounds__(kWarps * 32, kMinCtasPerSm<kLanes, kRotate>) quantize_kernel(const fa3_quantize_params p) {
  constexpr int kRowsPerStep = 32 / kLanes;  // rows a warp holds per register set
  constexpr int kSteps = 16 / kRowsPerStep;  // register sets: the warp's 16 rows
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int sub = lane / kLanes, lane_in_row = lane % kLanes, col0 = lane_in_row * 8;
  const bool active = col0 < p.head_dim;
  const Chunks g = chunks_of(p);
  const int t = blockIdx.x;  // launch_typed's grid: one CTA per chunk
  const Chunk<T> cur = chunk_at<T>(p, g, t, col0);
  uint32_t flip[4];
  sign_flips<kRotate>(p.seed, col0, flip);

  // This lane's 8 columns of row `pos` as stored (zeros past the chunk's end and past head_dim).
  auto load_raw = [&](int pos) {
    uint4 raw = make_uint4(0, 0, 0, 0);
    if (active && pos < cur.end) raw = ld_global_16(cur.in + pos * p.in.row_stride);
    return raw;
  };
  auto row_of = [&](int chunk0, int i) { return chunk0 + warp * 16 + i * kRowsPerStep + sub; };
  uint8_t* const out = out_at(p, cur, col0);
  auto store = [&](int pos, const float (&x)[8], float factor) {
    if (active && pos < cur.end) store_e4m3(out + pos * p.out.row_stride, x, factor);
  };
  // The warp's rows of 128 from `part` (every load issued before the first transform), and their
  // max |y| folded into m.
  auto load_rows = [&](uint4 (&raw)[kSteps], int part) {
#pragma unroll
    for (int i = 0; i < kSteps; ++i) raw[i] = load_raw(row_of(part, i));
  };
  auto fold_rows = [&](const uint4 (&raw)[kSteps], float& m) {
#pragma unroll
    for (int i = 0; i < kSteps; ++i) {
      float x[8];
      transform<T, kLanes, kRotate>(raw[i], flip, lane_in_row, x);
      fold_max(x, m);
    }
  };
  __shared__ float warp_amax[kWarps];
  auto publish = [&](float m) {  // every warp's max, for every warp
    m = warp_max(m);
    if (lane == 0) warp_amax[warp] = m;
    __syncthreads();
  };
  const float norm = kRotate ? rotation_norm(p.head_dim) : 1.f;

  if (!kRotate && p.block_size <= kChunkRows) {
    // One pass over memory: the rows stay in registers as loaded (16-bit: half the registers of
    // floats, so twice the CTAs per SM and loads in flight), converted once for the max and again
    // for the store.
    uint4 raw[kSteps];
    load_rows(raw, cur.first);
    float m = 0.f;
    fold_rows(raw, m);
    publish(m);
    const int warps_per_block = p.block_size / 16;
    const int blk0 = warp / warps_per_block * warps_per_block;
    float amax = 0.f;
    for (int w = blk0; w < blk0 + warps_per_block; ++w) amax = fmaxf(amax, warp_amax[w]);
    const float factor = quant_factor(amax);
#pragma unroll
    for (int i = 0; i < kSteps; ++i) {
      // An empty asm that "changes" raw: else the compiler keeps the first conversion's floats
      // alive across the barrier instead of converting again (twice the registers).
      asm volatile("" : "+r"(raw[i].x), "+r"(raw[i].y), "+r"(raw[i].z), "+r"(raw[i].w));
      float x[8];
      transform<T, kLanes, kRotate>(raw[i], flip, lane_in_row, x);
      store(row_of(cur.first, i), x, factor);
    }
    const int block_first = cur.first + warp * 16;  // the warp that starts a block writes its descale
    if (lane == 0 && warp == blk0 && block_first < cur.end)
      descale_at(p, cur, block_first / p.block_size) = descale_of(amax, norm);
    return;
  }
  // A block of span rows: the max over every part of the chunk, then its rows again.
  float m = 0.f;
  for (int part = cur.first; part < cur.end; part += kChunkRows) {
    uint4 raw[kSteps];
    load_rows(raw, part);
    fold_rows(raw, m);
  }
  publish(m);
  float amax = 0.f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) amax = fmaxf(amax, warp_amax[w]);
  const float factor = quant_factor(amax);
  for (int part = cur.first; part < cur.end; part += kChunkRows) {
    uint4 raw[kSteps];
    load_rows(raw, part);
#pragma unroll
    for (int i = 0; i < kSteps; ++i) {
      float x[8];
      transform<T, kLanes, kRotate>(raw[i], flip, lane_in_row, x);
      store(row_of(part, i), x, factor);
    }
  }
  if (threadIdx.x == 0 && cur.first < cur.end) descale_at(p, cur, cur.first / p.block_size) = descale_of(amax, norm);
}

// ---- rotate_kernel: rotated blocks of up to 128 rows, CTAs walking the chunks ----

// Two mappings of a chunk's 128 rows to threads (perf-log step 94):
// - copies: consecutive threads copy consecutive 16-byte pieces of the rows into a ring of kStages
//   chunks in shared memory (cp.async: nothing held in registers while in flight). The ring holds
//   the rows as they lie in memory (each padded by 16 bytes): with destinations scattered to the
//   transform's order, a warp's copies became 32-byte requests and read 37% more sectors (ncu).
// - the transform: kSegs adjacent threads share a row, each taking kCols = d / kSegs of its columns
//   (at most 64) in pieces of kPiece columns dealt round the row's threads, so that a row's threads
//   store whole 32-byte sectors together; all but one or two of the butterfly's stages are adds
//   inside the thread (8 columns a lane, as quantize_kernel, needed log2(d / 8) rounds of shuffle +
//   fma: ncu counted 30 instructions an element at d128 there, now ~19).
// Stage h pairs columns c and c + h: inside a piece (h < kPiece) and across pieces of one thread
// (h >= kPiece * kSegs) it is an add in registers, in between a shuffle; in the order h = 1, 2, 4,
// ... as the CPU reference. A thread keeps its kCols floats until the block's max is known, so each
// row is transformed once. The chunk at work is published by the barrier that publishes the
// previous chunk's warp maxima: one barrier a chunk.
template <int kDim>
struct RotateShape {
  static constexpr int kCols = kDim / 2 < 64 ? kDim / 2 : 64;
  static constexpr int kSegs = kDim / kCols;  // threads a row: 2, or 4 at d256
  static constexpr int kPiece = kCols < 16 ? kCols : 16;
  static constexpr int kThreads = kChunkRows * kSegs;
  static constexpr int kWarps = kThreads / 32;
  static constexpr int kRowsPerWarp = 32 / kSegs;
  static constexpr int kRowBytes = 2 * kDim + (kDim >= 32 ? 16 : 0);  // a row as stored, padded
  static constexpr int kChunkBytes = kChunkRows * kRowBytes;
  static constexpr int kPiecesPerRow = kDim / 8;              // 16-byte pieces of a row as copied
  static constexpr int kCopyRows = kThreads / kPiecesPerRow;  // rows apart of a thread's copies
  static constexpr int kCopies = kChunkRows / kCopyRows;      // copies a thread issues a chunk
  static constexpr int kFlipWords = kCols / 2 + 4;            // a thread's signs, padded
  static constexpr int kStages = 3;  // the chunk at work and two in flight
  static constexpr int kSmemBytes = kStages * kChunkBytes + kSegs * kFlipWords * 4;
  // As the registers allow without spills (kCols floats a thread; d64: 80 registers, 3 x 256 threads).
  static constexpr int kCtasPerSm = kDim == 256 ? 1 : kDim == 128 ? 2 : kDim == 64 ? 3 : kDim == 32 ? 6 : 8;
  static_assert(kThreads % kPiecesPerRow == 0 && kChunkRows % kCopyRows == 0, "whole rows per copy round");
  static_assert(kRowsPerWarp <= 16, "a block of 16 rows is one or more whole warps");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory of a CTA");
  // Where column `col` of a row lives: its thread in the row, and its place among that thread's kCols.
  static constexpr __host__ __device__ int seg_of(int col) { return col / kPiece % kSegs; }
  static constexpr __host__ __device__ int local_of(int col) { return col / kPiece / kSegs * kPiece + col % kPiece; }
};

template <class T, int kDim>
__global__ void __launch_bounds__(RotateShape<kDim>::kThreads, RotateShape<kDim>::kCtasPerSm)
    rotate_kernel(const fa3_quantize_params p) {
  using S = RotateShape<kDim>;
  constexpr int kCols = S::kCols, kSegs = S::kSegs, kPiece = S::kPiece;
  extern __shared__ uint4 smem[];  // the ring [kStages][kChunkBytes], then the signs [kSegs][kFlipWords]
  uint8_t* const ring = reinterpret_cast<uint8_t*>(smem);
  uint32_t* const flips = reinterpret_cast<uint32_t*>(ring + S::kStages * S::kChunkBytes);
  const Chunks g = chunks_of(p);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  // The rotation's signs as sign bits of 16-bit pairs (sign_flips' words), each thread's in its
  // order, read from shared memory with its columns (in registers they would be 32 at d128).
  for (int w = threadIdx.x; w < kDim / 2; w += S::kThreads) {
    const uint32_t word = (hadamard_sign(p.seed, 2 * w) < 0.f ? 0x8000u : 0u) |
                          (hadamard_sign(p.seed, 2 * w + 1) < 0.f ? 0x80000000u : 0u);
    flips[S::seg_of(2 * w) * S::kFlipWords + S::local_of(2 * w) / 2] = word;
  }

  // Copies: 16-byte piece c8 of rows r0, r0 + kCopyRows, ..., to the same place in the ring's rows.
  const int r0 = threadIdx.x / S::kPiecesPerRow, c8 = threadIdx.x % S::kPiecesPerRow;
  const int copy_off = r0 * S::kRowBytes + 16 * c8;
  const int64_t copy_step = int64_t(S::kCopyRows) * p.in.row_stride;
  // Rows past the sequence's end land as zeros (they join the max as such, and are not stored), so
  // that the transform reads every row without a branch. A chunk past the last copies nothing.
  auto fetch = [&](int t, int stage) {
    const Chunk<T> c = chunk_at<T>(p, g, t, 0);
    const T* src = c.in + (c.first + r0) * p.in.row_stride + c8 * 8;
    uint8_t* dst = ring + stage * S::kChunkBytes + copy_off;
    if (t < g.count) {
#pragma unroll
      for (int i = 0; i < S::kCopies; ++i, src += copy_step, dst += S::kCopyRows * S::kRowBytes) {
        if (c.first + r0 + i * S::kCopyRows < c.end)
          hopper::cp_async_16(dst, src);
        else
          hopper::cp_async_zero_16(dst, p.in.data);
      }
    }
    hopper::cp_async_commit();
  };

  // The transform: thread `seg` of row `row` (a row's threads are adjacent lanes); its value e is
  // column (seg + kSegs * (e / kPiece)) * kPiece + e % kPiece.
  const int row = threadIdx.x / kSegs, seg = threadIdx.x % kSegs;
  const int seg_off = row * S::kRowBytes + 2 * kPiece * seg;
  auto load_segment = [&](const uint8_t* at, float (&x)[kCols]) {
#pragma unroll
    for (int j = 0; j < kCols / 8; ++j) {  // 8 columns of piece j * 8 / kPiece
      const int piece = j * 8 / kPiece, unit = j % (kPiece / 8);
      const uint4 raw = *reinterpret_cast<const uint4*>(at + 2 * kSegs * kPiece * piece + 16 * unit);
      const uint4 f = *reinterpret_cast<const uint4*>(flips + seg * S::kFlipWords + 4 * j);
      float x8[8];
      hopper::to_float8<T>(make_uint4(raw.x ^ f.x, raw.y ^ f.y, raw.z ^ f.z, raw.w ^ f.w), x8);
#pragma unroll
      for (int e = 0; e < 8; ++e) x[8 * j + e] = x8[e];
    }
  };
  auto transform_segment = [&](float (&x)[kCols]) {
#pragma unroll
    for (int h = 1; h < kPiece; h <<= 1) butterfly_in_thread(x, h);
    butterfly_across<kSegs>(x, seg);  // (the thread with bit m set holds the higher column)
#pragma unroll
    for (int o = kPiece; o < kCols; o <<= 1) butterfly_in_thread(x, o);  // stages h = o * kSegs
  };

  // The warps' maxima, two sets: a chunk's are read after its barrier, and a warp can write the set
  // again only two chunks on, past the next chunk's barrier, which every reader has reached by then.
  __shared__ float warp_amax[2][S::kWarps];
  const float norm = rotation_norm(p.head_dim);
  const int warps_per_block = p.block_size / S::kRowsPerWarp;  // 1..16
  const int blk0 = warp / warps_per_block * warps_per_block;
  const int block_shift = __ffs(p.block_size) - 1;  // blocks of 16..128 rows: powers of two
  const int64_t out_row = p.out.row_stride;

  constexpr int kAhead = S::kStages - 1;  // chunks in flight beside the one at work
  static_assert(kAhead == 2, "the prologue below fills two stages");
  int t = blockIdx.x;  // launch_typed's grid: at most one CTA per chunk
  fetch(t, 0);
  fetch(t + gridDim.x, 1);
  hopper::cp_async_wait<kAhead - 1>();
  __syncthreads();  // the first chunk and the signs
  for (int stage = 0, parity = 0; t < g.count; t += gridDim.x, parity ^= 1) {
    // The stage kAhead chunks on held the previous chunk, read by every thread before the last
    // barrier.
    fetch(t + kAhead * gridDim.x, stage == 0 ? S::kStages - 1 : stage - 1);
    const Chunk<T> c = chunk_at<T>(p, g, t, 0);
    const int pos = c.first + row;
    float x[kCols];
    load_segment(ring + stage * S::kChunkBytes + seg_off, x);
    transform_segment(x);
    float m = 0.f;
#pragma unroll
    for (int e = 0; e < kCols; ++e) m = fmaxf(m, fabsf(x[e]));
    m = warp_max(m);
    if (lane == 0) warp_amax[parity][warp] = m;
    hopper::cp_async_wait<kAhead - 1>();  // this thread's pieces of the next chunk
    __syncthreads();             // everyone's: the next chunk and this one's maxima
    float amax = 0.f;
#pragma unroll
    for (int w = 0; w < S::kWarps; ++w)
      if (w >= blk0 && w < blk0 + warps_per_block) amax = fmaxf(amax, warp_amax[parity][w]);
    const float factor = quant_factor(amax);
    if (pos < c.end) {
      uint8_t* dst = out_at(p, c, seg * kPiece) + pos * out_row;
#pragma unroll
      for (int j = 0; j < kCols / kPiece; ++j, dst += kSegs * kPiece) {
        const uint2 lo = e4m3x8(x + kPiece * j, factor);
        if constexpr (kPiece == 16) {
          const uint2 hi = e4m3x8(x + kPiece * j + 8, factor);
          *reinterpret_cast<uint4*>(dst) = make_uint4(lo.x, lo.y, hi.x, hi.y);
        } else {
          *reinterpret_cast<uint2*>(dst) = lo;
        }
      }
    }
    const int block_first = c.first + warp * S::kRowsPerWarp;  // the warp that starts a block writes its descale
    if (lane == 0 && warp == blk0 && block_first < c.end)
      descale_at(p, c, block_first >> block_shift) = descale_of(amax, norm);
    stage = stage == S::kStages - 1 ? 0 : stage + 1;
  }
  // The groups still queued are of chunks past the last: empty.
}

template <class T>
Status launch_typed(const fa3_quantize_params& p, cudaStream_t stream) {
  const int chunks = int(chunk_count(p));  // <= 2^30: validate_quantize
  if (chunks == 0) return detail::ok();
  const int lanes = (p.head_dim + 7) / 8;
  auto go = [&](auto lanes_c) {
    constexpr int kL = decltype(lanes_c)::value;
    const dim3 one_each{unsigned(chunks)};
    if (!p.hadamard) return hopper::launch<quantize_kernel<T, kL, false>>(one_each, kWarps * 32, 0, stream, p);
    if (p.block_size > kChunkRows) return hopper::launch<quantize_kernel<T, kL, true>>(one_each, kWarps * 32, 0, stream, p);
    // As many walking CTAs as the SMs hold at once. (A power-of-two head_dim: 8 * kL.)
    using S = RotateShape<8 * kL>;
    int sms = 0;
    FA3_TRY(hopper::sm_count(&sms));
    const dim3 walkers{unsigned(std::min(chunks, sms * S::kCtasPerSm))};
    return hopper::launch<rotate_kernel<T, 8 * kL>>(walkers, S::kThreads, S::kSmemBytes, stream, p);
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
