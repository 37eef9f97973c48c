// Which query and which query head each row of a query tile holds.
//  - one head per tile (TileRows<kBlockM, false>): tile m holds queries m * kBlockM + r of the
//    tile's head;
//  - pack-GQA (TileRows<kBlockM, true>, the decode kernel): the tile's "head" is a kv head, and its
//    rows are S = kBlockM / G queries of each of the G query heads that share that kv head's K/V:
//    row r = (query m * S + r % S, query head kv * G + r / S). The K/V blocks are then read once for
//    G heads. In the BSHD tensors those rows are one TMA box of S rows x G heads (the box lays rows
//    out row-fastest, then heads), so Q needs no other load. G = 1 is the unpacked case of the same
//    kernel (S = kBlockM). G divides kBlockM (a power of two: S is too).
// The row -> query map is not monotonic for G > 1: bounds over a tile use its query range
// [first_query, query_end), per-row masks the query of each row (mask.cuh).
#pragma once
#include "src/attention/fwd_params.h"

namespace fa3::attn {

template <int kBlockM, bool kPacked>
struct TileRows;

template <int kBlockM>
struct TileRows<kBlockM, false> {
  __host__ __device__ __forceinline__ static int queries(const FwdKernelParams&) { return kBlockM; }
  __host__ __device__ __forceinline__ static int query(const FwdKernelParams&, int m_block, int row) {
    return m_block * kBlockM + row;
  }
  __host__ __device__ __forceinline__ static int head(const FwdKernelParams&, int tile_head, int) { return tile_head; }
  // The kv head whose K/V the tile reads.
  __host__ __device__ __forceinline__ static int kv_head(const FwdKernelParams& p, int tile_head) {
    return tile_head / p.head_ratio;
  }
};

template <int kBlockM>
struct TileRows<kBlockM, true> {
  __host__ __device__ __forceinline__ static int queries(const FwdKernelParams& p) { return 1 << p.pack_queries_log2; }
  __host__ __device__ __forceinline__ static int query(const FwdKernelParams& p, int m_block, int row) {
    return (m_block << p.pack_queries_log2) + (row & ((1 << p.pack_queries_log2) - 1));
  }
  __host__ __device__ __forceinline__ static int head(const FwdKernelParams& p, int tile_head, int row) {
    return tile_head * p.pack_group + (row >> p.pack_queries_log2);
  }
  // Tiles are per kv head when packed (pack_group = head_ratio), per query head when not (1).
  __host__ __device__ __forceinline__ static int kv_head(const FwdKernelParams& p, int tile_head) {
    return tile_head * p.pack_group / p.head_ratio;
  }
};

}  // namespace fa3::attn
