// The producer warps: walk this CTA's tiles (tile_scheduler.cuh) and, for each, TMA-load Q once,
// with a note that tells the consumers which tile it is and its sequence info (FwdSmem::TileNote),
// and stream K/V blocks through the stage rings in the order the consumers use them (K of block
// n-1 before V of block n, since the consumers' QK^T runs one block ahead of their PV). Tiles
// without a visible key never reach the consumers: the producer writes their zeros itself.
// Where a key block spans several pages of a paged cache, the 16-bit kernels split the rings over two warps
// of the producer warpgroup, Q and K on warp 0 and V on warp 1 (LoadRole; fwd_kernel.cuh says
// why); otherwise warp 0 loads all three (the e4m3 kernels' warps 1-3 transpose V; pages gathered
// row by row are posted to gather warps instead, kv_gather.cuh). One elected
// lane of each walks: with the whole warp in the loop ptxas spilled, in the producer and in the
// consumers (d64's 160-register tile) as well.
#pragma once
#include "src/attention/block_info.cuh"
#include "src/attention/fwd_features.h"
#include "src/attention/fwd_launch_shape.cuh"
#include "src/attention/fwd_smem.cuh"
#include "src/attention/seqlen_info.cuh"
#include "src/attention/sink.cuh"
#include "src/attention/tile_rows.cuh"
#include "src/attention/tile_scheduler.cuh"
#include "src/hopper/tma.cuh"

namespace fa3::attn {

// The rings one producer warp fills.
enum class LoadRole : int { kAll, kQk, kV };

template <class Cfg, class Feat>
struct MainloopLoad {
  using Smem = FwdSmem<Cfg>;
  using Seq = SeqlenInfo<Feat::kVarlen>;
  using Rows = TileRows<Cfg::kBlockM, Feat::kSplit>;  // the decode kernel's pack-GQA rows
  // A paged key block's page-table entries are read before its first box is issued where the
  // producer keeps every register (the decode kernel): each TMA issue is ordered after the loads
  // before it, so a read per box put a load latency and a division in front of each of the producer
  // lane's issues, which with 16-row boxes (pages of 16) took longer than a block's HBM time
  // (perf-log steps 64, 75). The producers that setmaxnreg leaves 24 or 32 registers spilled with
  // even two entries ahead, and 40 of them cost the consumers up to 3% (step 75): they keep a read
  // per box, and V's boxes go to a second warp (step 95).
  static constexpr bool kPageReadAhead = !FwdLaunchShape<Cfg>::kMoveRegs;

  const FwdKernelParams& p;
  Smem smem;

