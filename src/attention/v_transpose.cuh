// The FP8 kernel's V transpose: warps 1-3 of the producer warpgroup (warp 3 alone for gathered
// pages) turn each loaded V block [keys][d_v] (the TMA image, FwdSmem::VTile, or the gather warp's
// copy of it) into V^T [d_v][keys] (FwdSmem::VtTile), the K-major B operand the e4m3 PV wgmma
// needs (it has no transpose bit for 8-bit types). Keys are written in the order P's A fragments
// hold them (hopper::MmaE4m3::pack_step: position 16G + 4t + q of a 16-key group G holds key
// 16G + 2t + (q & 1) + 8 (q >> 1)), so P needs no shuffles.
//
// Rings: the V ring's stages are filled by the producer's TMA (or a gather warp: kv_gather.cuh) and
// released by the transposer's threads (each releases its own reads); the V^T ring's are filled by
// them (each thread fences its stores to the async proxy, where wgmma reads, then arrives) and
// released by the consumers as the 16-bit kernels release V. A V stage's v_loaded flag, set by the
// walker before the stage's arrival (or before its post to the gather warp), is 0 for the end of
// the stream.
//
// The unit of work: one 16-key group G and 32 d columns (u: columns 32u .. 32u + 31), 512 bytes,
// moved by one warp in three steps:
//   ldmatrix.x4.trans of the four 8x8 16-bit matrices (keys 16G + {0-7, 8-15}) x (d 32u + {0-15,
//   16-31}), byte pairs as 16-bit elements: thread (c = lane / 4, t = lane % 4) receives, per
//   matrix, keys 2t and 2t + 1 (of its 8) at d pair c — 4 bytes (key 2t: d 2c, 2c + 1; key 2t + 1:
//   d 2c, 2c + 1);
//   two byte permutes per matrix pair (keys 0-7 with keys 8-15) give the thread's 4 bytes of V^T
//   rows d 2c and 2c + 1 at positions 16G + 4t .. + 3: keys 2t, 2t + 1, 8 + 2t, 9 + 2t, P's order;
//   stmatrix.x4 (no transpose) stores them: thread (c, t) gives row c of each matrix, bytes 4t .. +3.
// Bank conflicts: the load's 8 rows of a matrix are 8 keys of one 16-byte column chunk, whose
// swizzle phases (key mod 8) differ. A stored matrix of the even rows d = 2c alone would put d and
// d + 8 (the same phase) in one wavefront, so the lanes of c >= 4 (lanes 16-31) swap their even
// and odd words (the permute's selector is per lane): a stored matrix holds rows 0, 2, 4, 6, 9, 11,
// 13, 15 (or 1, 3, 5, 7, 8, 10, 12, 14) of its 16, eight distinct phases.
// Per 512 bytes: ldmatrix, four PRMT, stmatrix and about three address operations, and 8 words of
// data in flight, so the transposer's warps leave the SMSPs' issue slots to the consumers and fit
// 24 registers (what d256's 240-register consumers need: fwd_launch_shape.cuh).
// A work item is one group's run of up to 4 units (all of d_v's up to d128, half of d256's); the
// warps take a block's items in turn: three warps, or one where warps 1 and 2 gather a paged
// cache's rows (kv_gather.cuh; the V ring's readers and the V^T ring's writers are then 32
// threads: fwd_kernel.cuh).
#pragma once
#include "src/attention/fwd_smem.cuh"
#include "src/hopper/arch.cuh"
#include "src/hopper/mbarrier.cuh"
#include "src/hopper/smem_tile.cuh"

namespace fa3::attn {

template <class Cfg>
struct VTranspose {
  using Smem = FwdSmem<Cfg>;
  using Raw = typename Smem::VTile;
  using Vt = typename Smem::VtTile;
  static constexpr int kThreads = 96;  // warps 1-3 of the producer warpgroup (TMA-loaded V)
  static constexpr int kWarps = kThreads / 32;
  static constexpr int kGatherThreads = 32;  // warp 3 alone, beside the gather warps
  // The V ring's readers and the V^T ring's writers (each thread arrives for its own accesses).
  __host__ __device__ static constexpr int threads(bool gather) { return gather ? kGatherThreads : kThreads; }
  static constexpr int kRow = hopper::kSwizzleBytes;  // bytes per row of a panel
  static_assert(Cfg::kHeadDimV % 32 == 0, "d_v: whole units of 32 columns");
  static_assert(Cfg::kBlockN % 16 == 0, "whole 16-key groups");
  static constexpr int kGroups = Cfg::kBlockN / 16;
  static constexpr int kUnits = Cfg::kHeadDimV / 32;                   // units per group
  static constexpr int kItemUnits = kUnits < 4 ? kUnits : 4;           // units per work item
  static constexpr int kItemsPerGroup = kUnits / kItemUnits;
  static constexpr int kItems = kGroups * kItemsPerGroup;              // work items per block
  static_assert(kUnits % kItemUnits == 0, "whole items");

