// Shared-memory tiles as TMA writes them with SWIZZLE_128B, and the offsets every user of them
// needs (TMA boxes, wgmma descriptors and their k-steps, element addresses for stmatrix and direct
// copies), so that no caller computes panel arithmetic by hand.
//
// A [kRows][kCols] tile of kElemBytes-byte elements: columns in panels of 128 bytes (64 16-bit or
// 128 e4m3 elements), each panel [kRows][128 B], panels one after another; inside every 8-row
// (1024-byte) atom the 16-byte chunk index is XORed with the row (bits 4-6 ^ bits 7-9). Tiles
// start on 1024-byte boundaries, so wgmma descriptors keep base_offset 0.
#pragma once
#include <cstdint>

namespace fa3::hopper {

constexpr int kSwizzleBytes = 128;  // one row of a panel
constexpr int kSwizzleAtomBytes = 8 * kSwizzleBytes;  // the XOR pattern repeats every 8 rows

// Byte offset of element (row, col) in a tile of `rows` rows.
template <int kElemBytes>
__host__ __device__ __forceinline__ constexpr uint32_t swizzled_offset(int row, int col, int rows) {
  constexpr int kPanelCols = kSwizzleBytes / kElemBytes;
  const uint32_t panel = col / kPanelCols, byte = (col % kPanelCols) * kElemBytes;
  const uint32_t chunk = (byte >> 4) ^ (row & 7);
  return panel * rows * kSwizzleBytes + row * kSwizzleBytes + (chunk << 4) + (byte & 15);
}

template <int kElemBytes_, int kRows_, int kCols_>
struct SmemTile {
  static constexpr int kElemBytes = kElemBytes_, kRows = kRows_, kCols = kCols_;
  static constexpr int kPanelCols = kSwizzleBytes / kElemBytes;  // also the TMA box's width
  static constexpr int kPanels = (kCols + kPanelCols - 1) / kPanelCols;
  static constexpr int kPanelBytes = kRows * kSwizzleBytes;
  static constexpr int kBytes = kPanels * kPanelBytes;
  static_assert(kPanelBytes % kSwizzleAtomBytes == 0, "tiles must keep 1024-byte alignment (8-row multiples)");

  // Where panel pn starts, and its first column (the TMA box's column coordinate).
  __host__ __device__ static constexpr int panel_offset(int pn) { return pn * kPanelBytes; }
  __host__ __device__ static constexpr int panel_col(int pn) { return pn * kPanelCols; }

  // Operand with K along the columns (Q, K: "K-major"): the descriptor start of the k-th chunk of
  // kK columns (one wgmma's K: 16 16-bit or 32 e4m3 elements = 32 bytes), inside or across panels.
  template <int kK>
  __host__ __device__ static constexpr uint32_t k_chunk_offset(int k) {
    return (k * kK * kElemBytes / kSwizzleBytes) * kPanelBytes + (k * kK * kElemBytes) % kSwizzleBytes;
  }
  // Operand with K along the rows (V as PV's B: "N-major"): the start of the k-th chunk of kK rows.
  template <int kK>
  __host__ __device__ static constexpr uint32_t row_chunk_offset(int k) {
    return k * kK * kSwizzleBytes;
  }
  // Rows [row0, ...) of the tile as a tile of their own (a warpgroup's 64 rows of Q): row0 % 8 == 0.
  __host__ __device__ static constexpr int row_offset(int row0) { return row0 * kSwizzleBytes; }

  // Descriptor strides (PTX ISA "Matrix Descriptor Format", 128-byte swizzle): K-major operands
  // step 8 rows (one atom) per SBO and ignore LBO (16); N-major ones step panels per LBO.
  static constexpr uint32_t kKMajorLbo = 16, kKMajorSbo = kSwizzleAtomBytes;
  static constexpr uint32_t kNMajorLbo = kPanelBytes, kNMajorSbo = kSwizzleAtomBytes;

  // Byte offset of element (row, col).
  __device__ static __forceinline__ uint32_t offset(int row, int col) {
    return swizzled_offset<kElemBytes>(row, col, kRows);
  }
};

// A 16-bit tile (fp16 / bf16).
template <int kRows, int kCols>
using SmemTile16 = SmemTile<2, kRows, kCols>;

// Four 8x8 16-bit matrices from registers to shared memory; lane l gives the row address of
// matrix l/8, row l%8. Register j of every thread holds its 2 elements of matrix j.
__device__ __forceinline__ void stmatrix_x4(uint32_t smem_addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(smem_addr), "r"(r0),
               "r"(r1), "r"(r2), "r"(r3)
               : "memory");
}

// The same, each matrix stored transposed (.trans): register j's two elements (fragment row r,
// columns 2c, 2c+1) land in rows 2c, 2c+1, column r, of the matrix whose stored rows lanes 8j..8j+7
// address. An accumulator's 8-column block thus becomes 8 stored rows of 8 consecutive fragment rows.
__device__ __forceinline__ void stmatrix_x4_trans(uint32_t smem_addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(smem_addr), "r"(r0),
               "r"(r1), "r"(r2), "r"(r3)
               : "memory");
}
// Two matrices: lanes 0-15 give the row addresses.
__device__ __forceinline__ void stmatrix_x2_trans(uint32_t smem_addr, uint32_t r0, uint32_t r1) {
  asm volatile("stmatrix.sync.aligned.m8n8.x2.trans.shared.b16 [%0], {%1, %2};\n" ::"r"(smem_addr), "r"(r0), "r"(r1)
               : "memory");
}

// Four 8x8 16-bit matrices from shared memory, each loaded transposed (.trans); lane l gives the
// row address of matrix l/8, row l%8 (16 bytes). Register j of thread i holds elements (rows 2(i%4)
// and 2(i%4)+1, column i/4) of matrix j, the first in its low half.
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t smem_addr, uint32_t (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr));
}

// A warpgroup's m64 accumulator, as 16-bit pairs frag[j][h] (register pair of rows 8h + g, columns
// 8j + 2t, 8j + 2t + 1 of its warp's 16 rows: the accumulator's own order, acc_row / acc_col),
// stored transposed: fragment column x becomes a stored row of 8 consecutive fragment rows whose
// 16 bytes start at at(x, r), r the first of those rows (warp w's rows: 16w, 16w + 8). Two column
// blocks per stmatrix.x4, an odd last one by .x2.
template <int kChunks, class At>
__device__ __forceinline__ void store_fragment_transposed(const uint32_t (&frag)[kChunks][2], At at, int thread) {
  const int lane = thread % 32, r = lane % 8, mi = lane / 8, rows = 16 * (thread / 32) + 8 * (mi % 2);
#pragma unroll
  for (int j = 0; j + 1 < kChunks; j += 2)
    stmatrix_x4_trans(at(8 * (j + mi / 2) + r, rows), frag[j][0], frag[j][1], frag[j + 1][0], frag[j + 1][1]);
  if constexpr (kChunks % 2 == 1)  // lanes 0-15 address the last block's two matrices
    stmatrix_x2_trans(at(8 * (kChunks - 1) + r, rows), frag[kChunks - 1][0], frag[kChunks - 1][1]);
}

}  // namespace fa3::hopper
