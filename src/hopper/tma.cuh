// TMA (cp.async.bulk.tensor) loads and stores through host-built tensor maps (see tma_map.h).
// Maps reach the kernel as __grid_constant__ parameters: TMA needs the map's address in
// parameter/constant space, which a by-value copy in registers or local memory would not have.
#pragma once
#include <cuda.h>

#include <cstdint>

#include "src/hopper/arch.cuh"
#include "src/hopper/smem_tile.cuh"

namespace fa3::hopper {

// 4-D box load into shared memory; completion (with its byte count) is signalled on `bar`.
__device__ __forceinline__ void tma_load_4d(void* smem_dst, const CUtensorMap* map, int c0, int c1, int c2, int c3,
                                            uint64_t* bar) {
  const int32_t coords[4] = {c0, c1, c2, c3};
  ptx::cp_async_bulk_tensor(ptx::space_shared, ptx::space_global, smem_dst, map, coords, bar);
}

// One box of the map's rows into rows [tile_row, ...) of a Tile, one box per 128-byte panel: the
// map's box is the whole tile (tma_load_tile), or fewer rows (a paged cache's pages); tile_row % 8
// == 0 keeps the 128-byte swizzle atoms where a whole-tile load puts them (the swizzle follows the
// shared-memory address).
template <class Tile>
__device__ __forceinline__ void tma_load_tile_rows(const CUtensorMap* map, uint8_t* dst, int tile_row, int row,
                                                   int head, int batch, uint64_t* bar) {
#pragma unroll
  for (int pn = 0; pn < Tile::kPanels; ++pn)
    tma_load_4d(dst + Tile::panel_offset(pn) + Tile::row_offset(tile_row), map, Tile::panel_col(pn), row, head, batch,
                bar);
}

// Rows [row, row + Tile::kRows) of one head of a BSHD map whose box is the whole tile.
template <class Tile>
__device__ __forceinline__ void tma_load_tile(const CUtensorMap* map, uint8_t* dst, int row, int head, int batch,
                                              uint64_t* bar) {
  tma_load_tile_rows<Tile>(map, dst, 0, row, head, batch, bar);
}

// 4-D box load multicast to the CTAs of the cluster in `cta_mask`: the box lands at the same
// shared-memory offset in each, and completes on the barrier at `bar`'s offset in each.
__device__ __forceinline__ void tma_load_4d_multicast(void* smem_dst, const CUtensorMap* map, int c0, int c1, int c2,
                                                      int c3, uint64_t* bar, uint16_t cta_mask) {
  const int32_t coords[4] = {c0, c1, c2, c3};
  ptx::cp_async_bulk_tensor(ptx::space_cluster, ptx::space_global, smem_dst, map, coords, bar, cta_mask);
}

// 4-D box store from shared memory; out-of-bounds parts of the box are not written.
__device__ __forceinline__ void tma_store_4d(const CUtensorMap* map, const void* smem_src, int c0, int c1, int c2,
                                             int c3) {
  const int32_t coords[4] = {c0, c1, c2, c3};
  ptx::cp_async_bulk_tensor(ptx::space_global, ptx::space_shared, map, coords, smem_src);
}

__device__ __forceinline__ void tma_store_commit() { ptx::cp_async_bulk_commit_group(); }

// Waits until every committed store has finished reading shared memory (the source may be reused).
__device__ __forceinline__ void tma_store_wait_read() { ptx::cp_async_bulk_wait_group_read(ptx::n32_t<0>{}); }

__device__ __forceinline__ void tma_prefetch_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

}  // namespace fa3::hopper
