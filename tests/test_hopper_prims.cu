// The Hopper layer on its own: TMA round trip and the swizzle formula, one wgmma tile (SS and RS,
// as the attention kernel uses them) against a CPU GEMM, the same for e4m3 (SS, RS with the e4m3
// A-fragment layout, the e4m3 packing) and with an M-major A (the backward's transposed operands),
// an accumulator stored transposed by stmatrix, all through hopper::SmemTile; a TMA/mbarrier ring that wraps many times, and the same ring shared
// by a 2-CTA cluster (multicast loads, remote releases).
#include <cuda_bf16.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "reference/rounding.h"
#include "src/hopper/driver_api.h"
#include "src/hopper/mbarrier.cuh"
#include "src/hopper/smem_tile.cuh"
#include "src/hopper/tma.cuh"
#include "src/hopper/tma_map.h"
#include "src/hopper/wgmma.cuh"
#include "tests/gpu_util.h"

namespace fa3::test {
namespace {

using namespace fa3::hopper;

std::vector<uint16_t> random_bf16(size_t n, std::vector<float>* values) {
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<uint16_t> bits(n);
  values->resize(n);
  for (size_t i = 0; i < n; ++i) {
    bits[i] = ref::to_bf16_bits(dist(rng()));
    (*values)[i] = ref::from_bf16_bits(bits[i]);
  }
  return bits;
}

CUtensorMap bf16_map(const void* base, uint64_t d, uint64_t rows, uint64_t heads, uint64_t batch, uint32_t box_rows) {
  CUtensorMap m;
  const TmaMap4dDesc desc{CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, base, {d, rows, heads, batch},
                          {d * 2 * heads, d * 2, d * 2 * heads * rows}, {64, box_rows, 1, 1}};
  // layout [batch][rows][heads][d]: row stride = heads*d, head stride = d
  const std::string err = encode_tma_map_4d(&m, desc);
  EXPECT_EQ(err, "");
  return m;
}

// ---- 1. TMA load -> smem -> (TMA store, and plain reads through the swizzle formula) ----
constexpr int kRows = 64, kCols = 128, kTileBytes = kRows * kCols * 2;

__global__ void tma_round_trip(const __grid_constant__ CUtensorMap in, const __grid_constant__ CUtensorMap out,
                               __nv_bfloat16* plain, int rows, int heads) {
  __shared__ alignas(1024) uint8_t tile[kTileBytes];
  __shared__ uint64_t bar;
  const int m = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  if (threadIdx.x == 0) {
    mbarrier_init(&bar, 1);
    mbarrier_init_fence();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    mbarrier_arrive_expect_tx(&bar, kTileBytes);
    for (int p = 0; p < 2; ++p) tma_load_4d(tile + p * kRows * 128, &in, p * 64, m * kRows, h, b, &bar);
  }
  mbarrier_wait(&bar, 0);
  // Plain reads via swizzled_offset<2> must see the tensor's element (r, c).
  for (int idx = threadIdx.x; idx < kRows * kCols; idx += blockDim.x) {
    const int r = idx / kCols, c = idx % kCols, row = m * kRows + r;
    if (row < rows)
      plain[((int64_t(b) * rows + row) * heads + h) * kCols + c] =
          *reinterpret_cast<const __nv_bfloat16*>(tile + swizzled_offset<2>(r, c, kRows));
  }
  if (threadIdx.x == 0) {
    for (int p = 0; p < 2; ++p) tma_store_4d(&out, tile + p * kRows * 128, p * 64, m * kRows, h, b);
    tma_store_commit();
    tma_store_wait_read();
  }
}

// The driver functions fa3 looks up: each is there, or says by name why not (no GPU needed: without
// a driver every lookup fails, and the messages are what fa3_forward would report).
TEST(HopperPrims, DriverApiFindsOrNamesEachFunction) {
  const fa3::hopper::DriverApi& api = fa3::hopper::driver_api();
  auto check = [](const auto& f, const char* name) {
    if (f.fn != nullptr) EXPECT_TRUE(f.why.empty()) << name;
    else EXPECT_NE(f.why.find(name), std::string::npos) << f.why;
  };
  check(api.encode_tiled, "cuTensorMapEncodeTiled");
  check(api.launch_kernel, "cuLaunchKernel");
  check(api.error_name, "cuGetErrorName");
  EXPECT_EQ(&api, &fa3::hopper::driver_api()) << "looked up once";
}

TEST(HopperPrims, TmaRoundTripAndSwizzle) {
  FA3_REQUIRE_GPU();
  const int batch = 2, rows = 100, heads = 3;  // 100 rows: the second tile is clipped by TMA
  const size_t n = size_t(batch) * rows * heads * kCols;
  std::vector<float> vals;
  const auto bits = random_bf16(n, &vals);
  DeviceBuffer in(n * 2), out(n * 2), plain(n * 2);
  in.upload(bits.data(), n * 2);
  out.fill_bytes(0xFF);
  plain.fill_bytes(0xFF);
  const CUtensorMap mi = bf16_map(in.get(), kCols, rows, heads, batch, kRows);
  const CUtensorMap mo = bf16_map(out.get(), kCols, rows, heads, batch, kRows);
  tma_round_trip<<<dim3((rows + kRows - 1) / kRows, heads, batch), 128>>>(mi, mo, static_cast<__nv_bfloat16*>(plain.get()),
                                                                         rows, heads);
  FA3_CUDA_CHECK(cudaGetLastError());
  FA3_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<uint16_t> got(n), got_plain(n);
  out.download(got.data(), n * 2);
  plain.download(got_plain.data(), n * 2);
  size_t bad = 0, bad_plain = 0;
  for (size_t i = 0; i < n; ++i) {
    bad += got[i] != bits[i];
    bad_plain += got_plain[i] != bits[i];
  }
  EXPECT_EQ(bad, 0u) << "TMA store did not reproduce the loaded tensor";
  EXPECT_EQ(bad_plain, 0u) << "swizzled_offset<2> disagrees with TMA's 128B swizzle";
}

// The test kernels' start: the 1024-aligned dynamic smem base (the swizzle atom) and one barrier
// for the TMA loads, initialised and fenced for the async proxy.
__device__ uint8_t* tile_kernel_start(uint8_t* raw, uint64_t* bar) {
  if (threadIdx.x == 0) {
    mbarrier_init(bar, 1);
    mbarrier_init_fence();
  }
  __syncthreads();
  return reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t(1023));
}

// ---- 2. one warpgroup: S = A B^T (SS), then O = bf16(S) V (RS, V N-major) ----
// Every offset comes from hopper::SmemTile, as in the attention kernel: this tests the type too.
constexpr int kM = 64, kN = 128, kK = 128;  // A [64][128], B [128][128] (K-major), V [128 keys][128]
using ATile = SmemTile16<kM, kK>;
using BTile = SmemTile16<kN, kK>;
using VTile = SmemTile16<kN, kK>;
static_assert(ATile::kPanels == 2 && ATile::kBytes == kM * 256 && ATile::k_chunk_offset<16>(5) == kM * 128 + 32,
              "SmemTile: two 64-column panels; k-chunk 5 is the second panel's second 32 bytes");
static_assert(VTile::row_chunk_offset<16>(3) == 3 * 16 * 128 && VTile::kNMajorLbo == kN * 128, "SmemTile: N-major steps");

__global__ void __launch_bounds__(128) wgmma_tile(const __grid_constant__ CUtensorMap ma,
                                                  const __grid_constant__ CUtensorMap mb,
                                                  const __grid_constant__ CUtensorMap mv, float* s_out, float* o_out) {
  extern __shared__ uint8_t raw[];
  __shared__ uint64_t bar;
  uint8_t* base = tile_kernel_start(raw, &bar);
  uint8_t *sa = base, *sb = base + ATile::kBytes, *sv = sb + BTile::kBytes;
  if (threadIdx.x == 0) {
    mbarrier_arrive_expect_tx(&bar, ATile::kBytes + BTile::kBytes + VTile::kBytes);
    for (int p = 0; p < ATile::kPanels; ++p) {
      tma_load_4d(sa + ATile::panel_offset(p), &ma, ATile::panel_col(p), 0, 0, 0, &bar);
      tma_load_4d(sb + BTile::panel_offset(p), &mb, BTile::panel_col(p), 0, 0, 0, &bar);
      tma_load_4d(sv + VTile::panel_offset(p), &mv, VTile::panel_col(p), 0, 0, 0, &bar);
    }
  }
  mbarrier_wait(&bar, 0);
  float s[kN / 2], o[kK / 2];
  const uint64_t da = make_smem_desc(smem_u32(sa), ATile::kKMajorLbo, ATile::kKMajorSbo);
  const uint64_t db = make_smem_desc(smem_u32(sb), BTile::kKMajorLbo, BTile::kKMajorSbo);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kK / 16; ++kk)
    WgmmaBf16<kN>::ss<0>(s, desc_advance(da, ATile::k_chunk_offset<16>(kk)), desc_advance(db, BTile::k_chunk_offset<16>(kk)),
                         kk > 0);
  wgmma_commit();
  wgmma_wait<0>();
  fence_operand(s);
  uint32_t pa[kN / 16][4];
#pragma unroll
  for (int kb = 0; kb < kN / 16; ++kb)
#pragma unroll
    for (int j = 0; j < 4; ++j) pa[kb][j] = Mma16<__nv_bfloat16>::pack(s[8 * kb + 2 * j], s[8 * kb + 2 * j + 1]);
#pragma unroll
  for (int i = 0; i < kK / 2; ++i) o[i] = 0.f;
  const uint64_t dv = make_smem_desc(smem_u32(sv), VTile::kNMajorLbo, VTile::kNMajorSbo);
  fence_operand(o);
  wgmma_fence();
#pragma unroll
  for (int kb = 0; kb < kN / 16; ++kb) WgmmaBf16<kK>::rs<1>(o, pa[kb], desc_advance(dv, VTile::row_chunk_offset<16>(kb)), 1);
  wgmma_commit();
  wgmma_wait<0>();
  fence_operand(o);
  const int w = threadIdx.x / 32, g = (threadIdx.x % 32) / 4, t = threadIdx.x % 4;
#pragma unroll
  for (int i = 0; i < kN / 2; ++i) s_out[(16 * w + g + acc_row(i)) * kN + acc_col(i) + 2 * t] = s[i];
#pragma unroll
  for (int i = 0; i < kK / 2; ++i) o_out[(16 * w + g + acc_row(i)) * kK + acc_col(i) + 2 * t] = o[i];
}

