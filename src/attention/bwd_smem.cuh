// Shared-memory layout of the backward kernel and its named barriers. Tiles are TMA images with
// the 128-byte swizzle (hopper::SmemTile), each 1024-byte aligned.
#pragma once
#include <cstdint>

#include "src/hopper/arch.cuh"
#include "src/hopper/mbarrier.cuh"
#include "src/hopper/smem_tile.cuh"

namespace fa3::attn {

template <class Cfg>
struct BwdSmem {
  static constexpr int kD = Cfg::kHeadDim, kM = Cfg::kBlockM, kN = Cfg::kBlockN, kStages = Cfg::kStages;
  static constexpr int kDoStages = Cfg::kDoStages;
  using KTile = hopper::SmemTile16<kN, kD>;   // K and V of the CTA's key block
  using QTile = hopper::SmemTile16<kM, kD>;   // Q and dO of a query block
  using DsTile = hopper::SmemTile16<kN, kM>;  // dS^T (and query rows: P^T): rows keys, columns queries
  static constexpr int kDqPartFloats = 64 * 64;  // one dQ part (bwd_config.h)
  static constexpr int kDeterministicWriters = 3;  // dQ writer warps in deterministic mode (bwd_dq_writer.cuh)

  static constexpr int kOffK = 0;
  static constexpr int kOffV = kOffK + KTile::kBytes;
  static constexpr int kOffQ = kOffV + KTile::kBytes;
  static constexpr int kOffDo = kOffQ + kStages * QTile::kBytes;
  // dS^T is double-buffered: a warpgroup writes the next block's half while the other may still
  // read this block's in its dQ GEMM (one barrier per step instead of two). Query rows:
  // P^T too (both warpgroups read all of it for their dV^T rows).
  static constexpr int kOffDs = kOffDo + kDoStages * QTile::kBytes;
  static constexpr int kOffP = kOffDs + 2 * DsTile::kBytes;
  // fp32 dQ staging: kDqBuffers per warpgroup (two let a warpgroup write the next part while the
  // writer warp's bulk copy still reads the last).
  static constexpr int kOffDq = kOffP + (Cfg::kPTile ? 2 * DsTile::kBytes : 0);
  static constexpr int kOffLse = kOffDq + (Cfg::kDqWriter ? 2 * Cfg::kDqBuffers * kDqPartFloats * 4 : 0);
  static constexpr int kOffDelta = kOffLse + kStages * kM * 4;
  static constexpr int kOffBarriers = kOffDelta + kDoStages * kM * 4;

  struct Barriers {
    uint64_t kv;  // K and V of the block, once
    hopper::PipelineBarriers<kStages> q;  // Q and LSE2 of a query block (and dO, D where they share it)
    hopper::PipelineBarriers<kDoStages> dout;  // query rows: dO and D of a query block
    // Per consumer warpgroup, its dQ staging: full = the warpgroup's 128 threads wrote a part, empty =
    // the writer's bulk copy read it (bwd_dq_writer.cuh).
    hopper::PipelineBarriers<Cfg::kDqBuffers> dq[2];
    // Deterministic mode's writer warps: writer w's turn to issue a step's adds (bwd_dq_writer.cuh).
    uint64_t dq_turn[kDeterministicWriters];
  };
  static constexpr int kBytes = kOffBarriers + sizeof(Barriers) + 1024;
  static_assert(kBytes <= 227 * 1024, "backward tile configuration exceeds 227 KB of shared memory");

  uint8_t* base;
  __device__ __forceinline__ explicit BwdSmem(uint8_t* raw)
      : base(reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t(1023))) {}
  __device__ __forceinline__ uint8_t* k() const { return base + kOffK; }
  __device__ __forceinline__ uint8_t* v() const { return base + kOffV; }
  __device__ __forceinline__ uint8_t* q(int stage) const { return base + kOffQ + stage * QTile::kBytes; }
  __device__ __forceinline__ uint8_t* dout(int stage) const { return base + kOffDo + stage * QTile::kBytes; }
  __device__ __forceinline__ uint8_t* ds(int buf) const { return base + kOffDs + buf * DsTile::kBytes; }
  __device__ __forceinline__ uint8_t* p(int buf) const { return base + kOffP + buf * DsTile::kBytes; }
  __device__ __forceinline__ float* dq(int consumer, int buf) const {
    return reinterpret_cast<float*>(base + kOffDq) + (Cfg::kDqBuffers * consumer + buf) * kDqPartFloats;
  }
  __device__ __forceinline__ float* lse2(int stage) const { return reinterpret_cast<float*>(base + kOffLse) + stage * kM; }
  __device__ __forceinline__ float* delta(int do_stage) const {
    return reinterpret_cast<float*>(base + kOffDelta) + do_stage * kM;
  }
  __device__ __forceinline__ Barriers& bars() const { return *reinterpret_cast<Barriers*>(base + kOffBarriers); }
};

enum BwdBarrier : int {
  // Both consumers wrote their half of dS^T (256 threads). d64, d128 and query rows: one per dS^T
  // buffer, kBarDsReady + buffer (bwd_mma.cuh, step_gradients; bwd_mma_query_rows.cuh).
  kBarDsReady = 2,
  // A consumer warpgroup's dK / dV staged for the output stores (128 threads): kBarDkvStaged + its index.
  kBarDkvStaged = 4,
  // Deterministic mode on the query-rows tile (bwd_dq_gate.cuh), + consumer index: the gate's
  // warps let the warpgroup's dQ adds start, and learn that they were issued (kBwdDqGateThreads).
  kBarDqMayAdd = 6,
  kBarDqAdded = 8,
};
constexpr int kBwdDqGateThreads = hopper::kWarpgroupSize + hopper::kWarpSize;  // a consumer warpgroup + a gate warp

// The backward's named barriers, in the unaligned form: their warps reach them from different
// code (d64's two warpgroups from different instantiations of their step; the dQ gate's warps and
// the consumers), each warp converged first (after its mbarrier waits' per-thread spin loops).
__device__ __forceinline__ void bwd_barrier_sync(int id, int threads) {
  __syncwarp();
  hopper::named_barrier_sync_unaligned(id, threads);
}
// Its other side for a warpgroup that only signals (its writes before it are visible to the
// threads that sync).
__device__ __forceinline__ void bwd_barrier_arrive(int id, int threads) {
  __syncwarp();
  hopper::named_barrier_arrive_unaligned(id, threads);
}

}  // namespace fa3::attn
