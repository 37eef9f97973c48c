// The FP8 kernel's V transpose: warps 1-3 of the producer warpgroup (warp 3 alone for gathered
// pages) turn each loaded V block [keys][d_v] (the TMA image, FwdSmem::VTile, or the gather warp's
// copy of it) into V^T [d_v][keys] (FwdSmem::VtTile), the K-major B
// operand the e4m3 PV wgmma needs (it has no transpose bit for 8-bit types). Keys are written in
// the order P's A fragments hold them (hopper::MmaE4m3::pack_step: A position 16G + 4t + q holds
// key 16G + 2t + (q & 1) + 8 (q >> 1)), so P needs no shuffles.
//
// Rings: the V ring's stages are filled by the producer's TMA (or a gather warp: kv_gather.cuh) and
// released by the transposer's threads (each releases its own reads); the V^T ring's are filled by
// them (each thread fences its stores to the async proxy, where wgmma reads, then arrives) and
// released by the consumers as the 16-bit kernels release V. A V stage's v_loaded flag, set by the
// walker before the stage's arrival (or before its post to the gather warp), is 0 for the end of
// the stream.
//
// A block's keys come in parts: 128 keys (one V^T panel: 128 e4m3 columns) at a time, and a last
// part of 64 (64-key and 192-key blocks). In a part of kKeys keys each thread moves, per step, one
// 16-byte chunk (16 d columns) of four keys: four 16-byte loads, four 4x4-byte transposes (eight
// byte permutes each) and sixteen 32-bit stores (the chunk's 16 d rows, four keys each). Lane
// (h, G, t) takes keys 16G + 2t + {0, 1, 8, 9} of the part and, in step s, chunk
// c = (H s + h + G) mod (d_v / 16), where H = 128 / kKeys lanes share a (G, t) (h < H).
// Loads: the 8 lanes of a quarter warp (one wavefront of a 16-byte load) hold two consecutive
// chunks and four swizzle phases (t), so 8 distinct 16-byte bank groups. Stores: the 32 lanes of
// one store write d row 16c + 4w + j, whose swizzle phase (4w + j) mod 8 is the same for all of
// them, at key positions 16G + 4t of the part's panel: 32 distinct banks with 128-key parts, two
// lanes per bank with 64 (h = 0 and 1 share G). A step's addresses are the chunk's plus per-lane
// constants (the earlier map, 4 bytes per load, computed a swizzled address per 4 bytes: perf-log
// step 72). The warps take the block's steps (all parts') in turn: three warps, or one where warps 1
// and 2 gather a paged cache's rows (kv_gather.cuh; the V ring's readers and the V^T ring's writers
// are then 32 threads: fwd_kernel.cuh).
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
  static constexpr int kThreads = 96;  // warps 1-3 of the producer warpgroup (TMA-loaded V)
  static constexpr int kWarps = kThreads / 32;
  static constexpr int kGatherThreads = 32;  // warp 3 alone, beside the gather warps
  // The V ring's readers and the V^T ring's writers (each thread arrives for its own accesses).
  __host__ __device__ static constexpr int threads(bool gather) { return gather ? kGatherThreads : kThreads; }
  static constexpr int kChunks = Cfg::kHeadDimV / 16;  // 16-byte chunks of a V row
  static constexpr int kRow = hopper::kSwizzleBytes;   // bytes per row of a panel
  static_assert((kChunks & (kChunks - 1)) == 0 && kChunks >= 2, "d_v: a power of two of 16-byte chunks");
  static_assert(Cfg::kBlockN % 64 == 0, "the lane map: parts of 128 keys and a last one of 64");
  // The block's parts: kFullParts of 128 keys (V^T panels 0 .. kFullParts-1), then (kTail) 64 keys
  // in the next panel.
  static constexpr int kFullParts = Cfg::kBlockN / 128;
  static constexpr bool kTail = Cfg::kBlockN % 128 != 0;
  static_assert(Vt::kPanels == kFullParts + (kTail ? 1 : 0), "a V^T panel per part");
  // A part of kKeys keys: its lane map's constants.
  template <int kKeys>
  struct Part {
    static constexpr int kGroups = kKeys / 16;  // 16-key groups
    static constexpr int kH = 8 / kGroups;      // lanes per (group, t)
    static constexpr int kSteps = kChunks / kH;  // warp steps
  };
  using Full = Part<128>;
  using Last = Part<64>;
  static constexpr int kFullSteps = kFullParts * Full::kSteps;
  static constexpr int kSteps = kFullSteps + (kTail ? Last::kSteps : 0);  // warp steps per block

  // What lane `lane` moves in warp step s of the block (host-callable: the CPU tests replay the map).
  struct Lane {
    int c, g, t;  // 16-byte chunk of d, 16-key group, key pair in the group (of the part)
    int base;     // the part's first key (a multiple of 128: its V^T panel is base / 128)
    int h_lanes;  // lanes that share a (group, t) in the part
  };
  template <class P>
  __host__ __device__ static constexpr Lane part_map(int s, int lane, int base) {
    const int t = lane % 4, g = (lane / 4) % P::kGroups, h = lane / (4 * P::kGroups);
    return {(P::kH * s + h + g) % kChunks, g, t, base, P::kH};
  }
  __host__ __device__ static constexpr Lane lane_map(int s, int lane) {
    if (s < kFullSteps) return part_map<Full>(s % Full::kSteps, lane, 128 * (s / Full::kSteps));
    return part_map<Last>(s - kFullSteps, lane, 128 * kFullParts);
  }
  // The key row of load q, and the V^T column (key position) of the stored words' first byte.
  __host__ __device__ static constexpr int source_key(const Lane& m, int q) {
    return m.base + 16 * m.g + 2 * m.t + (q & 1) + 8 * (q >> 1);
  }
  __host__ __device__ static constexpr int target_position(const Lane& m) { return m.base + 16 * m.g + 4 * m.t; }

  // Raw::offset(source_key(m, q), 16 m.c) in parts: the row is base + 16G + 2t + {0, 1, 8, 9}, so
  // its swizzle phase (row mod 8) is 2t ^ (q & 1), and the chunk's panel is c / 8.
  __host__ __device__ static constexpr uint32_t load_row(const Lane& m) {
    return (m.base + 16 * m.g + 2 * m.t) * kRow;
  }
  __host__ __device__ static constexpr uint32_t load_chunk(int c, int t) {
    return (c / 8) * Raw::kPanelBytes + ((16 * (c % 8)) ^ (32 * t));
  }
  __host__ __device__ static constexpr uint32_t load_step(int q) { return ((q & 1) + 8 * (q >> 1)) * kRow; }
  __host__ __device__ static constexpr uint32_t load_offset(const Lane& m, int q) {
    return load_row(m) + (load_chunk(m.c, m.t) ^ (16 * (q & 1))) + load_step(q);
  }
  // Vt::offset(16 c + 4 w + j, target_position(m)) in parts: the part's panel, and inside it the
  // d row's swizzle phase (4w + j) mod 8 whatever c, which XORs the lane's position in the panel
  // (16G + 4t) as a whole.
  __host__ __device__ static constexpr uint32_t store_panel(const Lane& m) {
    return uint32_t(Vt::panel_offset(m.base / 128));
  }
  __host__ __device__ static constexpr uint32_t store_lane(const Lane& m, int phase) {
    return uint32_t(16 * m.g + 4 * m.t) ^ uint32_t(16 * phase);
  }
  __host__ __device__ static constexpr uint32_t store_offset(const Lane& m, int w, int j) {
    return store_panel(m) + 16 * kRow * m.c + kRow * (4 * w + j) + store_lane(m, (4 * w + j) % 8);
  }

  Smem smem;
  int tid;  // 0 .. 95 (0 .. 31 with one warp)

  // out[j] byte q = a[q] byte j (a 4x4 byte transpose).
  __device__ __forceinline__ static void transpose4(const uint32_t (&a)[4], uint32_t (&out)[4]) {
    const uint32_t t0 = __byte_perm(a[0], a[1], 0x5140), t1 = __byte_perm(a[0], a[1], 0x7362);
    const uint32_t t2 = __byte_perm(a[2], a[3], 0x5140), t3 = __byte_perm(a[2], a[3], 0x7362);
    out[0] = __byte_perm(t0, t2, 0x5410);
    out[1] = __byte_perm(t0, t2, 0x7632);
    out[2] = __byte_perm(t1, t3, 0x5410);
    out[3] = __byte_perm(t1, t3, 0x7632);
  }

  // One step: the lane's chunk c of its four keys, loaded at once, then its 16 d rows stored
  // (load_offset and store_offset in their parts). src_row: the V stage + load_row; dst: the V^T
  // stage + the part's panel; lane_phase[k]: store_lane for swizzle phase k (per-lane constants).
  __device__ __forceinline__ void step(uint32_t src_row, uint32_t dst, const uint32_t (&lane_phase)[8], int c,
                                       int t) const {
    const uint32_t x = src_row + load_chunk(c, t);  // rows with q even; odd rows flip chunk bit 0
    const uint32_t y = src_row + (load_chunk(c, t) ^ 16);
    uint4 a[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) a[q] = hopper::ld_shared_u32x4(((q & 1) ? y : x) + load_step(q));
    const uint32_t d = dst + 16 * kRow * c;
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      uint32_t in[4], out[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) in[q] = w == 0 ? a[q].x : w == 1 ? a[q].y : w == 2 ? a[q].z : a[q].w;
      transpose4(in, out);
#pragma unroll
      for (int j = 0; j < 4; ++j)
        hopper::st_shared_u32(d + lane_phase[(4 * w + j) % 8] + kRow * (4 * w + j), out[j]);
    }
  }

  // A part's per-lane constants: its load row and the store positions of the 8 swizzle phases.
  struct PartLane {
    uint32_t row, panel;
    int t;
    uint32_t phase[8];
  };
  __device__ __forceinline__ static PartLane part_lane(const Lane& first) {
    PartLane l{load_row(first), store_panel(first), first.t, {}};
#pragma unroll
    for (int k = 0; k < 8; ++k) l.phase[k] = store_lane(first, k);
    return l;
  }

  // warps: the warps that share the steps (3, or 1 beside the gather warps).
  __device__ void run(int warps = kWarps) const {
    auto& bars = smem.bars();
    hopper::PipelineState<Cfg::kStages> raw, vt;
    const int warp = tid / 32, lane = tid % 32;
    // Kept in registers: the full parts' constants (the same map in every panel but the base) and
    // the last part's.
    const PartLane full = part_lane(part_map<Full>(0, lane, 0));
    const PartLane last = part_lane(part_map<Last>(0, lane, 128 * kFullParts));
    for (;;) {
      bars.v.consumer_wait(raw);
      if (!bars.v_loaded[raw.index]) return;
      bars.vt.producer_acquire(vt);
      const uint32_t src = hopper::smem_u32(smem.v(raw.index));
      const uint32_t dst = hopper::smem_u32(smem.vt(vt.index));
#pragma unroll 1
      for (int s = warp; s < kSteps; s += warps) {
        if (kTail && (kFullParts == 0 || s >= kFullSteps)) {
          const int sl = s - kFullSteps;
          step(src + last.row, dst + last.panel, last.phase, part_map<Last>(sl, lane, 0).c, last.t);
        } else if constexpr (kFullParts == 1) {
          step(src + full.row, dst, full.phase, part_map<Full>(s, lane, 0).c, full.t);
        } else {
          const int p = s / Full::kSteps, sl = s - p * Full::kSteps;
          step(src + full.row + 128 * kRow * p, dst + Vt::panel_offset(p), full.phase, part_map<Full>(sl, lane, 0).c,
               full.t);
        }
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
