// Small sm_90a building blocks with no attention knowledge: addresses, lane election, named
// barriers, register reallocation and proxy fences.  Inline PTX only where CCCL has no wrapper.
#pragma once
#include <cstdint>

#include <cuda/ptx>

namespace fa3::hopper {

namespace ptx = cuda::ptx;

constexpr int kWarpSize = 32;
constexpr int kWarpgroupSize = 128;

// Shared-space address (what descriptors, TMA and stmatrix take), not a generic pointer.
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// True in exactly one lane of the (fully active) warp.
__device__ __forceinline__ bool elect_one() {
  uint32_t pred = 0;
  asm volatile(
      "{\n.reg .pred P;\n"
      "elect.sync _|P, 0xffffffff;\n"
      "selp.u32 %0, 1, 0, P;\n}"
      : "=r"(pred));
  return pred != 0;
}

// The warpgroup index as a warp-uniform value (the shuffle tells the compiler it is uniform,
// so role branches compile to uniform branches and setmaxnreg sees one path per warpgroup).
__device__ __forceinline__ int warpgroup_index() {
  return __shfl_sync(0xffffffff, static_cast<int>(threadIdx.x) / kWarpgroupSize, 0);
}

// Named barriers: id 0 is __syncthreads; 1..15 are free. `threads` counts every thread that
// takes part (bar.sync and bar.arrive together), a multiple of 32.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// The same without .aligned: warps may reach it from different code (e.g. two template
// instantiations of one step), which bar.sync's alignment rule forbids (compute-sanitizer synccheck).
__device__ __forceinline__ void named_barrier_sync_unaligned(int id, int threads) {
  asm volatile("barrier.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive_unaligned(int id, int threads) {
  asm volatile("barrier.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// Thread-block clusters. A kernel launched without a cluster runs as a cluster of one CTA, so
// these work (and cost a CTA-wide barrier) there too.
__device__ __forceinline__ uint32_t cluster_ctarank() { return ptx::get_sreg_cluster_ctarank(); }
// Every thread of every CTA of the cluster: memory operations before it (e.g. mbarrier inits) are
// visible cluster-wide after it.
__device__ __forceinline__ void cluster_sync() {
  ptx::barrier_cluster_arrive(ptx::sem_release);
  ptx::barrier_cluster_wait(ptx::sem_acquire);
}

// Move registers between warpgroups (needs a register cap at kernel entry: __launch_bounds__(n, 1)).
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  static_assert(kRegs % 8 == 0 && kRegs >= 24 && kRegs <= 256, "setmaxnreg takes multiples of 8 in [24, 256]");
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  static_assert(kRegs % 8 == 0 && kRegs >= 24 && kRegs <= 256, "setmaxnreg takes multiples of 8 in [24, 256]");
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

// Two consecutive floats from shared memory (8-byte aligned) by a 32-bit shared address: a pointer
// into dynamic shared memory computed at run time otherwise becomes a generic 64-bit load (LD.E),
// slower and two address registers each. volatile: it stays after the barrier wait that guards it.
__device__ __forceinline__ float2 ld_shared_f32x2(uint32_t addr) {
  float2 v;
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];" : "=f"(v.x), "=f"(v.y) : "r"(addr));
  return v;
}

// One 32-bit word from / to shared memory by a 32-bit shared address (as ld_shared_f32x2).
__device__ __forceinline__ uint32_t ld_shared_u32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.b32 %0, [%1];" : "=r"(v) : "r"(addr));
  return v;
}
// Four consecutive words (16 bytes, 16-byte aligned) from shared memory.
__device__ __forceinline__ uint4 ld_shared_u32x4(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
  return v;
}
__device__ __forceinline__ void st_shared_u32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;" ::"r"(addr), "r"(v) : "memory");
}
// Four floats (16 bytes, 16-byte aligned) from / to shared memory.
__device__ __forceinline__ float4 ld_shared_f32x4(uint32_t addr) {
  float4 v;
  asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(addr));
  return v;
}
__device__ __forceinline__ void st_shared_f32x4(uint32_t addr, float4 v) {
  asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w)
               : "memory");
}

// Four fp32 adds into 16 contiguous global bytes, performed in L2 (no value returned): one
// REDG.128 instead of four (CCCL's red wrappers cover the cluster's shared memory only).
__device__ __forceinline__ void red_add_f32x4(float* addr, float a, float b, float c, float d) {
  asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(addr), "f"(a), "f"(b), "f"(c), "f"(d) : "memory");
}

// Ordinary shared-memory stores (st.shared, stmatrix) become visible to the async proxy (TMA, wgmma)
// only after this fence in each writing thread, followed by a barrier.
__device__ __forceinline__ void fence_view_async_shared() { ptx::fence_proxy_async(ptx::space_shared); }

// Ends the basic block once `never_minus_one` is computed (a branch that is never taken; the
// value must never be -1, e.g. a sum of exponentials). ptxas schedules within basic blocks and
// hoists wgmma waits above independent work there; code before this call stays before such a wait.
// The branch body must return: with a trap there ptxas serialises every wgmma (C7512).
__device__ __forceinline__ void end_block_after(float never_minus_one) {
  if (never_minus_one == -1.f) asm volatile("nanosleep.u32 1;");
}

__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// MUFU.TANH: max relative error about 2^-11, below bf16's rounding of P.
__device__ __forceinline__ float tanh_approx(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace fa3::hopper
