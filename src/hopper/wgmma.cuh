// Warpgroup MMA (wgmma.mma_async): shared-memory matrix descriptors, the fence/commit/wait
// protocol, and the generated per-N instruction wrappers.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "src/hopper/wgmma_ops.cuh"

namespace fa3::hopper {

// Matrix descriptor for a tile stored with the 128-byte swizzle (PTX ISA "Matrix Descriptor Format"):
// bits 0-13 start address >> 4, 16-29 leading byte offset >> 4, 32-45 stride byte offset >> 4,
// 62-63 swizzle mode (1 = 128B). Tiles start on 1024-byte boundaries, so base_offset stays 0.
__device__ __forceinline__ uint64_t make_smem_desc(uint32_t smem_addr, uint32_t lbo_bytes, uint32_t sbo_bytes) {
  return uint64_t((smem_addr & 0x3FFFF) >> 4) | (uint64_t((lbo_bytes & 0x3FFFF) >> 4) << 16) |
         (uint64_t((sbo_bytes & 0x3FFFF) >> 4) << 32) | (uint64_t(1) << 62);
}

// Moves a descriptor's start address by `bytes` (14-bit field: smem addresses < 256 KB never carry out).
__device__ __forceinline__ uint64_t desc_advance(uint64_t desc, uint32_t bytes) { return desc + (bytes >> 4); }

// Required before the first wgmma of a batch and whenever registers it reads or accumulates into
// were touched by ordinary instructions since the last wgmma.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Waits until at most N committed groups are still in flight.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  static_assert(N >= 0 && N <= 7, "wgmma.wait_group takes 0..7");
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Pins the register values of an accumulator/fragment at this point of the program, so the
// compiler neither reads them before an in-flight wgmma finished nor moves writes across its issue.
template <int N>
__device__ __forceinline__ void fence_operand(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}

// The 16-bit element types fa3 multiplies: their wgmma wrappers, k per wgmma, and the f32x2 ->
// packed conversion.
template <class T>
struct Mma16;

// One k-step of P (8 accumulator elements of a 16-key block: rows g, g+8 at columns 2t, 2t+1 and
// 8+2t, 9+2t) as the 16-bit A fragment of the PV wgmma: the accumulator's and the A fragment's
// layouts agree, two elements per register.
template <class M>
__device__ __forceinline__ void pack16_step(const float* e, uint32_t (&a)[4]) {
  a[0] = M::pack(e[0], e[1]);
  a[1] = M::pack(e[2], e[3]);
  a[2] = M::pack(e[4], e[5]);
  a[3] = M::pack(e[6], e[7]);
}

template <>
struct Mma16<__nv_bfloat16> {
  static constexpr int kK = 16;  // the K of one wgmma
  template <int N>
  using Op = WgmmaBf16<N>;
  __device__ __forceinline__ static uint32_t pack(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
  __device__ __forceinline__ static void pack_step(const float* e, uint32_t (&a)[4]) { pack16_step<Mma16>(e, a); }
};

template <>
struct Mma16<__half> {
  static constexpr int kK = 16;
  template <int N>
  using Op = WgmmaF16<N>;
  __device__ __forceinline__ static uint32_t pack(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
  __device__ __forceinline__ static void pack_step(const float* e, uint32_t (&a)[4]) { pack16_step<Mma16>(e, a); }
};

// e4m3 operands (float8 e4m3fn): k = 32 per wgmma and both operands K-major (no transpose
// immediates). A register-resident A fragment holds four e4m3 per register: registers 0-3 are
// (row g, k 4t..4t+3), (g+8, 4t..), (g, 16+4t..), (g+8, 16+4t..) of a 64x32 slice, lowest k in the
// low byte (lane 4g + t of warp w, rows counted from 16w).
struct MmaE4m3 {
  static constexpr int kK = 32;
  // The wrappers under the 16-bit types' calling form: only K-major operands exist (TransA/TransB 0).
  template <int N>
  struct Op {
    template <int kTransB, int kTransA = 0, int kRegs>
    __device__ __forceinline__ static void ss(float (&d)[kRegs], uint64_t a, uint64_t b, int scale_d) {
      static_assert(kTransB == 0 && kTransA == 0, "e4m3 wgmma takes K-major operands only");
      WgmmaE4m3<N>::ss(d, a, b, scale_d);
    }
    template <int kTransB, int kRegs>
    __device__ __forceinline__ static void rs(float (&d)[kRegs], const uint32_t (&a)[4], uint64_t b, int scale_d) {
      static_assert(kTransB == 0, "e4m3 wgmma takes a K-major B only");
      WgmmaE4m3<N>::rs(d, a, b, scale_d);
    }
  };
  // cvt.e4m3x2 puts its first operand in the upper byte (saturating to +-448, NaN to 0x7f).
  __device__ __forceinline__ static uint32_t pack4(float k0, float k1, float k2, float k3) {
    uint16_t lo, hi;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(lo) : "f"(k1), "f"(k0));
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(hi) : "f"(k3), "f"(k2));
    return uint32_t(lo) | (uint32_t(hi) << 16);
  }
  // One k-step of P (16 accumulator elements of a 32-key block) as the e4m3 A fragment, without
  // moving data between lanes: the thread holds keys 2t, 2t+1, 8+2t, 9+2t (+16) of rows g and g+8,
  // and register j gets four of them where the A fragment wants keys 4t..4t+3 (+16). So A position
  // 16G + 4t + q of the step holds key 16G + 2t + (q & 1) + 8 (q >> 1): a permutation of the keys
  // inside each 16-key group, which the PV's B operand (V^T) carries too (v_transpose.cuh), so the
  // contraction over keys is unchanged (FlashAttention-3's choice; the primer's shuffle form costs
  // 16 shuffles per thread and block).
  __device__ __forceinline__ static void pack_step(const float* e, uint32_t (&a)[4]) {
    a[0] = pack4(e[0], e[1], e[4], e[5]);
    a[1] = pack4(e[2], e[3], e[6], e[7]);
    a[2] = pack4(e[8], e[9], e[12], e[13]);
    a[3] = pack4(e[10], e[11], e[14], e[15]);
  }
  // The key a P position holds (the permutation above), inside a 32-key step.
  __host__ __device__ static constexpr int key_of_position(int pos) {
    return (pos & 16) + 2 * ((pos & 15) >> 2) + (pos & 1) + 8 * ((pos >> 1) & 1);
  }
};

// What the kernels need to know of an operand type: its wgmma traits, its size, and the type the
// forward writes O in (FP8 attention writes bf16: an e4m3 O would lose most of its precision).
template <class T>
struct OperandTraits {
  using Mma = Mma16<T>;
  using Out = T;
  static constexpr int kBytes = 2;
};
template <>
struct OperandTraits<__nv_fp8_e4m3> {
  using Mma = MmaE4m3;
  using Out = __nv_bfloat16;
  static constexpr int kBytes = 1;
};

// Accumulator fragment of m64nN (f32): element i of thread (warp w, lane = 4g + t) sits at
//   row = 16w + g + 8*((i >> 1) & 1),   col = 8*(i >> 2) + 2t + (i & 1).
__host__ __device__ __forceinline__ constexpr int acc_row(int i) { return 8 * ((i >> 1) & 1); }  // + 16w + g
__host__ __device__ __forceinline__ constexpr int acc_col(int i) { return 8 * (i >> 2) + (i & 1); }  // + 2t

}  // namespace fa3::hopper
