// Writes one consumer warpgroup's 64 rows of O (normalised, converted to 16 bits) and their LSE.
// O goes registers -> swizzled smem (stmatrix) -> global, by one of two output stores:
//  - TMA store (fixed-length batches): drops rows past seqlen_q and columns past head_dim_v;
//  - masked direct store (varlen): every thread copies 16-byte chunks of the staged rows that lie
//    inside the sequence, since a TMA box of a sequence's last tile would spill into the next
//    sequence's packed rows (or into rows past seqused_q) and TMA clips only at the tensor's end.
// (Tiles without any visible key are the producer's: MainloopLoad::store_zero.) The staging area is
// this warpgroup's rows of the O tile, or (kOInKV) a free K or V stage.
// The decode kernel (FwdFeatures::kSplit) has a third store instead, straight from the registers:
// fp32 partial O and LSE of its split into the workspace for the combine kernel, or with one split
// O itself (store_partial).
#pragma once
#include <cmath>

#include "src/attention/descale.cuh"
#include "src/attention/fwd_features.h"
#include "src/attention/fwd_smem.cuh"
#include "src/attention/seqlen_info.cuh"
#include "src/attention/sink.cuh"
#include "src/attention/softmax.cuh"
#include "src/attention/tile_rows.cuh"
#include "src/attention/tile_scheduler.cuh"
#include "src/hopper/tma.cuh"
#include "src/hopper/wgmma.cuh"

namespace fa3::attn {

template <class Elem, class Cfg, class Feat>
struct Epilogue {
  using Smem = FwdSmem<Cfg>;
  // O's element type (bf16 for e4m3 operands) and its packing.
  using Out = typename hopper::OperandTraits<Elem>::Out;
  using Mma = hopper::Mma16<Out>;
  static constexpr bool kFp8 = Smem::kTransposeV;
  using Seq = SeqlenInfo<Feat::kVarlen>;
  static constexpr int kDv = Cfg::kHeadDimV;
  static constexpr bool kDirectStore = Feat::kVarlen;

  const FwdKernelParams& p;
  Smem smem;
  int consumer, thread;

  // The query head of the thread's row h (0: its row g, 1: g + 8): the tile's, or with pack-GQA
  // (the decode kernel) the row's own (tile_rows.cuh).
  __device__ __forceinline__ int row_head(const WorkTile& w, int h) const {
    if constexpr (Feat::kSplit)
      return TileRows<Cfg::kBlockM, true>::head(p, w.head, tile_row(h));
    else return w.head;
  }
  // Row h of this thread, counted in the tile (the accumulator's row map, wgmma.cuh).
  __device__ __forceinline__ int tile_row(int h) const { return consumer * 64 + (thread / 32) * 16 + (thread % 32) / 4 + 8 * h; }

  // This warpgroup's first row, counted in its sequence.
  __device__ __forceinline__ int first_row(const WorkTile& w) const { return w.m_block * Cfg::kBlockM + consumer * 64; }

  __device__ __forceinline__ void store_lse(const WorkTile& w, const Seq& seq, const float (&lse)[2]) const {
    const int lane = thread % 32;
    if (p.lse == nullptr || lane % 4 != 0) return;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = first_row(w) + (thread / 32) * 16 + lane / 4 + 8 * h;
      if (row < seq.seqlen_q(p)) p.lse[seq.lse_offset(p, w.head) + row] = lse[h];
    }
  }

  // Where a warpgroup stages its 64 rows: its rows of the O tile (Staging = Smem::OTile, whose
  // panels have kBlockM rows), or a 64-row tile of its own (Smem::OWarpgroupTile, kOInKV).
  using OwnStaging = typename Smem::OTile;
  using KeptStaging = typename Smem::OWarpgroupTile;
  __device__ __forceinline__ uint8_t* own_staging() const { return smem.o() + OwnStaging::row_offset(consumer * 64); }

