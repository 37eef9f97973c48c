// Writes one consumer warpgroup's 64 rows of O (normalised, converted to 16 bits) and their LSE.
// O goes registers -> swizzled smem (stmatrix) -> global (TMA store, which drops rows past seqlen_q
// and columns past head_dim); tiles without any visible key are written directly as zeros.
// The staging area is this warpgroup's rows of the O tile, or (kOInKV) a free K or V stage.
#pragma once
#include <cmath>

#include "src/attention/fwd_smem.cuh"
#include "src/attention/softmax.cuh"
#include "src/attention/tile_scheduler.cuh"
#include "src/hopper/tma.cuh"
#include "src/hopper/wgmma.cuh"

namespace fa3::attn {

template <class Elem, class Cfg>
struct Epilogue {
  using Smem = FwdSmem<Cfg>;
  using Mma = hopper::Mma16<Elem>;
  static constexpr int kD = Cfg::kHeadDim;

  const FwdKernelParams& p;
  Smem smem;
  int consumer, thread;

  __device__ __forceinline__ int first_row(const WorkTile& w) const { return w.m_block * Cfg::kBlockM + consumer * 64; }

  __device__ __forceinline__ void store_lse(const WorkTile& w, const float (&lse)[2]) const {
    const int lane = thread % 32;
    if (p.lse == nullptr || lane % 4 != 0) return;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = first_row(w) + (thread / 32) * 16 + lane / 4 + 8 * h;
      if (row < p.seqlen_q) p.lse[(int64_t(w.batch) * p.heads_q + w.head) * p.seqlen_q + row] = lse[h];
    }
  }

  // This warpgroup's staging area in the O tile: its 64 rows of 128-row panels.
  __device__ __forceinline__ uint8_t* own_staging() const { return smem.o() + consumer * 64 * hopper::kSwizzleBytes; }

  // `staging`: where this warpgroup's 64 rows go, in panels of `panel_rows` rows (64-column panels,
  // 128-byte swizzle, 1024-byte aligned).
  template <class Softmax>
  __device__ void store(const WorkTile& w, float (&o)[kD / 2], Softmax& softmax, uint8_t* staging,
                        int panel_rows) const {
    float inv[2], lse[2];
    softmax.finalize(inv, lse);
    store_lse(w, lse);
    const int bar = kBarEpilogue + consumer;
    // The previous tile's store from this staging area must have finished reading it.
    if (thread == 0) hopper::tma_store_wait_read();
    hopper::named_barrier_sync(bar, hopper::kWarpgroupSize);
    const int lane = thread % 32, mi = lane / 8, rr = lane % 8;
    const int row = (thread / 32) * 16 + rr + 8 * (mi & 1);  // row inside this warpgroup's 64
    const uint32_t o_base = hopper::smem_u32(staging);
#pragma unroll
    for (int j = 0; j < kD / 8; j += 2) {  // two 8-column blocks (four 8x8 matrices) per stmatrix
      const int col = 8 * (j + (mi >> 1));
      hopper::stmatrix_x4(o_base + hopper::swizzled_offset16(row, col, panel_rows),
                          Mma::pack(o[4 * j] * inv[0], o[4 * j + 1] * inv[0]),
                          Mma::pack(o[4 * j + 2] * inv[1], o[4 * j + 3] * inv[1]),
                          Mma::pack(o[4 * j + 4] * inv[0], o[4 * j + 5] * inv[0]),
                          Mma::pack(o[4 * j + 6] * inv[1], o[4 * j + 7] * inv[1]));
    }
    hopper::fence_view_async_shared();  // stmatrix writes -> visible to the TMA store
    hopper::named_barrier_sync(bar, hopper::kWarpgroupSize);
    if (thread == 0) {
#pragma unroll
      for (int pn = 0; pn < Smem::kPanels; ++pn)
        hopper::tma_store_4d(&p.tma_o, staging + pn * panel_rows * hopper::kSwizzleBytes, pn * 64, first_row(w), w.head,
                             w.batch);
      hopper::tma_store_commit();
    }
  }

  // A tile whose rows see no key: O = 0 and LSE = -inf, written without smem (16-byte stores).
  __device__ void store_zero(const WorkTile& w) const {
    const int chunks = p.head_dim / 8;  // head_dim is a multiple of 8 (validated)
    Elem* base = static_cast<Elem*>(p.o) + int64_t(w.batch) * p.o_batch_stride + int64_t(w.head) * p.o_head_stride;
    for (int idx = thread; idx < 64 * chunks; idx += hopper::kWarpgroupSize) {
      const int row = first_row(w) + idx / chunks;
      if (row < p.seqlen_q)
        *reinterpret_cast<uint4*>(base + int64_t(row) * p.o_row_stride + (idx % chunks) * 8) = make_uint4(0, 0, 0, 0);
    }
    if (p.lse != nullptr && thread < 64 && first_row(w) + thread < p.seqlen_q)
      p.lse[(int64_t(w.batch) * p.heads_q + w.head) * p.seqlen_q + first_row(w) + thread] = -INFINITY;
  }

  // Before the CTA exits (smem must outlive the store's reads).
  __device__ __forceinline__ void drain() const {
    if (thread == 0) hopper::tma_store_wait_read();
  }
};

}  // namespace fa3::attn