  struct NoNote {
    __device__ __forceinline__ void operator()(int) const {}
  };
  // Waits for a free buffer of the ring, then loads a Tile of rows [row, ...) of one head into it.
  // `note(stage)` runs once the buffer is free and before the arrival that publishes it (Q's note).
  template <class Tile, int kRing, class Note = NoNote>
  __device__ __forceinline__ void load_stage(const CUtensorMap* map, hopper::PipelineBarriers<kRing>& ring,
                                             hopper::PipelineState<kRing>& st, uint8_t* (Smem::*buffer)(int) const,
                                             int row, int head, int batch, Note&& note = {}) const {
    uint8_t* dst = claim_stage<Tile>(ring, st, buffer, note);
    hopper::tma_load_tile<Tile>(map, dst, row, head, batch, &ring.full[st.index]);
    st.advance();
  }
  // Waits for the ring's buffer to be free, runs `note(stage)`, then publishes the bytes a Tile
  // brings (the TMA loads that follow complete them); returns the buffer.
  template <class Tile, int kRing, class Note>
  __device__ __forceinline__ uint8_t* claim_stage(hopper::PipelineBarriers<kRing>& ring,
                                                  const hopper::PipelineState<kRing>& st,
                                                  uint8_t* (Smem::*buffer)(int) const, Note&& note) const {
    ring.producer_acquire(st);
    note(st.index);
    hopper::mbarrier_arrive_expect_tx(&ring.full[st.index], Tile::kBytes);
    return (smem.*buffer)(st.index);
  }
  // The ring's `posted` barriers (the gather path's requests; kv_gather.cuh).
  __device__ __forceinline__ uint64_t* posted_k() const { return smem.bars().posted.k; }
  __device__ __forceinline__ uint64_t* posted_v() const { return smem.bars().posted.v; }
  // The gather path: claims the stage as for TMA (the consumers released it; `note` runs), then
  // posts the block to the ring's gather warp, which fills the stage and arrives on its `full`
  // barrier itself (kv_gather.cuh). n < 0: the end of the stream.
  template <class Note = NoNote>
  __device__ __forceinline__ void post_gather(hopper::PipelineBarriers<Cfg::kStages>& ring, uint64_t* posted,
                                              hopper::PipelineState<Cfg::kStages>& st,
                                              uint8_t* (Smem::*buffer)(int) const, int n, int kv_head,
                                              const Seq& seq, Note&& note = {}) const {
    ring.producer_acquire(st);
    note(st.index);
    *reinterpret_cast<int4*>((smem.*buffer)(st.index)) =
        n < 0 ? make_int4(0, -1, 0, 0) : make_int4(n * Cfg::kBlockN, seq.seqlen_k(p), seq.batch, kv_head);
    hopper::mbarrier_arrive(&posted[st.index]);
    st.advance();
  }
  // Key block n of a tile: rows from the sequence's first key row, or (paged KV) from the pages the
  // page table names, a box of page_box_rows rows at a time (or gathered row by row: page_gather).
  // `note(stage)` as load_stage's.
  template <class Tile, class Note = NoNote>
  __device__ __forceinline__ void load_keys(const CUtensorMap* map, hopper::PipelineBarriers<Cfg::kStages>& ring,
                                            uint64_t* posted, hopper::PipelineState<Cfg::kStages>& st,
                                            uint8_t* (Smem::*buffer)(int) const, int n, int kv_head,
                                            const Seq& seq, Note&& note = {}) const {
    if (p.page_table == nullptr) {
      load_stage<Tile>(map, ring, st, buffer, seq.k_row0() + n * Cfg::kBlockN, kv_head, seq.k_batch(p), note);
      return;
    }
    if (p.page_gather) {
      post_gather(ring, posted, st, buffer, n, kv_head, seq, note);
      return;
    }
    // Box j holds keys [k0 + j box, ...): its table slot and its row in that page follow from the
    // block's first key by additions (boxes divide pages; one division a block). Boxes past the
    // sequence's last key repeat its last box (rows the mask hides), so no table entry past the
    // sequence is read.
    const int* table = p.page_table + int64_t(seq.batch) * p.page_table_batch_stride;
    const int box = p.page_box_rows, k0 = n * Cfg::kBlockN, keys = seq.seqlen_k(p);
    auto next_box = [&](int j, int& slot, int& row) {
      if (k0 + (j + 1) * box < keys && (row += box) == p.page_size) row = 0, ++slot;
    };
    if constexpr (kPageReadAhead) {
      // The block's entries are read before the wait for a free stage, whose time hides their
      // latency. (Walking the rows again while issuing the boxes, to hold fewer registers, made the
      // decode kernel's pages of 16 5-8% slower: the issue loop is on the refill's critical path.)
      constexpr int kMaxBoxes = Cfg::kBlockN / 16;  // boxes are >= 16 rows (fwd_dispatch.cpp)
      int slot = k0 / p.page_size, row = k0 - slot * p.page_size, pages[kMaxBoxes], rows[kMaxBoxes];
#pragma unroll
      for (int j = 0; j < kMaxBoxes; ++j) {
        if (j * box >= Cfg::kBlockN) break;
        pages[j] = table[slot];
        rows[j] = row;
        next_box(j, slot, row);
      }
      uint8_t* dst = claim_stage<Tile>(ring, st, buffer, note);
#pragma unroll
      for (int j = 0; j < kMaxBoxes; ++j) {
        if (j * box >= Cfg::kBlockN) break;
        hopper::tma_load_tile_rows<Tile>(map, dst, j * box, rows[j], kv_head, pages[j], &ring.full[st.index]);
      }
    } else {
      // Each box's entry read just before its issue (the issue is ordered after the loads before
      // it, so each box waits for one).
      uint8_t* dst = claim_stage<Tile>(ring, st, buffer, note);
      int slot = k0 / p.page_size, row = k0 - slot * p.page_size;
#pragma unroll
      for (int j = 0; j < Cfg::kBlockN / 16; ++j) {
        if (j * box >= Cfg::kBlockN) break;
        hopper::tma_load_tile_rows<Tile>(map, dst, j * box, row, kv_head, table[slot], &ring.full[st.index]);
        next_box(j, slot, row);
      }
    }
    st.advance();
  }
  __device__ __forceinline__ void load_k(hopper::PipelineBarriers<Cfg::kStages>& ring,
                                         hopper::PipelineState<Cfg::kStages>& st, int n, int kv_head,
                                         const Seq& seq) const {
    if constexpr (Cfg::kBlockDescales) {
      // Block n's K and V factors go beside its K stage (fwd_smem.cuh's KeyBlockFactorSlots). Loaded
      // before the wait for a free stage, whose time hides their latency; log2 and 1/v after it.
      const float kf = block_factor(p.k_block, seq.batch, kv_head, n);
      const float vf = block_factor(p.v_block, seq.batch, kv_head, n);
      load_keys<typename Smem::KTile>(&p.tma_k, ring, posted_k(), st, &Smem::k, n, kv_head, seq, [&](int stage) {
        // A zero V factor (a block of V that is all zeros) as 1e-30: its P v(n) underflows to 0 in
        // e4m3, its sums still count (fp32 holds P v(n) / v(n) exactly enough).
        const float r = vf == 0.f ? 1e-30f : vf;
        hopper::st_shared_f32x4(hopper::smem_u32(&smem.bars().k_factors[stage]),
                                make_float4(kf, __log2f(r), __fdividef(1.f, r), 0.f));
      });
    } else {
      load_keys<typename Smem::KTile>(&p.tma_k, ring, posted_k(), st, &Smem::k, n, kv_head, seq);
    }
  }
  // Key block n's factor of one operand (1 without block descales for it). Blocks of factors are
  // whole key blocks (block_size a multiple of 128: validated).
  __device__ __forceinline__ static float block_factor(const fa3_block_scales& b, int batch, int kv_head, int n) {
    if (b.data == nullptr) return 1.f;
    return b.data[batch * b.batch_stride + kv_head * b.head_stride + n / (b.block_size / Cfg::kBlockN)];
  }
  __device__ __forceinline__ void load_v(hopper::PipelineBarriers<Cfg::kStages>& ring,
                                         hopper::PipelineState<Cfg::kStages>& st, int n, int kv_head,
                                         const Seq& seq) const {
    if constexpr (Smem::kTransposeV)  // a block for the V transposer (v_transpose.cuh)
      load_keys<typename Smem::VTile>(&p.tma_v, ring, posted_v(), st, &Smem::v, n, kv_head, seq,
                                      [&](int stage) { smem.bars().v_loaded[stage] = 1; });
    else
      load_keys<typename Smem::VTile>(&p.tma_v, ring, posted_v(), st, &Smem::v, n, kv_head, seq);
  }