TEST(HopperPrims, WgmmaTileSsAndRs) {
  FA3_REQUIRE_GPU();
  std::vector<float> a, b, v;
  const auto ab = random_bf16(kM * kK, &a), bb = random_bf16(kN * kK, &b), vb = random_bf16(kN * kK, &v);
  DeviceBuffer da(ab.size() * 2), db(bb.size() * 2), dv(vb.size() * 2), ds(kM * kN * 4), dout(kM * kK * 4);
  da.upload(ab.data(), ab.size() * 2);
  db.upload(bb.data(), bb.size() * 2);
  dv.upload(vb.data(), vb.size() * 2);
  ds.fill_bytes(0xFF);
  dout.fill_bytes(0xFF);
  const CUtensorMap ma = bf16_map(da.get(), kK, kM, 1, 1, kM), mb = bf16_map(db.get(), kK, kN, 1, 1, kN),
                    mv = bf16_map(dv.get(), kK, kN, 1, 1, kN);
  const int smem = (kM + 2 * kN) * 256 + 1024;
  FA3_CUDA_CHECK(cudaFuncSetAttribute(wgmma_tile, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  wgmma_tile<<<1, 128, smem>>>(ma, mb, mv, static_cast<float*>(ds.get()), static_cast<float*>(dout.get()));
  FA3_CUDA_CHECK(cudaGetLastError());
  FA3_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> s(kM * kN), o(kM * kK);
  ds.download(s.data(), s.size() * 4);
  dout.download(o.data(), o.size() * 4);
  double s_err = 0, o_err = 0;
  std::vector<float> p(kM * kN);
  for (int i = 0; i < kM; ++i)
    for (int j = 0; j < kN; ++j) {
      double acc = 0;
      for (int k = 0; k < kK; ++k) acc += double(a[i * kK + k]) * b[j * kK + k];
      s_err = worse(s_err, std::fabs(acc - s[i * kN + j]));
      p[i * kN + j] = ref::round_bf16(s[i * kN + j]);  // P as the kernel packs it
    }
  for (int i = 0; i < kM; ++i)
    for (int d = 0; d < kK; ++d) {
      double acc = 0;
      for (int j = 0; j < kN; ++j) acc += double(p[i * kN + j]) * v[j * kK + d];
      o_err = worse(o_err, std::fabs(acc - o[i * kK + d]) / std::max(1.0, std::fabs(acc)));
    }
  EXPECT_LT(s_err, 1e-3) << "SS wgmma (K-major A and B, 128B swizzle) disagrees with the CPU GEMM";
  EXPECT_LT(o_err, 1e-3) << "RS wgmma (A in registers, B N-major) disagrees with the CPU GEMM";
}

// ---- 2b. e4m3: S = A B^T (SS, both K-major, k32 steps), and the same product with A from
// registers in the e4m3 A-fragment layout (RS) -- the FP8 forward's two GEMM forms ----
constexpr int kM8 = 64, kN8 = 128, kK8 = 128;  // A [64][128], B [128][128] e4m3: 128 bytes per row = one panel
using A8Tile = SmemTile<1, kM8, kK8>;
using B8Tile = SmemTile<1, kN8, kK8>;
static_assert(A8Tile::kPanels == 1 && A8Tile::k_chunk_offset<32>(3) == 96, "SmemTile: e4m3 k32 chunks are 32 bytes");

CUtensorMap u8_map(const void* base, uint64_t cols, uint64_t rows, uint32_t box_rows) {
  CUtensorMap m;
  const TmaMap4dDesc desc{CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, base, {cols, rows, 1, 1},
                          {cols, cols * rows, cols * rows}, {128, box_rows, 1, 1}};
  const std::string err = encode_tma_map_4d(&m, desc);
  EXPECT_EQ(err, "");
  return m;
}

__global__ void __launch_bounds__(128) wgmma_e4m3_tile(const __grid_constant__ CUtensorMap ma,
                                                       const __grid_constant__ CUtensorMap mb, const uint8_t* a_global,
                                                       float* ss_out, float* rs_out) {
  extern __shared__ uint8_t raw[];
  __shared__ uint64_t bar;
  uint8_t* base = tile_kernel_start(raw, &bar);
  uint8_t *sa = base, *sb = base + A8Tile::kBytes;
  if (threadIdx.x == 0) {
    mbarrier_arrive_expect_tx(&bar, A8Tile::kBytes + B8Tile::kBytes);
    tma_load_4d(sa, &ma, 0, 0, 0, 0, &bar);
    tma_load_4d(sb, &mb, 0, 0, 0, 0, &bar);
  }
  mbarrier_wait(&bar, 0);
  const int w = threadIdx.x / 32, g = (threadIdx.x % 32) / 4, t = threadIdx.x % 4;
  // A fragments straight from global memory in the documented layout (MmaE4m3).
  uint32_t af[kK8 / 32][4];
  for (int kb = 0; kb < kK8 / 32; ++kb)
    for (int r = 0; r < 4; ++r) {
      const int row = 16 * w + g + 8 * (r & 1), k = 32 * kb + 16 * (r >> 1) + 4 * t;
      af[kb][r] = *reinterpret_cast<const uint32_t*>(a_global + row * kK8 + k);
    }
  float s[kN8 / 2], o[kN8 / 2];
#pragma unroll
  for (int i = 0; i < kN8 / 2; ++i) s[i] = o[i] = 0.f;
  const uint64_t da = make_smem_desc(smem_u32(sa), A8Tile::kKMajorLbo, A8Tile::kKMajorSbo);
  const uint64_t db = make_smem_desc(smem_u32(sb), B8Tile::kKMajorLbo, B8Tile::kKMajorSbo);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kK8 / MmaE4m3::kK; ++kk)
    MmaE4m3::Op<kN8>::template ss<0>(s, desc_advance(da, A8Tile::k_chunk_offset<32>(kk)), desc_advance(db, B8Tile::k_chunk_offset<32>(kk)),
                         kk > 0);
  wgmma_commit();
  wgmma_wait<0>();
  fence_operand(s);
  fence_operand(o);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kK8 / MmaE4m3::kK; ++kk)
    MmaE4m3::Op<kN8>::template rs<0>(o, af[kk], desc_advance(db, B8Tile::k_chunk_offset<32>(kk)), kk > 0);
  wgmma_commit();
  wgmma_wait<0>();
  fence_operand(o);
#pragma unroll
  for (int i = 0; i < kN8 / 2; ++i) {
    ss_out[(16 * w + g + acc_row(i)) * kN8 + acc_col(i) + 2 * t] = s[i];
    rs_out[(16 * w + g + acc_row(i)) * kN8 + acc_col(i) + 2 * t] = o[i];
  }
}

