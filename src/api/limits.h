// Bounds the kernels' 32-bit arithmetic and CUDA's grids put on arguments, checked on the host
// (validate.cpp, the launches) so that no count wraps inside a kernel.
#pragma once
#include <cstdint>

namespace fa3::detail {

// Positions, tiles and rows that kernels count in 32 bits, with room for a key block or a grid's
// stride past the last.
constexpr int64_t kMaxIndex32 = (int64_t(1) << 31) - (int64_t(1) << 16);
// CUDA's grid y and z extents (the backward's and the reference kernels' heads and batch entries).
constexpr int64_t kMaxGridYz = 65535;

}  // namespace fa3::detail
