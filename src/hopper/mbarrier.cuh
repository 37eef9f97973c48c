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

// Whether the phase with this parity has completed, without waiting (and without acquiring: a
// caller that goes on to read what the phase published still waits for it).
__device__ __forceinline__ bool mbarrier_phase_done(uint64_t* bar, uint32_t parity) {
  return ptx::mbarrier_test_wait_parity(bar, parity);
}

// Arrival on the barrier at the same offset in the shared memory of cluster CTA `rank` (which may
// be this CTA). CCCL has no `mapa` to form the address, and its remote arrive is release at cluster
// scope, a fence that stalls the arriving warp (the forward kernel ran 35-40% slower with it);
// a consumer's release only follows its own reads of the stage, which (as for
// a local arrive) release at CTA scope orders.
__device__ __forceinline__ void mbarrier_arrive_cluster(uint64_t* bar, uint32_t rank) {
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(smem_u32(bar)), "r"(rank));
  asm volatile("mbarrier.arrive.release.cta.shared::cluster.b64 _, [%0];" ::"r"(remote) : "memory");
}

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

// The barriers of one ring, living in shared memory. With a ring shared by a cluster (every CTA's
// producer multicasts part of each stage into all CTAs' buffers), a stage is free only when the
// consumers of all CTAs released it: `empty` then counts consumers x cluster CTAs and the
// consumers release with consumer_release_cluster.
template <int kStages>
struct PipelineBarriers {
  uint64_t full[kStages];
  uint64_t empty[kStages];

  // One thread: full expects `producers` arrivals (the producer's expect_tx; or every thread that
  // wrote the stage by itself), empty `consumers` arrivals (one per releasing thread: a warpgroup's
  // thread 0, or every thread that read the stage by itself).
  __device__ void init(uint32_t consumers, uint32_t producers = 1) {
    for (int s = 0; s < kStages; ++s) {
      mbarrier_init(&full[s], producers);
      mbarrier_init(&empty[s], consumers);
    }
  }
  __device__ __forceinline__ void producer_acquire(const PipelineState<kStages>& st) {
    mbarrier_wait(&empty[st.index], st.phase ^ 1);
  }
  __device__ __forceinline__ void consumer_wait(const PipelineState<kStages>& st) {
    mbarrier_wait(&full[st.index], st.phase);
  }
  // `count` > 1: that many arrivals at once, one thread releasing for others whose reads are
  // ordered before its own (by a barrier they passed).
  __device__ __forceinline__ void consumer_release(const PipelineState<kStages>& st, uint32_t count = 1) {
    if (count == 1) mbarrier_arrive(&empty[st.index]);
    else (void)ptx::mbarrier_arrive(&empty[st.index], count);
  }
  // Called by the first `cluster_ctas` threads of a warp together: thread r signals CTA r.
  __device__ __forceinline__ void consumer_release_cluster(const PipelineState<kStages>& st, uint32_t rank) {
    mbarrier_arrive_cluster(&empty[st.index], rank);
  }
};

}  // namespace fa3::hopper