__global__ void pack_e4m3(const float* x, uint32_t* out) {
  const int i = threadIdx.x;
  out[i] = MmaE4m3::pack4(x[4 * i], x[4 * i + 1], x[4 * i + 2], x[4 * i + 3]);
}

TEST(HopperPrims, WgmmaE4m3SsAndRs) {
  FA3_REQUIRE_GPU();
  std::normal_distribution<float> dist(0.f, 2.f);
  std::vector<uint8_t> ab(kM8 * kK8), bb(kN8 * kK8);
  std::vector<float> a(ab.size()), b(bb.size());
  for (size_t i = 0; i < ab.size(); ++i) a[i] = ref::from_e4m3_bits(ab[i] = ref::to_e4m3_bits(dist(rng())));
  for (size_t i = 0; i < bb.size(); ++i) b[i] = ref::from_e4m3_bits(bb[i] = ref::to_e4m3_bits(dist(rng())));
  DeviceBuffer da(ab.size()), db(bb.size()), dss(kM8 * kN8 * 4), drs(kM8 * kN8 * 4);
  da.upload(ab.data(), ab.size());
  db.upload(bb.data(), bb.size());
  dss.fill_bytes(0xFF);
  drs.fill_bytes(0xFF);
  const CUtensorMap ma = u8_map(da.get(), kK8, kM8, kM8), mb = u8_map(db.get(), kK8, kN8, kN8);
  const int smem = A8Tile::kBytes + B8Tile::kBytes + 1024;
  FA3_CUDA_CHECK(cudaFuncSetAttribute(wgmma_e4m3_tile, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  wgmma_e4m3_tile<<<1, 128, smem>>>(ma, mb, static_cast<const uint8_t*>(da.get()), static_cast<float*>(dss.get()),
                                    static_cast<float*>(drs.get()));
  FA3_CUDA_CHECK(cudaGetLastError());
  FA3_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> ss(kM8 * kN8), rs(kM8 * kN8);
  dss.download(ss.data(), ss.size() * 4);
  drs.download(rs.data(), rs.size() * 4);
  // Hopper's FP8 tensor cores accumulate with fewer mantissa bits than fp32: measured on the H200
  // (2026-12-01) 1.5e-2 relative to the result where terms cancel, 1.4-1.9e-4 of the sum of
  // |products| (the partial sums' scale), which is what is judged here (a wrong layout gives ~1).
  // RS must agree with SS exactly (same products, same order: 0 measured).
  double ss_err = 0, rs_vs_ss = 0;
  for (int i = 0; i < kM8; ++i)
    for (int j = 0; j < kN8; ++j) {
      double acc = 0, mag = 0;
      for (int k = 0; k < kK8; ++k) {
        acc += double(a[i * kK8 + k]) * b[j * kK8 + k];
        mag += std::fabs(double(a[i * kK8 + k]) * b[j * kK8 + k]);
      }
      ss_err = worse(ss_err, std::fabs(acc - ss[i * kN8 + j]) / mag);
      rs_vs_ss = worse(rs_vs_ss, std::fabs(double(rs[i * kN8 + j]) - ss[i * kN8 + j]) / mag);
    }
  std::printf("[e4m3 wgmma] max |err| / sum|a*b|: SS %.3g, RS vs SS %.3g\n", ss_err, rs_vs_ss);
  EXPECT_LT(ss_err, 1e-3) << "SS e4m3 wgmma (K-major, 128B swizzle, k32 steps) disagrees with the CPU GEMM";
  EXPECT_LT(rs_vs_ss, 1e-5) << "RS e4m3 wgmma (A fragments in MmaE4m3's layout) disagrees with SS";

  // pack4 against the host e4m3 rounding (saturation, NaN, subnormals), lowest k in the low byte.
  std::vector<float> x = {1.f, -2.5f, 0.3f, 500.f, -1e9f, NAN, 0.001f, -0.0f};
  for (int i = 0; i < 24; ++i) x.push_back(dist(rng()) * 50.f);
  DeviceBuffer dx(x.size() * 4), dp(x.size());
  dx.upload(x.data(), x.size() * 4);
  pack_e4m3<<<1, int(x.size() / 4)>>>(static_cast<const float*>(dx.get()), static_cast<uint32_t*>(dp.get()));
  FA3_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<uint8_t> packed(x.size());
  dp.download(packed.data(), packed.size());
  for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(int(packed[i]), int(ref::to_e4m3_bits(x[i]))) << "x " << x[i];
}

// ---- 2c. A read M-major from shared memory (the backward's dS^T Q and P^T dO): C = T^T B^T with T
// stored [K][M], M contiguous, through the descriptor's transpose bit ----
constexpr int kMt = 64, kNt = 128, kKt = 128;
using TTile = SmemTile16<kKt, kMt>;   // [K rows][64 M columns]: one panel
using BtTile = SmemTile16<kNt, kKt>;  // K-major B

__global__ void __launch_bounds__(128) wgmma_mmajor_a(const __grid_constant__ CUtensorMap mt,
                                                      const __grid_constant__ CUtensorMap mb, float* c_out) {
  extern __shared__ uint8_t raw[];
  __shared__ uint64_t bar;
  uint8_t* base = tile_kernel_start(raw, &bar);
  uint8_t *st = base, *sb = base + TTile::kBytes;
  if (threadIdx.x == 0) {
    mbarrier_arrive_expect_tx(&bar, TTile::kBytes + BtTile::kBytes);
    tma_load_4d(st, &mt, 0, 0, 0, 0, &bar);
    for (int p = 0; p < BtTile::kPanels; ++p) tma_load_4d(sb + BtTile::panel_offset(p), &mb, BtTile::panel_col(p), 0, 0, 0, &bar);
  }
  mbarrier_wait(&bar, 0);
  float c[kNt / 2];
#pragma unroll
  for (int i = 0; i < kNt / 2; ++i) c[i] = 0.f;
  // M-major A: like an N-major B, the descriptor steps M's panels per LBO and 8 K rows per SBO; each
  // k-step moves 16 rows of T.
  const uint64_t dt = make_smem_desc(smem_u32(st), TTile::kNMajorLbo, TTile::kNMajorSbo);
  const uint64_t db = make_smem_desc(smem_u32(sb), BtTile::kKMajorLbo, BtTile::kKMajorSbo);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kKt / 16; ++kk)
    WgmmaBf16<kNt>::ss<0, 1>(c, desc_advance(dt, TTile::row_chunk_offset<16>(kk)), desc_advance(db, BtTile::k_chunk_offset<16>(kk)),
                             kk > 0);
  wgmma_commit();
  wgmma_wait<0>();
  fence_operand(c);
  const int w = threadIdx.x / 32, g = (threadIdx.x % 32) / 4, t = threadIdx.x % 4;
#pragma unroll
  for (int i = 0; i < kNt / 2; ++i) c_out[(16 * w + g + acc_row(i)) * kNt + acc_col(i) + 2 * t] = c[i];
}

TEST(HopperPrims, WgmmaMMajorA) {
  FA3_REQUIRE_GPU();
  std::vector<float> tv, b;
  const auto tb = random_bf16(kKt * kMt, &tv), bb = random_bf16(kNt * kKt, &b);
  DeviceBuffer dt(tb.size() * 2), db(bb.size() * 2), dc(kMt * kNt * 4);
  dt.upload(tb.data(), tb.size() * 2);
  db.upload(bb.data(), bb.size() * 2);
  dc.fill_bytes(0xFF);
  const CUtensorMap mt = bf16_map(dt.get(), kMt, kKt, 1, 1, kKt), mb = bf16_map(db.get(), kKt, kNt, 1, 1, kNt);
  const int smem = TTile::kBytes + BtTile::kBytes + 1024;
  FA3_CUDA_CHECK(cudaFuncSetAttribute(wgmma_mmajor_a, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  wgmma_mmajor_a<<<1, 128, smem>>>(mt, mb, static_cast<float*>(dc.get()));
  FA3_CUDA_CHECK(cudaGetLastError());
  FA3_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> c(kMt * kNt);
  dc.download(c.data(), c.size() * 4);
  double err = 0;
  for (int i = 0; i < kMt; ++i)
    for (int j = 0; j < kNt; ++j) {
      double acc = 0;
      for (int k = 0; k < kKt; ++k) acc += double(tv[k * kMt + i]) * b[j * kKt + k];
      err = worse(err, std::fabs(acc - c[i * kNt + j]));
    }
  EXPECT_LT(err, 1e-3) << "SS wgmma with M-major A (transpose bit) disagrees with the CPU GEMM";
}

// ---- 2d. an accumulator stored transposed (stmatrix .trans: the backward's P^T, dS^T, dK, dV) ----
// A warpgroup's m64n40 fragment (odd number of 8-column blocks: .x4 and the last by .x2) into a
// [40][64] swizzled tile: tile A holds each element's fragment row, tile B its column (both exact
// in bf16), so every element's position is checked.
using TransTile = SmemTile16<40, 64>;

__global__ void __launch_bounds__(128) store_transposed(uint16_t* rows_out, uint16_t* cols_out) {
  __shared__ alignas(1024) uint8_t tiles[2][TransTile::kBytes];
  const int w = threadIdx.x / 32, g = (threadIdx.x % 32) / 4, t = threadIdx.x % 4;
  uint32_t fr[5][2], fc[5][2];
  auto bf16_pair = [](float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  };
  for (int j = 0; j < 5; ++j)
    for (int h = 0; h < 2; ++h) {
      const float row = float(16 * w + 8 * h + g), col = float(8 * j + 2 * t);
      fr[j][h] = bf16_pair(row, row);
      fc[j][h] = bf16_pair(col, col + 1.f);
    }
  for (int k = 0; k < 2; ++k) {
    const uint32_t base = smem_u32(tiles[k]);
    store_fragment_transposed(k ? fc : fr, [base](int x, int r) { return base + TransTile::offset(x, r); },
                              int(threadIdx.x));
  }
  __syncthreads();
  for (int i = threadIdx.x; i < 40 * 64; i += 128) {
    const int x = i / 64, r = i % 64;
    rows_out[i] = *reinterpret_cast<const uint16_t*>(tiles[0] + TransTile::offset(x, r));
    cols_out[i] = *reinterpret_cast<const uint16_t*>(tiles[1] + TransTile::offset(x, r));
  }
}

TEST(HopperPrims, AccumulatorStoredTransposed) {
  FA3_REQUIRE_GPU();
  DeviceBuffer drows(40 * 64 * 2), dcols(40 * 64 * 2);
  drows.fill_bytes(0xFF);
  dcols.fill_bytes(0xFF);
  store_transposed<<<1, 128>>>(static_cast<uint16_t*>(drows.get()), static_cast<uint16_t*>(dcols.get()));
  FA3_CUDA_CHECK(cudaGetLastError());
  FA3_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<uint16_t> rows(40 * 64), cols(40 * 64);
  drows.download(rows.data(), rows.size() * 2);
  dcols.download(cols.data(), cols.size() * 2);
  int bad = 0;
  for (int x = 0; x < 40; ++x)
    for (int r = 0; r < 64; ++r) {
      // Stored row x, column r holds fragment element (row r, column x).
      const bool ok = rows[x * 64 + r] == ref::to_bf16_bits(float(r)) && cols[x * 64 + r] == ref::to_bf16_bits(float(x));
      if (!ok && ++bad <= 5)
        ADD_FAILURE() << "stored (" << x << ", " << r << ") holds fragment row " << ref::from_bf16_bits(rows[x * 64 + r])
                      << ", column " << ref::from_bf16_bits(cols[x * 64 + r]);
    }
  EXPECT_EQ(bad, 0);
}

// ldmatrix.x4.trans (the FP8 V transposer's load): four 8x8 matrices of 16-bit elements, element
// (row, col) of matrix m holding m << 8 | row << 4 | col; rows addressed by the lanes in a shuffled
// order (row r of matrix m at slot 13 (8m + r) mod 32 of 16 bytes), so the lane-to-row map is checked.
__global__ void ldmatrix_trans(uint32_t* out) {
  __shared__ alignas(128) uint16_t slots[32][8];
  for (int i = threadIdx.x; i < 32 * 8; i += 32) {
    const int slot = i / 8, col = i % 8;
    for (int m = 0; m < 4; ++m)
      for (int r = 0; r < 8; ++r)
        if ((8 * m + r) * 13 % 32 == slot) slots[slot][col] = uint16_t(m << 8 | r << 4 | col);
  }
  __syncwarp();
  const int lane = threadIdx.x, m = lane / 8, r = lane % 8;
  uint32_t v[4];
  ldmatrix_x4_trans(smem_u32(slots[(8 * m + r) * 13 % 32]), v);
  for (int j = 0; j < 4; ++j) out[4 * lane + j] = v[j];
}

TEST(HopperPrims, LdmatrixTransHandsOutColumns) {
  FA3_REQUIRE_GPU();
  DeviceBuffer dout(32 * 4 * 4);
  dout.fill_bytes(0xFF);
  ldmatrix_trans<<<1, 32>>>(static_cast<uint32_t*>(dout.get()));
  FA3_CUDA_CHECK(cudaGetLastError());
  FA3_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<uint32_t> out(32 * 4);
  dout.download(out.data(), out.size() * 4);
  for (int i = 0; i < 32; ++i)
    for (int m = 0; m < 4; ++m) {
      // Thread i, register m: matrix m's rows 2(i%4) (low half) and 2(i%4)+1, column i/4.
      const uint32_t lo = uint32_t(m << 8 | (2 * (i % 4)) << 4 | (i / 4));
      const uint32_t hi = uint32_t(m << 8 | (2 * (i % 4) + 1) << 4 | (i / 4));
      EXPECT_EQ(out[4 * i + m], lo | hi << 16) << "thread " << i << " matrix " << m;
    }
}

// ---- 3. a 2-stage TMA ring, one producer warp and one consumer warpgroup, wrapping 32 times ----
constexpr int kStages = 2, kBlocks = 64, kBlockRows = 64, kBlockBytes = kBlockRows * 128;

__global__ void ring(const __grid_constant__ CUtensorMap m, float* sums) {
  __shared__ alignas(1024) uint8_t buf[kStages][kBlockBytes];
  __shared__ PipelineBarriers<kStages> bars;
  if (threadIdx.x == 0) {
    bars.init(1);
    mbarrier_init_fence();
  }
  __syncthreads();
  if (threadIdx.x >= 128) {  // producer warp
    if (threadIdx.x == 128) {
      PipelineState<kStages> st;
      for (int n = 0; n < kBlocks; ++n) {
        bars.producer_acquire(st);
        mbarrier_arrive_expect_tx(&bars.full[st.index], kBlockBytes);
        tma_load_4d(buf[st.index], &m, 0, n * kBlockRows, 0, 0, &bars.full[st.index]);
        st.advance();
      }
    }
    return;
  }
  PipelineState<kStages> st;
  for (int n = 0; n < kBlocks; ++n) {
    bars.consumer_wait(st);
    float part = 0.f;  // thread r sums row r/2, half (r%2) of its 64 columns
    const int r = threadIdx.x / 2, c0 = (threadIdx.x % 2) * 32;
    for (int c = c0; c < c0 + 32; ++c)
      part += __bfloat162float(*reinterpret_cast<const __nv_bfloat16*>(buf[st.index] + swizzled_offset<2>(r, c, kBlockRows)));
    for (int off = 16; off > 0; off >>= 1) part += __shfl_xor_sync(0xffffffff, part, off);
    if (threadIdx.x % 32 == 0) atomicAdd(&sums[n], part);
    __syncwarp();
    asm volatile("bar.sync 1, 128;" ::: "memory");  // every consumer thread is done with the stage
    if (threadIdx.x == 0) bars.consumer_release(st);
    st.advance();
  }
}

TEST(HopperPrims, PipelineRingWrapsManyTimes) {
  FA3_REQUIRE_GPU();
  std::vector<float> vals;
  const auto bits = random_bf16(size_t(kBlocks) * kBlockRows * 64, &vals);
  DeviceBuffer in(bits.size() * 2), sums(kBlocks * 4);
  in.upload(bits.data(), bits.size() * 2);
  sums.fill_bytes(0);
  CUtensorMap m;
  const TmaMap4dDesc desc{CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, in.get(), {64, uint64_t(kBlocks) * kBlockRows, 1, 1},
                          {128, 128 * uint64_t(kBlocks) * kBlockRows, 128 * uint64_t(kBlocks) * kBlockRows},
                          {64, kBlockRows, 1, 1}};
  ASSERT_EQ(encode_tma_map_4d(&m, desc), "");
  ring<<<1, 160>>>(m, static_cast<float*>(sums.get()));
  FA3_CUDA_CHECK(cudaGetLastError());
  FA3_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> got(kBlocks);
  sums.download(got.data(), kBlocks * 4);
  for (int n = 0; n < kBlocks; ++n) {
    double want = 0;
    for (int i = 0; i < kBlockRows * 64; ++i) want += vals[size_t(n) * kBlockRows * 64 + i];
    EXPECT_NEAR(got[n], want, 1e-2 * (1 + std::fabs(want))) << "block " << n;
  }
}

// ---- 4. the ring shared by a 2-CTA cluster: each CTA's producer loads half of every block and
// multicasts it into both CTAs; a stage is refilled only after both CTAs' consumers released it.
// CTA 1's consumers are slow, so CTA 0's producer must wait on them (else CTA 1 reads new data).
constexpr int kHalfRows = kBlockRows / 2;

__global__ void __cluster_dims__(2, 1, 1) cluster_ring(const __grid_constant__ CUtensorMap half_map, float* sums) {
  __shared__ alignas(1024) uint8_t buf[kStages][kBlockBytes];
  __shared__ PipelineBarriers<kStages> bars;
  if (threadIdx.x == 0) {
    bars.init(2);  // one consumer warpgroup in each of the 2 CTAs
    mbarrier_init_fence();
  }
  cluster_sync();
  const uint32_t rank = cluster_ctarank();
  if (threadIdx.x >= 128) {
    if (threadIdx.x == 128) {
      PipelineState<kStages> st;
      for (int n = 0; n < kBlocks; ++n) {
        bars.producer_acquire(st);
        mbarrier_arrive_expect_tx(&bars.full[st.index], kBlockBytes);  // both halves land here
        tma_load_4d_multicast(buf[st.index] + rank * kHalfRows * 128, &half_map, 0, n * kBlockRows + rank * kHalfRows,
                              0, 0, &bars.full[st.index], 0b11);
        st.advance();
      }
    }
  } else {
    PipelineState<kStages> st;
    for (int n = 0; n < kBlocks; ++n) {
      bars.consumer_wait(st);
      if (rank == 1) __nanosleep(2000);
      float part = 0.f;
      const int r = threadIdx.x / 2, c0 = (threadIdx.x % 2) * 32;
      for (int c = c0; c < c0 + 32; ++c)
        part += __bfloat162float(
            *reinterpret_cast<const __nv_bfloat16*>(buf[st.index] + swizzled_offset<2>(r, c, kBlockRows)));
      for (int off = 16; off > 0; off >>= 1) part += __shfl_xor_sync(0xffffffff, part, off);
      if (threadIdx.x % 32 == 0) atomicAdd(&sums[rank * kBlocks + n], part);
      __syncwarp();
      asm volatile("bar.sync 1, 128;" ::: "memory");
      if (threadIdx.x < 2) bars.consumer_release_cluster(st, threadIdx.x);
      st.advance();
    }
  }
  __syncwarp();
  cluster_sync();  // the peer may still multicast into / arrive on this CTA's shared memory
}

TEST(HopperPrims, ClusterRingMulticast) {
  FA3_REQUIRE_GPU();
  std::vector<float> vals;
  const auto bits = random_bf16(size_t(kBlocks) * kBlockRows * 64, &vals);
  DeviceBuffer in(bits.size() * 2), sums(2 * kBlocks * 4);
  in.upload(bits.data(), bits.size() * 2);
  sums.fill_bytes(0);
  CUtensorMap m;
  const TmaMap4dDesc desc{CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, in.get(), {64, uint64_t(kBlocks) * kBlockRows, 1, 1},
                          {128, 128 * uint64_t(kBlocks) * kBlockRows, 128 * uint64_t(kBlocks) * kBlockRows},
                          {64, kHalfRows, 1, 1}};
  ASSERT_EQ(encode_tma_map_4d(&m, desc), "");
  cluster_ring<<<2, 160>>>(m, static_cast<float*>(sums.get()));
  FA3_CUDA_CHECK(cudaGetLastError());
  FA3_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<float> got(2 * kBlocks);
  sums.download(got.data(), 2 * kBlocks * 4);
  for (int cta = 0; cta < 2; ++cta)
    for (int n = 0; n < kBlocks; ++n) {
      double want = 0;
      for (int i = 0; i < kBlockRows * 64; ++i) want += vals[size_t(n) * kBlockRows * 64 + i];
      EXPECT_NEAR(got[cta * kBlocks + n], want, 1e-2 * (1 + std::fabs(want))) << "CTA " << cta << " block " << n;
    }
}

}  // namespace
}  // namespace fa3::test
