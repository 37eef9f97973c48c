// Shared-memory layout of the forward kernel and the named barriers its warpgroups use.
// Tiles are TMA images with the 128-byte swizzle: panels of 64 columns, [rows][128 B] each,
// every tile 1024-byte aligned (the swizzle atom) so descriptors keep base_offset 0.
#pragma once
#include <cstdint>

#include "src/hopper/mbarrier.cuh"
#include "src/hopper/smem_tile.cuh"

namespace fa3::attn {

template <class Cfg>
struct FwdSmem {
  static constexpr int kPanels = (Cfg::kHeadDim + 63) / 64;
  static constexpr int kQPanelBytes = Cfg::kBlockM * hopper::kSwizzleBytes;
  static constexpr int kKVPanelBytes = Cfg::kBlockN * hopper::kSwizzleBytes;
  static constexpr int kQBytes = kPanels * kQPanelBytes;
  static constexpr int kKVBytes = kPanels * kKVPanelBytes;
  static_assert(kKVPanelBytes % 1024 == 0 && kQPanelBytes % 1024 == 0, "tiles must stay 1024-byte aligned");
  // Q is double-buffered when it fits, so the next tile's Q loads while this tile still runs
  // (otherwise every tile starts with a Q round trip: a bubble that dominates short sequences).
  // (+1024 alignment slack, +256 an upper bound of the barriers, whose size depends on kQStages)
  static constexpr int kBytesWithoutQ =
      Cfg::kStages * 2 * kKVBytes + (Cfg::kOInKV ? 0 : kQBytes) + 1024 + 256;
  static constexpr int kQStages = kBytesWithoutQ + 2 * kQBytes <= 227 * 1024 ? 2 : 1;
  // kOInKV: one warpgroup's 64 rows of O (panels of 64 rows) fit in a K or a V stage.
  static_assert(!Cfg::kOInKV || (Cfg::kBlockN >= 64 && Cfg::kBlockM == 128), "O in K/V stages: 2 consumers, >= 64 keys");

  // Byte offsets from the 1024-aligned base. O is staged for its TMA store in a tile of its own, or
  // (kOInKV, when smem is short) in the K and V stages of the tile's last key block (consumer.cuh);
  // where 64 rows of O still fit (kOHalf), consumer 0 stages in a half tile of its own instead of
  // the K stage, which the producer needs sooner than the V stage.
  static constexpr int kOffK = kQStages * kQBytes;
  static constexpr int kOffV = kOffK + Cfg::kStages * kKVBytes;
  static constexpr int kOffO = kOffV + Cfg::kStages * kKVBytes;
  static constexpr int kOHalfBytes = 64 * kPanels * hopper::kSwizzleBytes;
  static constexpr bool kOHalf = Cfg::kOInKV && kOffO + kOHalfBytes + 256 + 1024 <= 227 * 1024;
  static constexpr int kOffBarriers = kOffO + (Cfg::kOInKV ? (kOHalf ? kOHalfBytes : 0) : kQBytes);

  // The producer's note on the tile whose Q a stage holds, written before the stage's arrival
  // (release) and read by the consumers after their wait on it (acquire): the consumers never run
  // the tile walk themselves (tile_scheduler.cuh; its integer divisions were 7% of their
  // instructions at d64 causal 512, perf-log step 48). m_block < 0: the walk ended (no Q loaded).
  // step: the tile's place in this CTA's walk; the steps skipped since the previous note are tiles
  // without any visible key, which the consumers fill with zeros.
  struct TileNote {
    int m_block, head, batch, n_min, n_max, step;
  };
  struct Barriers {
    hopper::PipelineBarriers<kQStages> q;
    hopper::PipelineBarriers<Cfg::kStages> k, v;
    TileNote note[kQStages];
  };
  // Dynamic smem to request: the layout plus slack to round the base up to 1024 bytes.
  static constexpr int kBytes = kOffBarriers + sizeof(Barriers) + 1024;
  static_assert(kBytes <= 227 * 1024, "forward tile configuration exceeds 227 KB of shared memory");

  uint8_t* base;
  __device__ __forceinline__ explicit FwdSmem(uint8_t* raw)
      : base(reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t(1023))) {}
  __device__ __forceinline__ uint8_t* q(int stage) const { return base + stage * kQBytes; }
  __device__ __forceinline__ uint8_t* k(int stage) const { return base + kOffK + stage * kKVBytes; }
  __device__ __forceinline__ uint8_t* v(int stage) const { return base + kOffV + stage * kKVBytes; }
  __device__ __forceinline__ uint8_t* o() const { return base + kOffO; }
  __device__ __forceinline__ Barriers& bars() const { return *reinterpret_cast<Barriers*>(base + kOffBarriers); }
};

// Named barrier ids (0 is __syncthreads).
enum FwdBarrier : int {
  kBarSchedule = 2,   // + consumer index: pingpong turn to issue GEMMs (up to 3 consumers)
  kBarEpilogue = 5,   // + consumer index: one warpgroup's O staging
  kBarOInKV = 8,      // kOInKV: every consumer's GEMMs of the tile are done, the last K/V stages are free
};

}  // namespace fa3::attn
