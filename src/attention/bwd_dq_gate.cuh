// Deterministic mode of a tile whose consumers add dQ from registers (the query-rows tile,
// bwd_config.h): the producer warpgroup's warps 1-3 order the consumers' adds by key block (the dQ
// writer's order, bwd_dq_adds_before). Each consumer warpgroup has a counter of its own per query
// block (kBwdDqSemaphoreStride leaves room): the two add disjoint head dims, so neither waits for
// the other's previous key block.
//  - Warp 1 opens: per step, for warpgroup 0 and then 1, it waits until the key blocks that come
//    first have released the warpgroup's counter, and meets the warpgroup at kBarDqMayAdd + c. Both
//    sides sync, so neither can run a step ahead; the poll for the next step starts as soon as the
//    warpgroup passed, most of a step before its next adds.
//  - Warp 2 + c closes: it meets warpgroup c at kBarDqAdded + c after the warpgroup issued the
//    step's adds, and releases the counter. A release waits for the adds to complete (about as
//    long as a step under the backward's load; the dQ writer measured ~3 us for its bulk adds,
//    bwd_dq_writer.cuh), so it runs in a warp of its own, off the path of the next step's turn.
//  - The consumers meet both at named barriers, not at a spin loop: their GEMMs are in flight where
//    the adds start (bwd_mma_query_rows.cuh), and a poll loop there would make ptxas fence them.
//    The barriers are the unaligned form (bwd_barrier_sync): gate and consumers reach them from
//    different code.
//  - The release is a barrier (every consumer thread's adds precede its arrival) followed by one
//    thread's gpu-scope release, the pattern of a split-K serial reduction: in the PTX memory model
//    the adds precede the release in causality order, so the key block that acquires the counter
//    adds after them.
#pragma once
#include <cuda/atomic>

#include "src/attention/bwd_load.cuh"
#include "src/attention/bwd_params.h"
#include "src/attention/bwd_smem.cuh"

namespace fa3::attn {

template <class Cfg>
struct BwdDqGate {
  static_assert(!Cfg::kDqWriter, "tiles that stage dQ order it in the dQ writer (bwd_dq_writer.cuh)");
  static constexpr int kConsumers = 2;
  const BwdKernelParams& p;

  // The counter of warpgroup c for the query block of step `cur`.
  template <bool kVarlen>
  __device__ __forceinline__ int* counter(const SeqlenInfo<kVarlen>& seq, const BwdWalk<Cfg>& walk,
                                          const typename BwdWalk<Cfg>::Cursor& cur, int c) const {
    const int64_t block = bwd_ws_row0<Cfg::kBlockM>(p, seq, cur.head) / Cfg::kBlockM + walk.m_block(cur);
    return p.dq_semaphore + block * kBwdDqSemaphoreStride + c;
  }

  template <bool kVarlen>
  __device__ void open(int n_block, int kv_head, const SeqlenInfo<kVarlen>& seq) const {
    const BwdWalk<Cfg> walk(n_block, kv_head, seq, p);
    const bool leader = threadIdx.x % hopper::kWarpSize == 0;
    auto cur = walk.begin();
    for (int it = 0; it < walk.steps; ++it, walk.advance(cur)) {
      const int want = bwd_dq_adds_before<Cfg>(n_block, walk.m_block(cur), seq, p);
#pragma unroll
      for (int c = 0; c < kConsumers; ++c) {
        if (leader) {
          const cuda::atomic_ref<int, cuda::thread_scope_device> count(*counter(seq, walk, cur, c));
          while (count.load(cuda::memory_order_acquire) < want) __nanosleep(32);
        }
        bwd_barrier_sync(kBarDqMayAdd + c, kBwdDqGateThreads);
      }
    }
  }

  template <bool kVarlen>
  __device__ void close(int n_block, int kv_head, const SeqlenInfo<kVarlen>& seq, int c) const {
    const BwdWalk<Cfg> walk(n_block, kv_head, seq, p);
    const bool leader = threadIdx.x % hopper::kWarpSize == 0;
    auto cur = walk.begin();
    for (int it = 0; it < walk.steps; ++it, walk.advance(cur)) {
      bwd_barrier_sync(kBarDqAdded + c, kBwdDqGateThreads);
      if (leader)
        cuda::atomic_ref<int, cuda::thread_scope_device>(*counter(seq, walk, cur, c)).fetch_add(1, cuda::memory_order_release);
    }
  }
};

}  // namespace fa3::attn
