// The dQ writer: one elected lane of the producer warpgroup's warp 1 takes the consumers' staged
// 64 x 64 dQ parts in the order they make them (BwdWalk; d128: both warpgroups' parts each step,
// d64: the step's warpgroup) and reduce-adds each into the fp32 workspace with one
// cp.reduce.async.bulk, off the consumers' path (FlashAttention-3 gives this to a warp of its own).
// Deterministic mode: before a step's adds, the lane waits on the query block's semaphore for the
// parts that come first (bwd_dq_adds_before), and releases the step's once its adds completed: when
// it next has to wait anyway (its next part not staged yet, or the next query block's turn not
// come), else after issuing the next step's adds.
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

  // Deterministic mode: the semaphore of the last step's adds (one bulk group), released once they
  // completed: `kOlder` = 1 waits only for the groups before the newest (the previous step's), so
  // the writer never stalls on the adds it just issued.
  template <int kOlder>
  __device__ __forceinline__ static void release(const BwdKernelParams& p, int& pending) {
    if (pending < 0) return;
    hopper::ptx::cp_async_bulk_wait_group(hopper::ptx::n32_t<kOlder>{});
    hopper::ptx::fence_proxy_async();  // the adds' async-proxy writes -> the release
    cuda::atomic_ref<int, cuda::thread_scope_device>(p.dq_semaphore[pending])
        .fetch_add(Cfg::kDqParts, cuda::memory_order_release);
    pending = -1;
  }

  __device__ void run(int n_block, int kv_head, int batch) const {
    if (!hopper::elect_one()) return;
    const FwdKernelParams& f = p.fwd;
    const SeqlenInfo<false> seq(f, batch);
    const BwdWalk<Cfg> walk(n_block, kv_head, seq, p);
    constexpr int kM = Cfg::kBlockM, kD = Cfg::kHeadDim;
    constexpr uint32_t kPartBytes = Smem::kDqPartFloats * sizeof(float);
    int pending = -1;
    auto cur = walk.begin();
    for (int it = 0; it < walk.steps; ++it, walk.advance(cur)) {
      const int m = walk.m_block(cur);
      const int64_t bh = int64_t(batch) * f.heads_q + cur.head;
      const int sem = int(bh * (p.seqlen_q_rounded / kM) + m);
      // The warpgroup's k-th part (d128: one a step each; d64: every other step) is in buffer k % 2,
      // phase k / 2 % 2 of its ring.
      const int k = Cfg::kDqParts == 2 ? it : it >> 1;
      hopper::PipelineState<2> st;
      st.index = k & 1;
      st.phase = (k >> 1) & 1;
#pragma unroll
      for (int part = 0; part < Cfg::kDqParts; ++part) {
        const int wg = Cfg::kDqParts == 2 ? part : (it & 1);
        auto& ring = smem.bars().dq[wg];
        while (!hopper::ptx::mbarrier_try_wait_parity(&ring.full[st.index], st.phase))
          if (p.deterministic) release<0>(p, pending);  // idle anyway: let the next key block go
        if (p.deterministic && part == 0) {
          const cuda::atomic_ref<int, cuda::thread_scope_device> count(p.dq_semaphore[sem]);
          const int want = bwd_dq_adds_before<Cfg>(n_block, m, seq, p);
          if (count.load(cuda::memory_order_acquire) < want) {
            // Never wait while holding a release: with the rotating order the key blocks form a
            // ring, and writers each waiting with their last add unreleased deadlock.
            release<0>(p, pending);
            while (count.load(cuda::memory_order_acquire) < want) __nanosleep(32);
          }
          hopper::ptx::fence_proxy_async();  // the adds before ours (acquired) -> our bulk ops
        }
        float* dst = p.dq_accum + (bh * p.seqlen_q_rounded + int64_t(m) * kM) * kD + part * Smem::kDqPartFloats;
        hopper::ptx::cp_reduce_async_bulk(hopper::ptx::space_global, hopper::ptx::space_shared, hopper::ptx::op_add,
                                          dst, smem.dq(wg, st.index), kPartBytes);
      }
      hopper::tma_store_commit();     // this step's adds: one bulk group
      hopper::tma_store_wait_read();  // their staging may be rewritten
#pragma unroll
      for (int part = 0; part < Cfg::kDqParts; ++part)
        smem.bars().dq[Cfg::kDqParts == 2 ? part : (it & 1)].consumer_release(st);
      if (p.deterministic) {
        release<1>(p, pending);  // the previous step's group
        pending = sem;
      }
    }
    release<0>(p, pending);
    hopper::ptx::cp_async_bulk_wait_group(hopper::ptx::n32_t<0>{});  // before the CTA's smem goes away
  }
};

}  // namespace fa3::attn
