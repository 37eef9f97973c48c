// Paged caches whose pages are not a multiple of 16 rows (SGLang's pages of 1, vLLM-style pages of
// 8, ...): TMA boxes cannot follow such pages (a box of gcd(kBlockN, page_size) rows would break the
// 8-row swizzle atoms, or be one row), so the K/V rows of a key block are gathered one by one with
// per-thread cp.async into the same swizzled stage layout TMA writes (hopper::SmemTile), and the
// consumers cannot tell the two apart.
//
// Who does what: the walker lanes (mainloop_load.cuh; warps 0 and 1 of the 16-bit kernels, warp 0
// of the e4m3 ones) claim each K / V stage as for TMA, but instead of issuing boxes they post a
// request — which key block, of which sequence and kv head — in the stage's first 16 bytes and
// arrive on the ring's `posted` barrier; one warp serves the K ring and one the V ring (16-bit:
// warps 2 and 3; e4m3: warps 1 and 2, and warp 3 alone transposes the gathered V: fwd_kernel.cuh),
// in stage order: wait for the post, read it, gather the block, then every lane waits for its own
// copies, fences them for the async proxy (wgmma reads the stage: HOPPER_PRIMER's rule for generic
// writes before an async-proxy read) and arrives on the stage's `full` barrier (32 arrivals: each
// lane orders only its own writes) — for a block, after the next block's copies are issued where
// its post is already there. With e4m3 the V gather warp also completes the stage of the walker's
// end post for the transposer (whose v_loaded the walker set to 0).
// No second ring is needed for the requests: the walker can post into a stage again only after
// the stage's readers (the consumers; with e4m3 V the transposer) released it, which follows this
// warp's arrival, which follows its read.
//
// A block is copied in two passes. Pass 1: lane l looks up the pages of rows l, l + 32, ... (up to
// four table loads in flight at once). Pass 2, in groups of 32 rows: lane l turns its row of the
// group into a source pointer, and eight lanes per row (a 128-byte panel row — 64 16-bit or 128
// e4m3 columns — 16 bytes each: whole cache lines per warp instruction), four rows per
// instruction, copy it, the pointer handed over by a shuffle. Rows past the sequence and the
// padded columns past head_dim are zero-filled (rows past the keys get weight 0 from the mask, and
// zeros keep NaN * 0 out of the PV).
#pragma once
#include <cstdint>
#include <type_traits>

#include "src/attention/fwd_params.h"
#include "src/attention/fwd_smem.cuh"
#include "src/hopper/arch.cuh"
#include "src/hopper/cp_async.cuh"
#include "src/hopper/mbarrier.cuh"

namespace fa3::attn {

// What a walker posts for one stage (in the stage's first 16 bytes). keys < 0: the stream ended.
struct GatherRequest {
  int k0;       // the block's first key, counted from the sequence's start
  int keys;     // the sequence's key count: rows at or past it are zero-filled
  int batch;    // the page table's row
  int kv_head;
};

// The lanes' share of a block of kBlockN rows (host-callable: the CPU tests check that every
// (row, 16-byte chunk) of a panel is written once, and that each row's offset comes from the lane
// that looked it up).
template <int kBlockN>
struct GatherLanes {
  static_assert(kBlockN % 4 == 0, "four rows per pass");
  static constexpr int kOwned = (kBlockN + 31) / 32;  // rows whose page a lane looks up
  static constexpr int kPasses = kBlockN / 4;         // pass 2: four rows per warp instruction
  // Pass 1: the j-th row lane l looks up.
  __host__ __device__ static constexpr int owned_row(int lane, int j) { return lane + 32 * j; }
  // Pass 2: the row and 16-byte chunk (of a 128-byte panel row) lane l copies in pass i.
  __host__ __device__ static constexpr int row(int lane, int i) { return 4 * i + lane / 8; }
  __host__ __device__ static constexpr int chunk(int lane) { return lane % 8; }
  // ... the first column of that chunk, in elements of kElemBytes bytes.
  template <int kElemBytes>
  __host__ __device__ static constexpr int chunk_col(int lane) { return chunk(lane) * (16 / kElemBytes); }
  // ... and where that row's offset lives: owner lane and its slot j, the same j for every lane
  // of a pass (4i and 4i + 3 share 32-row groups), so the slot is a register, not local memory.
  __host__ __device__ static constexpr int owner_lane(int lane, int i) { return row(lane, i) % 32; }
  __host__ __device__ static constexpr int owner_slot(int i) { return 4 * i / 32; }
};

template <class Cfg>
struct KvGather {
  using Smem = FwdSmem<Cfg>;
  using Lanes = GatherLanes<Cfg::kBlockN>;
  static constexpr int kElem = Smem::kElem;  // bytes per element: 2, or 1 (e4m3)
  using Elem = std::conditional_t<kElem == 2, uint16_t, uint8_t>;  // (the strides count elements)

  const FwdKernelParams& p;
  Smem smem;

  // The K or the V ring's gather warp, every lane, until the walker posts the end.
  __device__ void run(bool keys) const {
    if (keys) serve<true>();
    else serve<false>();
  }