  // The lane's constant parts of its addresses (host-callable: the CPU test replays the map).
  // Load: lane l addresses row l % 8 of matrix l / 8: key 16G + 8 (m & 1) + l % 8, d column
  // 32u + 16 (m >> 1); its 16-byte chunk in the panel row is (2 (u % 4) + (m >> 1)) ^ (key % 8).
  __host__ __device__ static constexpr int load_key(int lane) { return 8 * ((lane / 8) & 1) + lane % 8; }
  __host__ __device__ static constexpr uint32_t load_lane(int lane) {
    return uint32_t(load_key(lane) * kRow + ((((lane / 8) >> 1) ^ (lane % 8)) << 4));
  }
  // Store: lane l addresses row l % 8 of matrix l / 8: d = 16 (m >> 1) + 2 r + ((m & 1) ^ (r >= 4))
  // of the unit's 32 (the swap above), at key position 16G.
  __host__ __device__ static constexpr int store_d(int lane) {
    const int m = lane / 8, r = lane % 8;
    return 16 * (m >> 1) + 2 * r + ((m & 1) ^ (r >= 4 ? 1 : 0));
  }
  // The addresses of unit (G, u), relative to the V and V^T stages: a work item's part (its first
  // unit u0, a multiple of 4, so that its units share a V panel) plus the lane's. The stage bases
  // are 1024-aligned and the item's load part a multiple of 128, so the swizzle's XOR of unit u0 + i
  // acts on the lane's chunk bits alone; its store is i rows of 32 d further.
  __host__ __device__ static constexpr uint32_t load_item(uint32_t g, uint32_t u0) {
    return g * (16 * kRow) + u0 / 4 * uint32_t(Raw::kPanelBytes);
  }
  __host__ __device__ static constexpr uint32_t store_item(uint32_t g, uint32_t u0, uint32_t phase) {
    return g / 8 * uint32_t(Vt::kPanelBytes) + ((g % 8 ^ phase) << 4) + u0 * (32 * kRow);
  }
  __host__ __device__ static constexpr uint32_t load_offset(int lane, int g, int u) {
    return (load_item(g, u - u % 4) + load_lane(lane)) ^ uint32_t((u % 4) << 5);
  }
  __host__ __device__ static constexpr uint32_t store_offset(int lane, int g, int u) {
    return store_d(lane) * kRow + store_item(g, u, store_d(lane) % 8);
  }
  // The byte permutes: lanes 0-15 keep (even, odd) rows in (matrix 2i, 2i + 1), lanes 16-31 swap.
  __host__ __device__ static constexpr uint32_t even_selector(int lane) { return lane < 16 ? 0x6420u : 0x7531u; }

  Smem smem;
  int tid;  // 0 .. 95 (0 .. 31 with one warp)

  // One work item: kItemUnits units of one group; ld / st: the lane's addresses of its first unit.
  __device__ __forceinline__ void item(uint32_t ld, uint32_t st, uint32_t sel_a, uint32_t sel_b) const {
#pragma unroll
    for (int i = 0; i < kItemUnits; ++i) {
      uint32_t r[4];
      hopper::ldmatrix_x4_trans(ld ^ uint32_t(i << 5), r);
      hopper::stmatrix_x4(st + uint32_t(i * 32 * kRow), __byte_perm(r[0], r[1], sel_a), __byte_perm(r[0], r[1], sel_b),
                          __byte_perm(r[2], r[3], sel_a), __byte_perm(r[2], r[3], sel_b));
    }
  }

  // warps: the warps that share the items (3, or 1 beside the gather warps).
  __device__ void run(int warps = kWarps) const {
    auto& bars = smem.bars();
    hopper::PipelineState<Cfg::kStages> raw, vt;
    const int warp = tid / 32, lane = tid % 32;
    const uint32_t ld_lane = load_lane(lane);
    const uint32_t st_d = uint32_t(store_d(lane) * kRow), st_phase = uint32_t(store_d(lane) % 8);
    const uint32_t sel_a = even_selector(lane), sel_b = sel_a ^ 0x1111u;
    for (;;) {
      bars.v.consumer_wait(raw);
      if (!bars.v_loaded[raw.index]) return;
      bars.vt.producer_acquire(vt);
      const uint32_t src = hopper::smem_u32(smem.v(raw.index)) + ld_lane;
      const uint32_t dst = hopper::smem_u32(smem.vt(vt.index)) + st_d;
#pragma unroll 1
      for (uint32_t s = warp; s < uint32_t(kItems); s += warps) {
        const uint32_t g = s / kItemsPerGroup, u0 = s % kItemsPerGroup * kItemUnits;
        const uint32_t ld = src + load_item(g, u0), st = dst + store_item(g, u0, st_phase);
        item(ld, st, sel_a, sel_b);
      }
      bars.v.consumer_release(raw);  // this thread's reads of the V stage are done
      raw.advance();
      hopper::fence_view_async_shared();  // its V^T stores -> visible to the PV wgmma
      hopper::mbarrier_arrive(&bars.vt.full[vt.index]);
      vt.advance();
    }
  }
};

}  // namespace fa3::attn