  // `staging`: this warpgroup's 64 rows, laid out as Staging's rows 0..63.
  template <class Staging, class Softmax>
  __device__ void store(const WorkTile& w, const Seq& seq, float (&o)[kDv / 2], Softmax& softmax,
                        uint8_t* staging) const {
    float inv[2], lse[2];
    softmax.finalize(inv, lse);
    // Sinks join each finished row, unless its split's partial goes to the combine, which adds them.
    if (p.sinks != nullptr && !(Feat::kSplit && p.num_splits > 1)) {
#pragma unroll
      for (int h = 0; h < 2; ++h) join_sink(p.sinks[row_head(w, h)], inv[h], lse[h]);
    }
    if constexpr (kFp8) {
      // (V's block factors, if any, are in P already: descale.cuh.)
      const float dv = output_descale<true>(p, w.batch, row_head(w, 0));  // (any row's: one kv head)
      inv[0] *= dv;
      inv[1] *= dv;
    }
    if constexpr (Feat::kSplit) {
      store_partial(w, seq, o, inv, lse);
      return;
    }
    store_lse(w, seq, lse);
    const int bar = kBarEpilogue + consumer;
    // The previous tile's store from this staging area must have finished reading it (the direct
    // store's reads are ordered by this barrier alone).
    if (!kDirectStore && thread == 0) hopper::tma_store_wait_read();
    hopper::named_barrier_sync(bar, hopper::kWarpgroupSize);
    const int lane = thread % 32, mi = lane / 8, rr = lane % 8;
    const int row = (thread / 32) * 16 + rr + 8 * (mi & 1);  // row inside this warpgroup's 64
    const uint32_t o_base = hopper::smem_u32(staging);
#pragma unroll
    for (int j = 0; j < kDv / 8; j += 2) {  // two 8-column blocks (four 8x8 matrices) per stmatrix
      const int col = 8 * (j + (mi >> 1));
      hopper::stmatrix_x4(o_base + Staging::offset(row, col),
                          Mma::pack(o[4 * j] * inv[0], o[4 * j + 1] * inv[0]),
                          Mma::pack(o[4 * j + 2] * inv[1], o[4 * j + 3] * inv[1]),
                          Mma::pack(o[4 * j + 4] * inv[0], o[4 * j + 5] * inv[0]),
                          Mma::pack(o[4 * j + 6] * inv[1], o[4 * j + 7] * inv[1]));
    }
    if constexpr (kDirectStore) {
      hopper::named_barrier_sync(bar, hopper::kWarpgroupSize);
      store_direct<Staging>(w, seq, staging);
      // (kOInKV: each thread's own arrival gives the K/V stage back after its reads here,
      // MainloopMma::release_kept, StageReleasers; an own staging tile's next writes wait at the
      // barrier above.)
      return;
    }
    hopper::fence_view_async_shared();  // stmatrix writes -> visible to the TMA store
    hopper::named_barrier_sync(bar, hopper::kWarpgroupSize);
    if (thread == 0) {
#pragma unroll
      for (int pn = 0; pn < Staging::kPanels; ++pn)
        hopper::tma_store_4d(&p.tma_o, staging + Staging::panel_offset(pn), Staging::panel_col(pn),
                             seq.q_row0() + first_row(w), w.head, seq.q_batch(p));
      hopper::tma_store_commit();
    }
  }

  // The masked direct store: 16-byte chunks (8 columns) of the staged rows inside the sequence and
  // inside head_dim_v (a multiple of 8, validated), consecutive threads on consecutive chunks of a row.
  template <class Staging>
  __device__ void store_direct(const WorkTile& w, const Seq& seq, const uint8_t* staging) const {
    const int chunks = p.head_dim_v / 8, row0 = first_row(w);
    const int rows = min(64, seq.seqlen_q(p) - row0);
    Out* base = static_cast<Out*>(p.o) + seq.o_offset(p, w.head) + int64_t(row0) * p.o_row_stride;
    for (int idx = thread; idx < rows * chunks; idx += hopper::kWarpgroupSize) {
      const int r = idx / chunks, c = idx % chunks;
      const uint4 v = *reinterpret_cast<const uint4*>(staging + Staging::offset(r, 8 * c));
      *reinterpret_cast<uint4*>(base + int64_t(r) * p.o_row_stride + 8 * c) = v;
    }
  }

  // The decode kernel's store: this thread's two rows (pack-GQA rows: query and head per row,
  // tile_rows.cuh) of normalised O and their LSE, into the slot of the tile's split (fp32, for the
  // combine kernel) or, with one split, into O and LSE themselves (no combine). Four threads write
  // a row's 8-column block. A decode's O is a few MB at most (the K/V read is the cost): no staging.
  __device__ void store_partial(const WorkTile& w, const Seq& seq, const float (&o)[kDv / 2], const float (&inv)[2],
                                const float (&lse)[2]) const {
    using Rows = TileRows<Cfg::kBlockM, true>;
    const int lane = thread % 32;
    const int64_t row_base = p.cu_seqlens_q ? int64_t(seq.q_row0()) : int64_t(seq.batch) * p.seqlen_q;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = tile_row(h), query = Rows::query(p, w.m_block, r);
      if (query >= seq.seqlen_q(p)) continue;
      const int head = Rows::head(p, w.head, r);
      if (p.num_splits == 1) {
        if (lane % 4 == 0 && p.lse != nullptr) p.lse[seq.lse_offset(p, head) + query] = lse[h];
        Out* dst = static_cast<Out*>(p.o) + seq.o_offset(p, head) + int64_t(query) * p.o_row_stride + 2 * (lane % 4);
#pragma unroll
        for (int j = 0; j < kDv / 8; ++j)  // (head_dim_v is a multiple of 8: whole 8-column blocks)
          if (8 * j < p.head_dim_v)
            *reinterpret_cast<uint32_t*>(dst + 8 * j) = Mma::pack(o[4 * j + 2 * h] * inv[h], o[4 * j + 2 * h + 1] * inv[h]);
        continue;
      }
      const int64_t row = (int64_t(w.split) * p.heads_q + head) * p.partial_rows + row_base + query;
      if (lane % 4 == 0) p.lse_partial[row] = lse[h];
      float* dst = p.o_partial + row * p.head_dim_v + 2 * (lane % 4);
#pragma unroll
      for (int j = 0; j < kDv / 8; ++j)
        if (8 * j < p.head_dim_v)
          *reinterpret_cast<float2*>(dst + 8 * j) = make_float2(o[4 * j + 2 * h] * inv[h], o[4 * j + 2 * h + 1] * inv[h]);
    }
  }

  // Before the CTA exits (smem must outlive the store's reads).
  __device__ __forceinline__ void drain() const {
    if (thread == 0) hopper::tma_store_wait_read();
  }
};

}  // namespace fa3::attn
