// Per-thread asynchronous copies, global -> shared (cp.async, sm_80+): a thread queues 16-byte
// copies that land in shared memory without passing through its registers, groups them, and later
// waits for all but its newest groups. A thread that reads only the bytes it copied itself needs no
// barrier: cp.async.wait_group makes its own completed copies visible to it (PTX ISA, "cp.async").
// CCCL's cuda::ptx wraps the bulk (TMA) forms only, so these are inline PTX; every one carries a
// "memory" clobber so that the compiler keeps shared-memory reads after their wait (the CUDA
// toolkit's __pipeline_wait_prior has none).
#pragma once
#include <cstdint>

namespace fa3::hopper {

// 16 bytes from global `src` to shared `dst` (both 16-byte aligned), cached in L2 only (.cg): the
// data is read once.
__device__ __forceinline__ void cp_async_16(void* dst, const void* src) {
  const uint32_t smem = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem), "l"(src) : "memory");
}

// 16 zero bytes to shared `dst`, as one of the group's copies, reading nothing (src-size 0); `src`
// must still be a global address.
__device__ __forceinline__ void cp_async_zero_16(void* dst, const void* src) {
  const uint32_t smem = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, 0;" ::"r"(smem), "l"(src) : "memory");
}

// 16 bytes from `src`, or (copy false) 16 zero bytes reading nothing, by one instruction: the
// source size is an operand, so a caller that predicates rows needs no second address.
__device__ __forceinline__ void cp_async_16_or_zero(void* dst, const void* src, bool copy) {
  const uint32_t smem = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem), "l"(src), "r"(copy ? 16 : 0) : "memory");
}

// Closes the thread's current group of copies (an empty group is legal and completes at once).
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

// Waits until at most kNewest of the thread's groups are still in flight.
template <int kNewest>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kNewest) : "memory");
}

}  // namespace fa3::hopper
