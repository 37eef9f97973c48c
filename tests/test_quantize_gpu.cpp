// fa3_quantize_fp8 against its CPU reference (reference/quantize.h): e4m3 bytes and descales bit
// for bit, on random inputs with outliers (so the blocks' scales differ), strided rows with
// poisoned padding that must stay untouched, every head-dim lane width, blocks of 16 rows to more
// than 128 (the two-pass path), varlen with an empty sequence, tails and an all-zero block.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <sstream>

#include "reference/quantize.h"
#include "reference/rounding.h"
#include "tests/gpu_util.h"

namespace fa3::test {
namespace {

struct QuantCase {
  fa3_dtype dtype = FA3_DTYPE_BF16;
  int batch = 1, seqlen = 128, heads = 2, head_dim = 128, block_size = 128;
  bool hadamard = true;
  std::vector<int> varlen;  // packed sequences of these lengths (seqlen ignored)
  bool zero_block = false;  // the first block of (sequence 0, head 0) all zeros
  std::string name() const {
    std::ostringstream s;
    s << fa3::dtype_name(dtype) << " b" << batch << " s" << seqlen << " h" << heads << " d" << head_dim << " block"
      << block_size << (hadamard ? " hadamard" : "") << (varlen.empty() ? "" : " varlen")
      << (zero_block ? " zero-block" : "");
    return s.str();
  }
};

void run_quant_case(const QuantCase& c) {
  SCOPED_TRACE(c.name());
  const bool packed = !c.varlen.empty();
  const int batch = packed ? int(c.varlen.size()) : c.batch;
  std::vector<int> len(batch, c.seqlen), row0(batch, 0);
  int total = 0, longest = 0;
  for (int b = 0; b < batch; ++b) {
    if (packed) len[b] = c.varlen[b];
    row0[b] = total;
    total += len[b];
    longest = std::max(longest, len[b]);
  }
  const int seqlen = packed ? longest : c.seqlen;
  const int rows_per_batch = packed ? total + 3 : seqlen;  // packed: 3 rows past the last sequence
  const int d = c.head_dim;
  // Padded strides: the padding keeps its poison.
  const int64_t in_head = d + 8, in_row = c.heads * in_head, in_batch = packed ? 0 : in_row * rows_per_batch;
  const int64_t out_head = (d + 15) / 16 * 16 + 16, out_row = c.heads * out_head,
                out_batch = packed ? 0 : out_row * rows_per_batch;
  const int images = packed ? 1 : batch;
  const size_t in_elems = size_t(in_row) * rows_per_batch * images, out_bytes = size_t(out_row) * rows_per_batch * images;
  std::mt19937 g(1234 + d + c.block_size);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::uniform_real_distribution<float> unit(0.f, 1.f);
  std::vector<uint16_t> in(in_elems);
  auto bits = [&](float x) { return c.dtype == FA3_DTYPE_BF16 ? ref::to_bf16_bits(x) : ref::to_fp16_bits(x); };
  auto value = [&](uint16_t b) { return c.dtype == FA3_DTYPE_BF16 ? ref::from_bf16_bits(b) : ref::from_fp16_bits(b); };
  for (auto& x : in) x = bits(normal(g) + (unit(g) < 0.01f ? 10.f * normal(g) : 0.f));
  auto in_at = [&](int b, int i, int h) { return (packed ? 0 : b * in_batch) + (row0[b] * packed + i) * in_row + h * in_head; };
  auto out_at = [&](int b, int i, int h) {
    return (packed ? 0 : b * out_batch) + (row0[b] * packed + i) * out_row + h * out_head;
  };
  if (c.zero_block)
    for (int i = 0; i < std::min(c.block_size, len[0]); ++i)
      for (int x = 0; x < d; ++x) in[in_at(0, i, 0) + x] = 0;
  const int blocks = (seqlen + c.block_size - 1) / c.block_size;
  const int64_t ds_head = blocks + 1, ds_batch = c.heads * ds_head;  // one spare slot per head: stays poisoned

  DeviceBuffer din(std::max<size_t>(in.size() * 2, 64)), dout(std::max<size_t>(out_bytes, 64)),
      dds(size_t(ds_batch) * batch * 4), dcu;
  din.upload(in.data(), in.size() * 2);
  dout.fill_bytes(0xAB);  // (the padding's poison)
  dds.fill_bytes(0xFF);
  fa3::QuantizeArgs a;
  a.in_dtype = c.dtype;
  a.batch = batch;
  a.seqlen = seqlen;
  a.heads = c.heads;
  a.head_dim = d;
  a.in = {din.get(), in_batch, in_row, in_head};
  a.out = {dout.get(), out_batch, out_row, out_head};
  if (packed) {
    std::vector<int> cu(row0);
    cu.push_back(total);
    dcu = DeviceBuffer(cu.size() * 4);
    dcu.upload(cu.data(), cu.size() * 4);
    a.cu_seqlens = static_cast<const int32_t*>(dcu.get());
    a.total = rows_per_batch;
  }
  a.descale = static_cast<float*>(dds.get());
  a.descale_batch_stride = ds_batch;
  a.descale_head_stride = ds_head;
  a.block_size = c.block_size;
  a.hadamard = c.hadamard;
  a.seed = 0x5eed0000 + d;
  const Status st = fa3::quantize_fp8(a);
  ASSERT_TRUE(st.ok()) << st.message();
  FA3_CUDA_CHECK(cudaDeviceSynchronize());
  // The whole buffer (64 bytes at least): with empty sequences every byte must keep its poison.
  std::vector<uint8_t> out(dout.bytes());
  std::vector<float> ds(size_t(ds_batch) * batch);
  dout.download(out.data(), out.size());
  dds.download(ds.data(), ds.size() * 4);

  long bad_bytes = 0, bad_scales = 0;
  std::vector<char> owned(out.size(), 0);
  for (int b = 0; b < batch; ++b)
    for (int h = 0; h < c.heads; ++h) {
      std::vector<float> x;
      for (int i = 0; i < len[b]; ++i)
        for (int e = 0; e < d; ++e) x.push_back(value(in[in_at(b, i, h) + e]));
      const ref::Quantized want = ref::quantize_fp8(x, len[b], d, c.block_size, c.hadamard, a.seed);
      for (int i = 0; i < len[b]; ++i)
        for (int e = 0; e < d; ++e) {
          const int64_t at = out_at(b, i, h) + e;
          owned[at] = 1;
          if (out[at] != want.bytes[size_t(i) * d + e] && ++bad_bytes <= 3)
            ADD_FAILURE() << "byte (seq " << b << ", row " << i << ", head " << h << ", col " << e << "): got "
                          << int(out[at]) << ", want " << int(want.bytes[size_t(i) * d + e]);
        }
      for (int k = 0; k <= blocks; ++k) {
        float got = ds[b * ds_batch + h * ds_head + k];
        uint32_t got_bits;
        std::memcpy(&got_bits, &got, 4);
        const bool written = k < int(want.descale.size());
        if (written ? got != want.descale[k] : got_bits != 0xFFFFFFFFu) {
          if (++bad_scales <= 3)
            ADD_FAILURE() << "descale (seq " << b << ", head " << h << ", block " << k << "): got " << got << ", want "
                          << (written ? want.descale[k] : -1.f) << (written ? "" : " (untouched)");
        }
      }
      if (c.zero_block && b == 0 && h == 0 && len[0] > 0) EXPECT_EQ(want.descale[0], 1.f);
    }
  long stray = 0;
  for (size_t i = 0; i < out.size(); ++i) stray += !owned[i] && out[i] != 0xAB;
  EXPECT_EQ(bad_bytes, 0);
  EXPECT_EQ(bad_scales, 0);
  EXPECT_EQ(stray, 0) << "bytes written outside the sequences' rows";
}

TEST(QuantizeGpu, MatchesTheCpuReferenceBitForBit) {
  FA3_REQUIRE_GPU();
  std::vector<QuantCase> cases;
  QuantCase c;
  c.batch = 2, c.seqlen = 1000, c.heads = 3;  // d128, blocks of 128, rotated
  cases.push_back(c);
  c = QuantCase();
  c.dtype = FA3_DTYPE_FP16, c.seqlen = 17, c.head_dim = 64, c.block_size = 16;
  cases.push_back(c);
  c = QuantCase();
  c.seqlen = 300, c.head_dim = 256, c.block_size = 256, c.zero_block = true;  // two passes
  cases.push_back(c);
  c = QuantCase();
  c.seqlen = 129, c.head_dim = 96, c.block_size = 64, c.hadamard = false;  // 12 of 16 lanes
  cases.push_back(c);
  c = QuantCase();
  c.seqlen = 4097, c.heads = 1, c.head_dim = 16, c.block_size = 32;
  cases.push_back(c);
  c = QuantCase();
  c.varlen = {300, 0, 129, 1}, c.heads = 2, c.zero_block = true;
  cases.push_back(c);
  c = QuantCase();
  c.dtype = FA3_DTYPE_FP16, c.seqlen = 1000, c.block_size = 384, c.hadamard = false, c.head_dim = 32;
  cases.push_back(c);
  c = QuantCase();
  c.seqlen = 1, c.head_dim = 8, c.hadamard = false, c.block_size = 128;
  cases.push_back(c);
  c = QuantCase();
  c.seqlen = 700, c.head_dim = 128, c.block_size = 256;  // rotated, two passes
  cases.push_back(c);
  c = QuantCase();
  c.dtype = FA3_DTYPE_FP16, c.seqlen = 1000, c.head_dim = 32, c.block_size = 384, c.zero_block = true;
  cases.push_back(c);
  for (const QuantCase& qc : cases) run_quant_case(qc);
}

// More chunks of 128 rows (or of a block) than CTAs: the rotated kernel's grid is as many CTAs as
// the SMs hold (on an H200 132 x 1..8), so each CTA walks several, its ring of shared memory loading
// the next ones while it transforms and stores the current one. Forty sequences of 0..700 rows put
// empty chunks in the walks.
TEST(QuantizeGpu, CtasWalkManyChunks) {
  FA3_REQUIRE_GPU();
  std::vector<QuantCase> cases;
  QuantCase c;
  c.batch = 3, c.seqlen = 4000, c.heads = 8;  // d128 rotated: 768 chunks
  cases.push_back(c);
  c.hadamard = false;  // plain
  cases.push_back(c);
  c = QuantCase();
  c.dtype = FA3_DTYPE_FP16, c.batch = 2, c.seqlen = 3000, c.heads = 16, c.head_dim = 256;  // 16 warps of 8 rows
  cases.push_back(c);
  c.block_size = 256, c.zero_block = true;  // two passes over each chunk: 384 chunks
  cases.push_back(c);
  c = QuantCase();
  c.dtype = FA3_DTYPE_FP16, c.heads = 16, c.head_dim = 64, c.block_size = 64;
  uint32_t state = 12345;
  for (int i = 0; i < 40; ++i) {
    state = state * 1664525u + 1013904223u;
    c.varlen.push_back(i % 9 == 4 ? 0 : int(state >> 8) % 701);
  }
  cases.push_back(c);
  for (const QuantCase& qc : cases) run_quant_case(qc);
}

// The rotated kernel at every head dim it has (a row across 2 or 4 threads, 8 or 16 warps of rows) and
// every block size of one pass (a block of 16 rows is two warps at d256): 847 chunks, more than
// the CTAs of any of its grids, with a tail of 37 rows.
TEST(QuantizeGpu, RotatedEveryHeadDimAndBlock) {
  FA3_REQUIRE_GPU();
  std::vector<QuantCase> cases;
  for (int d : {16, 32, 64, 128, 256})
    for (int block : {16, 32, 64, 128}) {
      if (d < 128 && block != (d == 16 ? 16 : d == 32 ? 32 : 128)) continue;  // one block size below d128
      QuantCase c;
      c.dtype = block == 32 || d == 64 ? FA3_DTYPE_FP16 : FA3_DTYPE_BF16;
      c.seqlen = 120 * 128 + 37, c.heads = 7, c.head_dim = d, c.block_size = block;
      c.zero_block = block == 16;
      cases.push_back(c);
    }
  for (const QuantCase& qc : cases) run_quant_case(qc);
}

TEST(QuantizeGpu, EmptySequencesWriteNothing) {
  FA3_REQUIRE_GPU();
  QuantCase c;
  c.seqlen = 0;
  run_quant_case(c);
}

}  // namespace
}  // namespace fa3::test
