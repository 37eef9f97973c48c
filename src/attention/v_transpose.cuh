// The FP8 kernel's V transpose: warps 1-3 of the producer warpgroup turn each loaded V block
// [keys][d_v] (the TMA image, FwdSmem::VTile) into V^T [d_v][keys] (FwdSmem::VtTile), the K-major B
// operand the e4m3 PV wgmma needs (it has no transpose bit for 8-bit types). Keys are written in
// the order P's A fragments hold them (hopper::MmaE4m3::pack_step: A position 16G + 4t + q holds
// key 16G + 2t + (q & 1) + 8 (q >> 1)), so P needs no shuffles.
//
// Rings: the V ring's stages are filled by the producer's TMA and released by the 96 transposer
// threads (each releases its own reads); the V^T ring's are filled by them (each thread fences its
// stores to the async proxy, where wgmma reads, then arrives) and released by the consumers as
// the 16-bit kernels release V. A V stage's v_loaded flag, set by the producer before its arrival,
// is 0 for the end of the stream.
//
// Each thread moves 4x4-byte blocks: four 32-bit loads (four keys of one 4-byte column group),
// eight byte permutes, four 32-bit stores (four d rows of one 4-key word). Lane (h, G, t) takes
// keys 16G + 2t + {0, 1, 8, 9} and column group e = H (i + G) + h mod (d_v / 4) in step i, where
// H = 128 / kBlockN lanes share a (G, t) (h < H): with the 128-byte swizzle the 32 lanes' loads and
// their stores then each touch 32 distinct banks (a plain e = i would put 16 lanes' stores on one
// bank pair).
#pragma once
#include "src/attention/fwd_smem.cuh"
#include "src/hopper/arch.cuh"
#include "src/hopper/mbarrier.cuh"

namespace fa3::attn {

template <class Cfg>
struct VTranspose {
  using Smem = FwdSmem<Cfg>;
  using Raw = typename Smem::VTile;
  using Vt = typename Smem::VtTile;
  static constexpr int kThreads = 96;  // warps 1-3 of the producer warpgroup
  static constexpr int kWarps = kThreads / 32;
  static constexpr int kWords = Cfg::kHeadDimV / 4;  // 4-byte column groups of a V row
  static constexpr int kGroups = Cfg::kBlockN / 16;  // 16-key groups of a block
  static constexpr int kH = 8 / kGroups;             // lanes per (group, t)
  static constexpr int kSteps = kWords / kH;         // warp steps per block
  static_assert(Cfg::kBlockN == 128 || Cfg::kBlockN == 64, "the lane map: 64- or 128-key blocks");
  static_assert(kWords % kH == 0, "whole steps");

  // What lane `lane` moves in warp step i (host-callable: the CPU tests replay the map).
  struct Lane {
    int e, g, t;  // column group, 16-key group, key pair in the group
  };
  __host__ __device__ static constexpr Lane lane_map(int i, int lane) {
    const int t = lane % 4, g = (lane / 4) % kGroups, h = lane / (4 * kGroups);
    return {(kH * (i + g) + h) % kWords, g, t};
  }
  // The key row of load q, and the V^T column (key position) of the stored words' first byte.
  __host__ __device__ static constexpr int source_key(const Lane& m, int q) {
    return 16 * m.g + 2 * m.t + (q & 1) + 8 * (q >> 1);
  }
  __host__ __device__ static constexpr int target_position(const Lane& m) { return 16 * m.g + 4 * m.t; }

  Smem smem;
  int tid;  // 0 .. 95

  // out[j] byte q = a[q] byte j (a 4x4 byte transpose).
  __device__ __forceinline__ static void transpose4(const uint32_t (&a)[4], uint32_t (&out)[4]) {
    const uint32_t t0 = __byte_perm(a[0], a[1], 0x5140), t1 = __byte_perm(a[0], a[1], 0x7362);
    const uint32_t t2 = __byte_perm(a[2], a[3], 0x5140), t3 = __byte_perm(a[2], a[3], 0x7362);
    out[0] = __byte_perm(t0, t2, 0x5410);
    out[1] = __byte_perm(t0, t2, 0x7632);
    out[2] = __byte_perm(t1, t3, 0x5410);
    out[3] = __byte_perm(t1, t3, 0x7632);
  }

  // Steps i and i + kWarps of a block, both steps' loads before either's stores (two independent
  // chains: three warps alone have too little parallelism to hide the load latency otherwise).
  __device__ __forceinline__ void two_steps(uint32_t src, uint32_t dst, int i, int lane) const {
    constexpr int kU = 2;
    uint32_t a[kU][4];
    Lane m[kU];
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      m[u] = lane_map(i + u * kWarps, lane);
      if (u == 0 || i + u * kWarps < kSteps)
#pragma unroll
        for (int q = 0; q < 4; ++q) a[u][q] = hopper::ld_shared_u32(src + Raw::offset(source_key(m[u], q), 4 * m[u].e));
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      if (u > 0 && i + u * kWarps >= kSteps) break;
      uint32_t out[4];
      transpose4(a[u], out);
#pragma unroll
      for (int j = 0; j < 4; ++j) hopper::st_shared_u32(dst + Vt::offset(4 * m[u].e + j, target_position(m[u])), out[j]);
    }
  }

  __device__ void run() const {
    auto& bars = smem.bars();
    hopper::PipelineState<Cfg::kStages> raw, vt;
    const int warp = tid / 32, lane = tid % 32;
    for (;;) {
      bars.v.consumer_wait(raw);
      if (!bars.v_loaded[raw.index]) return;
      bars.vt.producer_acquire(vt);
      const uint32_t src = hopper::smem_u32(smem.v(raw.index)), dst = hopper::smem_u32(smem.vt(vt.index));
#pragma unroll 1
      for (int i = warp; i < kSteps; i += 2 * kWarps) two_steps(src, dst, i, lane);
      bars.v.consumer_release(raw);  // this thread's reads of the V stage are done
      raw.advance();
      hopper::fence_view_async_shared();  // its V^T stores -> visible to the PV wgmma
      hopper::mbarrier_arrive(&bars.vt.full[vt.index]);
      vt.advance();
    }
  }
};

}  // namespace fa3::attn