  // One ring. The cache's pointer and strides are read from the kernel parameters where they are
  // used (constant-bank operands, no registers: the producer warpgroup has 24).
  // Two blocks in flight: a stage's copies are published (waited for, fenced, arrived on) only
  // after the next stage's copies are issued, when its post is already there; otherwise at once,
  // so the warp never waits for a post while holding an unpublished stage (the walker's next post
  // may need the consumers to finish with that very stage). One block at a time held large
  // decodes with pages of 1 at 2.0-2.1 TB/s (perf-log step 107).
  template <bool kKeys>
  __device__ void serve() const {
    using Tile = std::conditional_t<kKeys, typename Smem::KTile, typename Smem::VTile>;
    auto& bars = smem.bars();
    auto& ring = kKeys ? bars.k : bars.v;
    uint64_t* posted = kKeys ? bars.posted.k : bars.posted.v;
    const int lane = threadIdx.x % hopper::kWarpSize;
    hopper::PipelineState<Cfg::kStages> st;
    int pending = -1;  // the stage whose copies are in flight, not yet published
    auto publish = [&](int stage) {
      hopper::fence_view_async_shared();
      hopper::mbarrier_arrive(&ring.full[stage]);
    };
    for (;;) {
      if (pending >= 0) {  // (one lane decides, so that the warp stays on one path)
        const bool next_posted =
            __shfl_sync(0xffffffffu, lane == 0 && hopper::mbarrier_phase_done(&posted[st.index], st.phase), 0);
        if (!next_posted) {
          hopper::cp_async_wait<0>();
          publish(pending);
          pending = -1;
        }
      }
      hopper::mbarrier_wait(&posted[st.index], st.phase);
      uint8_t* stage = kKeys ? smem.k(st.index) : smem.v(st.index);
      const int4 req = *reinterpret_cast<const int4*>(stage);  // GatherRequest
      __syncwarp();  // every lane has read the request before lane 0's copy overwrites it
      if (req.y < 0) {
        if (pending >= 0) {
          hopper::cp_async_wait<0>();
          publish(pending);
        }
        // e4m3: the transposer's end is this stage, whose v_loaded the walker set to 0 before the
        // post (mainloop_load.cuh: a store here made ptxas spill in the consumers of the d64
        // 192-row tiles with block descales), completed by the 32 arrivals `full` counts here.
        if constexpr (!kKeys && Smem::kTransposeV) hopper::mbarrier_arrive(&ring.full[st.index]);
        return;
      }
      gather_block<kKeys, Tile>(stage, GatherRequest{req.x, req.y, req.z, req.w}, lane);
      hopper::cp_async_commit();
      if (pending >= 0) {
        hopper::cp_async_wait<1>();  // the older block's copies (this lane's), not the new one's
        publish(pending);
      }
      pending = st.index;
      st.advance();
    }
  }

  template <bool kKeys, class Tile>
  __device__ __forceinline__ void gather_block(uint8_t* stage, const GatherRequest& r, int lane) const {
    const Elem* cache = static_cast<const Elem*>(kKeys ? p.k_pages : p.v_pages);
    const int head_dim = kKeys ? p.head_dim_qk : p.head_dim_v;
    const int rows = min(Cfg::kBlockN, r.keys - r.k0);  // rows of the block inside the sequence
    // Pass 1 for every group at once: the pages of the lane's rows (loads all in flight together).
    const int* table = p.page_table + int64_t(r.batch) * p.page_table_batch_stride;
    int page[Lanes::kOwned];
#pragma unroll
    for (int j = 0; j < Lanes::kOwned; ++j)
      page[j] = Lanes::owned_row(lane, j) < rows ? table[(r.k0 + Lanes::owned_row(lane, j)) / p.page_size] : 0;
    const Elem* head = cache + int64_t(r.kv_head) * (kKeys ? p.k_head_stride : p.v_head_stride);
    const int chunk_col = Lanes::template chunk_col<kElem>(lane);
#pragma unroll
    for (int j = 0; j < Lanes::kOwned; ++j) {
      // Group j (rows 32j .. 32j + 31): lane l's row as a source pointer (the kv head's first
      // element past the sequence: a global address that zero-filled copies name but do not read),
      // handed to the eight lanes that copy it.
      const int key = r.k0 + Lanes::owned_row(lane, j);
      const Elem* own = head;
      if (Lanes::owned_row(lane, j) < rows)
        own += int64_t(page[j]) * (kKeys ? p.k_page_stride : p.v_page_stride) +
               int64_t(key % p.page_size) * (kKeys ? p.k_row_stride : p.v_row_stride);
#pragma unroll 1
      for (int i = 8 * j; i < 8 * j + 8 && i < Lanes::kPasses; ++i) {
        const int row = Lanes::row(lane, i);
        const Elem* src = reinterpret_cast<const Elem*>(
            __shfl_sync(0xffffffffu, reinterpret_cast<uintptr_t>(own), Lanes::owner_lane(lane, i)));
#pragma unroll
        for (int pn = 0; pn < Tile::kPanels; ++pn) {
          const int col = Tile::panel_col(pn) + chunk_col;
          if (col >= Tile::kCols) continue;  // the padded tile's last panel is part-used
          hopper::cp_async_16_or_zero(stage + Tile::offset(row, col), src + col, row < rows && col < head_dim);
        }
      }
    }
  }
};

}  // namespace fa3::attn
