// The shared-memory image of a 16-bit [rows][cols] tile as TMA writes it with SWIZZLE_128B:
// columns in panels of 64 (128 bytes per row), each panel [rows][128 B], and inside every
// 8-row (1024-byte) atom the 16-byte chunk index XORed with the row (bits 4-6 ^ bits 7-9).
#pragma once
#include <cstdint>

namespace fa3::hopper {

constexpr int kSwizzleBytes = 128;  // one row of a panel
constexpr int kPanelCols16 = 64;    // 16-bit columns per panel

// Byte offset of element (row, col) in a tile of `rows` rows (16-bit elements).
__device__ __forceinline__ uint32_t swizzled_offset16(int row, int col, int rows) {
  const uint32_t panel = col / kPanelCols16, byte = (col % kPanelCols16) * 2;
  const uint32_t chunk = (byte >> 4) ^ (row & 7);
  return panel * rows * kSwizzleBytes + row * kSwizzleBytes + (chunk << 4) + (byte & 15);
}

// Four 8x8 16-bit matrices from registers to shared memory; lane l gives the row address of
// matrix l/8, row l%8. Register j of every thread holds its 2 elements of matrix j.
__device__ __forceinline__ void stmatrix_x4(uint32_t smem_addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(smem_addr), "r"(r0),
               "r"(r1), "r"(r2), "r"(r3)
               : "memory");
}

}  // namespace fa3::hopper