  struct Tile {
    WorkTile w;
    BlockRange r;
    Seq seq;
  };

  // A tile whose rows see no key: O = 0 and LSE = -inf, or the sink's (the rows inside the sequence), 16-byte
  // stores by the producer's lane. Rare (causal with seqlen_q > seqlen_k, windows, sequences
  // without keys), and off the consumers' registers, which hold S, P and O across their tile loop.
  __device__ void store_zero(const Tile& t) const {
    if constexpr (Feat::kSplit) {
      store_empty_split(t);
      return;
    }
    const int row0 = t.w.m_block * Cfg::kBlockM, rows = min(Cfg::kBlockM, t.seq.seqlen_q(p) - row0);
    uint16_t* o = static_cast<uint16_t*>(p.o) + t.seq.o_offset(p, t.w.head) + int64_t(row0) * p.o_row_stride;
    float* lse = p.lse == nullptr ? nullptr : p.lse + t.seq.lse_offset(p, t.w.head) + row0;
    for (int r = 0; r < rows; ++r, o += p.o_row_stride) {
      for (int c = 0; c < p.head_dim_v; c += 8) *reinterpret_cast<uint4*>(o + c) = make_uint4(0, 0, 0, 0);
      if (lse != nullptr) lse[r] = empty_row_lse(p, t.w.head);  // (head_dim_v is a multiple of 8: validated)
    }
  }

