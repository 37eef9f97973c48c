// The dQ writer: an elected lane of the producer warpgroup's warp 1 takes the consumers' staged
// 64 x 64 dQ parts in the order they make them (BwdWalk; both warpgroups' parts each step) and
// reduce-adds each into the fp32
// workspace with one cp.reduce.async.bulk, off the consumers' path (FlashAttention-3 gives this to a
// warp of its own).
// Deterministic mode: before a step's adds, the lane waits on the query block's semaphore for the
// key blocks that come first (bwd_dq_adds_before), and releases it once the adds completed. The
// next key block waits for that release, so the time from an add's issue to its completion sits on
// the chain of key blocks; a lane that also waited for it before taking its next step's parts was
// held to one step per completion and staged late (deterministic mode at 0.55-0.8 of the default,
// perf-log step 74; the throughputs put the completion near 3 us under the backward's own load). So
// in deterministic mode warps 1-3 take the steps in turn: each waits for its turn (the adds stay in
// order, as the staging rings' parities need), issues its step's adds, hands the turn on, and only
// then waits for their completion and releases the semaphore while the other two issue.
#pragma once
#include <cuda/atomic>

#include "src/attention/bwd_load.cuh"
#include "src/attention/bwd_params.h"
#include "src/attention/bwd_smem.cuh"

namespace fa3::attn {

template <class Cfg>
struct BwdDqWriter {
  using Smem = BwdSmem<Cfg>;
  const BwdKernelParams& p;
  Smem smem;

  // Part q of step `it` comes from warpgroup q as its it-th staged part: buffer it % kBuffers,
  // phase it / kBuffers % 2 of its ring. It is the q-th 64 x 64 part of the query block's
  // accumulator tile (bwd_config.h: d128's column blocks, d64's row blocks).
  static_assert(Cfg::kDqParts == 2, "a dQ part per warpgroup and step");
  __device__ __forceinline__ static hopper::PipelineState<Cfg::kDqBuffers> staged(int it) {
    hopper::PipelineState<Cfg::kDqBuffers> st;
    st.index = it % Cfg::kDqBuffers;
    st.phase = (it / Cfg::kDqBuffers) & 1;
    return st;
  }

  // Writer `writer` of `writers` (bwd_kernel.cuh) takes steps writer, writer + writers, ...
  template <bool kVarlen>
  __device__ void run(int n_block, int kv_head, const SeqlenInfo<kVarlen>& seq, int writer, int writers) const {
    if (!hopper::elect_one()) return;
    const BwdWalk<Cfg> walk(n_block, kv_head, seq, p);
    constexpr int kM = Cfg::kBlockM, kD = Cfg::kHeadDim;
    constexpr uint32_t kPartBytes = Smem::kDqPartFloats * sizeof(float);
    // Several writers take turns (an mbarrier each, its j-th phase the writer's j-th step): the
    // staging rings' full barriers are waited on by parity, which tells the awaited phase from the
    // one before it only, so the steps' waits stay in order.
    uint64_t* turn = smem.bars().dq_turn;
    auto cur = walk.begin();
    for (int k = 0; k < writer; ++k) walk.advance(cur);
    for (int it = writer; it < walk.steps; it += writers) {
      const int m = walk.m_block(cur);
      const int64_t row0 = bwd_ws_row0<kM>(p, seq, cur.head);
      int* const sem = p.dq_semaphore + (row0 / kM + m) * kBwdDqSemaphoreStride;
      if (writers > 1) hopper::mbarrier_wait(&turn[writer], (it / writers) & 1);
#pragma unroll
      for (int q = 0; q < Cfg::kDqParts; ++q) {
        const auto st = staged(it);
        auto& ring = smem.bars().dq[q];
        ring.consumer_wait(st);
        // One wait per step (a poll per part cost step 74's d256 tile 10-25%: perf-log step 74).
        if (p.deterministic && q == 0) {
          const cuda::atomic_ref<int, cuda::thread_scope_device> count(*sem);
          const int want = bwd_dq_adds_before<Cfg>(n_block, m, seq, p);
          while (count.load(cuda::memory_order_acquire) < want) __nanosleep(32);
          hopper::ptx::fence_proxy_async();  // the adds before ours (acquired) -> our bulk ops
        }
        float* dst = p.dq_accum + (row0 + int64_t(m) * kM) * kD + q * Smem::kDqPartFloats;
        hopper::ptx::cp_reduce_async_bulk(hopper::ptx::space_global, hopper::ptx::space_shared, hopper::ptx::op_add,
                                          dst, smem.dq(q, st.index), kPartBytes);
      }
      hopper::tma_store_commit();     // this step's adds: one bulk group
      hopper::tma_store_wait_read();  // their staging may be rewritten
#pragma unroll
      for (int q = 0; q < Cfg::kDqParts; ++q) smem.bars().dq[q].consumer_release(staged(it));
      if (writers > 1) hopper::mbarrier_arrive(&turn[writer + 1 == writers ? 0 : writer + 1]);
      if (p.deterministic) {  // the step's adds completed: the next key block may add
        hopper::ptx::cp_async_bulk_wait_group(hopper::ptx::n32_t<0>{});
        hopper::ptx::fence_proxy_async();  // the adds' async-proxy writes -> the release
        cuda::atomic_ref<int, cuda::thread_scope_device>(*sem).fetch_add(1, cuda::memory_order_release);
      }
      for (int k = 0; k < writers; ++k) walk.advance(cur);
    }
    hopper::ptx::cp_async_bulk_wait_group(hopper::ptx::n32_t<0>{});  // before the CTA's smem goes away
  }
};

}  // namespace fa3::attn
