// The dQ writer: one elected lane of the producer warpgroup's warp 1 takes the consumers' staged
// 64 x 64 dQ parts in the order they make them (BwdWalk; d128: both warpgroups' parts each step,
// d64: the step's warpgroup, d256: two of each warpgroup) and reduce-adds each into the fp32 workspace with one
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

  // Deterministic mode: the semaphore of the last step's adds, released once they completed:
  // `kOlder` = the groups of the current step waits only for those before them (the previous
  // step's), so the writer never stalls on the adds it just issued.
  template <int kOlder>
  __device__ __forceinline__ static void release(const BwdKernelParams& p, int& pending) {
    if (pending < 0) return;
    hopper::ptx::cp_async_bulk_wait_group(hopper::ptx::n32_t<kOlder>{});
    hopper::ptx::fence_proxy_async();  // the adds' async-proxy writes -> the release
    cuda::atomic_ref<int, cuda::thread_scope_device>(p.dq_semaphore[pending])
        .fetch_add(Cfg::kDqParts, cuda::memory_order_release);
    pending = -1;
  }

  // Part q of step `it` comes from warpgroup `wg` as its k-th staged part, in buffer k % kBuffers,
  // phase k / kBuffers % 2 of its ring: d128 a part per warpgroup; d64 the step's warpgroup; split
  // d the warpgroups' two parts each, interleaved (0, 2, 1, 3). `part` is its column block of dQ.
  struct Staged {
    int wg, part;
    hopper::PipelineState<Cfg::kDqBuffers> st;
    __device__ __forceinline__ Staged(int it, int q) {
      const int j = Cfg::kSplitD ? (q >> 1) : 0;
      wg = Cfg::kSplitD ? (q & 1) : Cfg::kDqParts == 2 ? q : (it & 1);
      part = Cfg::kDqPartsPerWg * wg * (Cfg::kDqParts > 1) + j;
      const int k = Cfg::kDqParts == 1 ? it >> 1 : Cfg::kDqPartsPerWg * it + j;
      st.index = k % Cfg::kDqBuffers;
      st.phase = (k / Cfg::kDqBuffers) & 1;
    }
  };

  template <bool kVarlen>
  __device__ void run(int n_block, int kv_head, const SeqlenInfo<kVarlen>& seq) const {
    if (!hopper::elect_one()) return;
    const BwdWalk<Cfg> walk(n_block, kv_head, seq, p);
    constexpr int kM = Cfg::kBlockM, kD = Cfg::kHeadDim, kBuffers = Cfg::kDqBuffers;
    constexpr uint32_t kPartBytes = Smem::kDqPartFloats * sizeof(float);
    // Bulk groups a step commits: one for all its parts, or (a single staging buffer per
    // warpgroup) one per part, each waited for before its buffer is released.
    constexpr int kGroupsPerStep = kBuffers == 1 ? Cfg::kDqParts : 1;
    int pending = -1;
    auto cur = walk.begin();
    for (int it = 0; it < walk.steps; ++it, walk.advance(cur)) {
      const int m = walk.m_block(cur);
      const int64_t row0 = bwd_ws_row0(p, seq, cur.head);
      const int sem = int(row0 / kM + m);
#pragma unroll
      for (int q = 0; q < Cfg::kDqParts; ++q) {
        const Staged s(it, q);
        auto& ring = smem.bars().dq[s.wg];
        while (!hopper::ptx::mbarrier_try_wait_parity(&ring.full[s.st.index], s.st.phase))
          if (p.deterministic) release<0>(p, pending);  // idle anyway: let the next key block go
        if (p.deterministic && q == 0) {
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
        float* dst = p.dq_accum + (row0 + int64_t(m) * kM) * kD + s.part * Smem::kDqPartFloats;
        hopper::ptx::cp_reduce_async_bulk(hopper::ptx::space_global, hopper::ptx::space_shared, hopper::ptx::op_add,
                                          dst, smem.dq(s.wg, s.st.index), kPartBytes);
        if constexpr (kBuffers == 1) {
          hopper::tma_store_commit();
          hopper::tma_store_wait_read();  // its staging may be rewritten
          ring.consumer_release(s.st);
        }
      }
      if constexpr (kBuffers > 1) {
        hopper::tma_store_commit();     // this step's adds: one bulk group
        hopper::tma_store_wait_read();  // their staging may be rewritten
#pragma unroll
        for (int q = 0; q < Cfg::kDqParts; ++q) {
          const Staged s(it, q);
          smem.bars().dq[s.wg].consumer_release(s.st);
        }
      }
      if (p.deterministic) {
        release<kGroupsPerStep>(p, pending);  // the previous step's groups
        pending = sem;
      }
    }
    release<0>(p, pending);
    hopper::ptx::cp_async_bulk_wait_group(hopper::ptx::n32_t<0>{});  // before the CTA's smem goes away
  }
};

}  // namespace fa3::attn