  // The decode kernel's (tile, split) without a visible key: LSE -inf in its slot tells the combine
  // kernel to give it no weight (its O slot is not read); with one split, O = 0 and LSE = -inf (or
  // the sink's: sink.cuh).
  __device__ void store_empty_split(const Tile& t) const {
    const int64_t row_base = p.cu_seqlens_q ? int64_t(t.seq.q_row0()) : int64_t(t.seq.batch) * p.seqlen_q;
    for (int r = 0; r < Cfg::kBlockM; ++r) {
      const int query = Rows::query(p, t.w.m_block, r), head = Rows::head(p, t.w.head, r);
      if (query >= t.seq.seqlen_q(p)) continue;
      if (p.num_splits > 1) {
        p.lse_partial[(int64_t(t.w.split) * p.heads_q + head) * p.partial_rows + row_base + query] = -INFINITY;
        continue;
      }
      uint16_t* o = static_cast<uint16_t*>(p.o) + t.seq.o_offset(p, head) + int64_t(query) * p.o_row_stride;
      for (int c = 0; c < p.head_dim_v; c += 8) *reinterpret_cast<uint4*>(o + c) = make_uint4(0, 0, 0, 0);
      if (p.lse != nullptr) p.lse[t.seq.lse_offset(p, head) + query] = empty_row_lse(p, head);
    }
  }

