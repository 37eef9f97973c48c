// mbarrier-based pipelines (CCCL cuda::ptx): a ring of `kStages` buffers, each with a "full"
// barrier (producer's expect_tx + the TMA bytes) and an "empty" barrier (one arrive per consumer).
#pragma once
#include <cstdint>

#include "src/hopper/arch.cuh"

namespace fa3::hopper {

__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t count) { ptx::mbarrier_init(bar, count); }

// Makes the inits visible to the async proxy (TMA completes on these barriers) before any use.
__device__ __forceinline__ void mbarrier_init_fence() {
  ptx::fence_mbarrier_init(ptx::sem_release, ptx::scope_cluster);
}

__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t parity) {
  while (!ptx::mbarrier_try_wait_parity(bar, parity)) {
  }
}

__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) { (void)ptx::mbarrier_arrive(bar); }

// The producer's arrival that also announces how many bytes the TMA copies will deliver.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  (void)ptx::mbarrier_arrive_expect_tx(ptx::sem_release, ptx::scope_cta, ptx::space_shared, bar, bytes);
}

// Position in a ring of kStages buffers. The phase bit flips each time the index wraps; a consumer
// waits on full[index] with `phase`, the producer on empty[index] with `phase ^ 1` (a fresh barrier
// counts as having completed the phase before phase 0, so the producer's first pass does not block).
template <int kStages>
struct PipelineState {
  int index = 0;
  uint32_t phase = 0;

  __device__ __forceinline__ void advance() {
    if (++index == kStages) {
      index = 0;
      phase ^= 1;
    }
  }
};

// The barriers of one ring, living in shared memory.
template <int kStages>
struct PipelineBarriers {
  uint64_t full[kStages];
  uint64_t empty[kStages];

  // One thread: full expects 1 arrival (the producer's expect_tx), empty one per consumer.
  __device__ void init(uint32_t consumers) {
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(&full[s], 1);
      mbarrier_init(&empty[s], consumers);
    }
  }
  __device__ __forceinline__ void producer_acquire(const PipelineState<kStages>& st) {
    mbarrier_wait(&empty[st.index], st.phase ^ 1);
  }
  __device__ __forceinline__ void consumer_wait(const PipelineState<kStages>& st) {
    mbarrier_wait(&full[st.index], st.phase);
  }
  __device__ __forceinline__ void consumer_release(const PipelineState<kStages>& st) {
    mbarrier_arrive(&empty[st.index]);
  }
};

}  // namespace fa3::hopper