  // Run by a producer warp (one lane goes on): kAll loads Q, K and V; kQk Q and K (and writes the
  // zeros of tiles without a visible key, and the end note); kV only V. Each ring has one filler,
  // which fills its stages in the order the consumers read them, so the two warps need no
  // coordination: each walks the same tiles, and either may run ahead of the other by its ring's
  // depth. The role is a runtime argument: two instantiations of this walk made ptxas spill in
  // the consumers.
  __device__ void run(LoadRole role) const {
    if (!hopper::elect_one()) return;
    const bool loads_qk = role != LoadRole::kV, loads_v = role != LoadRole::kQk;
    auto& bars = smem.bars();
    hopper::PipelineState<Cfg::kStages> k_st, v_st;
    hopper::PipelineState<Smem::kQStages> q_st;
    if (loads_qk) {
      hopper::tma_prefetch_map(&p.tma_q);
      hopper::tma_prefetch_map(&p.tma_k);
    }
    if (loads_v) hopper::tma_prefetch_map(&p.tma_v);
    int step = 0;
    VarlenTileWalk varlen_walk;
    auto note_of = [&](const Tile& t) {
      const int m = Feat::kSplit ? t.w.split * p.num_m_blocks + t.w.m_block : t.w.m_block;  // (fwd_smem.cuh)
      return typename Smem::TileNote{m, t.w.head, t.w.batch, t.r.n_min, t.r.n_max,
                                     t.seq.seqlen_q(p), t.seq.seqlen_k(p), t.seq.q_row0(), t.seq.k_row0()};
    };
    // The CTA's next tile with a visible key; the ones without on the way get their zeros.
    auto next_tile = [&](Tile& t) {
      for (;;) {
        if constexpr (Feat::kSplit) {
          if (!split_tile_at_step(step++, blockIdx.x, gridDim.x, p, t.w)) return false;
          t.seq = Seq(p, t.w.batch);
          const int first = Rows::query(p, t.w.m_block, 0);
          if (first >= t.seq.seqlen_q(p)) continue;  // past this sequence's queries: no rows
          t.r = split_block_range(
              block_range_of_queries<Cfg::kBlockN>(first, Rows::queries(p), t.seq, p),
              t.w.split, p.num_splits);
          if (!t.r.empty()) return true;
          if (loads_qk) store_zero(t);
          continue;
        } else if constexpr (Feat::kVarlen) {
          const auto st = varlen_walk.template tile<Cfg::kBlockM>(step++, blockIdx.x, gridDim.x, p, t.w);
          if (st == VarlenTileWalk::kEnd) return false;
          if (st == VarlenTileWalk::kSkip) continue;
        } else if (!tile_at_step(step++, blockIdx.x, gridDim.x, p, t.w)) {
          return false;
        }
        t.seq = Seq(p, t.w.batch);
        t.r = block_range<Cfg::kBlockM, Cfg::kBlockN>(t.w.m_block, t.seq, p);
        if (!t.r.empty()) return true;
        if (loads_qk) store_zero(t);
      }
    };
    auto load_first_k = [&](const Tile& t) { load_k(bars.k, k_st, t.r.n_max - 1, Rows::kv_head(p, t.w.head), t.seq); };
    // (Pack-GQA: the map's box is the tile's queries x its heads, tile_rows.cuh.)
    auto load_q = [&](const Tile& t) {
      load_stage<typename Smem::QTile>(&p.tma_q, bars.q, q_st, &Smem::q,
                                       t.seq.q_row0() + Rows::query(p, t.w.m_block, 0), Rows::head(p, t.w.head, 0),
                                       t.seq.q_batch(p), [&](int stage) { bars.note[stage] = note_of(t); });
    };
    Tile t{{0, 0, 0}, {0, 0}, Seq::unset(p)};
    bool more = next_tile(t);
    if (more && loads_qk) {
      // The first K block does not depend on Q's buffer: start it before waiting for Q to drain.
      load_first_k(t);
      load_q(t);
    }
    while (more) {
      const int kv_head = Rows::kv_head(p, t.w.head);
      // The next tile before this one's K/V: the varlen walk reads sequence lengths from global
      // memory, whose latency hides under the waits for free stages here.
      Tile t_next = t;
      more = next_tile(t_next);
      for (int n = t.r.n_max - 2; n >= t.r.n_min; --n) {
        if (loads_qk) load_k(bars.k, k_st, n, kv_head, t.seq);
        if (loads_v) load_v(bars.v, v_st, n + 1, kv_head, t.seq);
      }
      // The next tile's first K block (and Q, given a second buffer) before this tile's last V:
      // with the cross-tile overlap the consumers use them together. A single Q buffer frees only
      // after this tile's last QK^T, and the consumers need the last V first: that Q comes after it.
      if (more && loads_qk) {
        load_first_k(t_next);
        if constexpr (Smem::kQStages == 2) load_q(t_next);
      }
      if (loads_v) load_v(bars.v, v_st, t.r.n_min, kv_head, t.seq);
      if (more && loads_qk && Smem::kQStages == 1) load_q(t_next);
      t = t_next;
    }
    if (loads_qk) {  // the end: a note without Q (m_block < 0), whose arrival completes the stage
      bars.q.producer_acquire(q_st);
      bars.note[q_st.index] = {-1, 0, 0, 0, 0, 0, 0, 0, 0};
      hopper::mbarrier_arrive(&bars.q.full[q_st.index]);
    }
    if (p.page_gather) {  // the gather warps' end: a request without a block (with e4m3 the V
      const Seq none = Seq::unset(p);  // gather warp passes it on to the transposer: kv_gather.cuh)
      if (loads_qk) post_gather(bars.k, posted_k(), k_st, &Smem::k, -1, 0, none);
      if (loads_v) {
        post_gather(bars.v, posted_v(), v_st, &Smem::v, -1, 0, none, [&](int stage) {
          if constexpr (Smem::kTransposeV) bars.v_loaded[stage] = 0;  // what the transposer sees
        });
      }
    } else if constexpr (Smem::kTransposeV) {  // a V stage without a block: the transposer's end
      bars.v.producer_acquire(v_st);
      bars.v_loaded[v_st.index] = 0;
      hopper::mbarrier_arrive(&bars.v.full[v_st.index]);
    }
  }
};

}  // namespace fa3::attn
