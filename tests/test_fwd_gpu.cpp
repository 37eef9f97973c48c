// The public forward (the Hopper kernel wherever it applies) against the double-precision CPU
// reference, and against the GPU oracle at sizes the CPU reference would take too long for.
#include <gtest/gtest.h>

#include "src/api/dispatch.h"
#include "tests/gpu_util.h"

namespace fa3::test {
namespace {

// Runs fa3::forward on fresh random inputs; checks against the CPU reference, or (use_oracle)
// against the oracle kernel on the same inputs.
void run_fwd_case(const FwdCase& c, bool expect_hopper = true, bool use_oracle = false) {
  SCOPED_TRACE(c.name());
  FwdData d = make_fwd_data(c);
  const char* kernel = nullptr;
  ASSERT_TRUE(fa3::kernel_name(d.args, &kernel).ok());
  if (expect_hopper) EXPECT_STREQ(kernel, "hopper") << "this case should run on the Hopper kernel";
  const Status st = fa3::forward(d.args);
  ASSERT_TRUE(st.ok()) << st.message();
  FA3_CUDA_CHECK(cudaDeviceSynchronize());
  const FwdOutputs got = download_outputs(d);
  if (!use_oracle) {
    expect_close(compare(got, ref::forward(d.prob, d.in), c.with_lse), c.name());
    return;
  }
  // Oracle on the same inputs, then compare the two as "got" vs "want".
  poison_outputs(d);
  ASSERT_TRUE(detail::oracle_fwd(detail::make_problem(d.args), nullptr).ok());
  FA3_CUDA_CHECK(cudaDeviceSynchronize());
  const FwdOutputs oracle = download_outputs(d);
  ref::FwdResult want;
  want.o = oracle.o;
  want.lse = oracle.lse;
  expect_close(compare(got, want, c.with_lse), c.name() + " vs oracle");
}

TEST(FwdGpu, EveryHeadDimBothDtypesCausalAndNot) {
  FA3_REQUIRE_GPU();
  for (fa3_dtype t : {FA3_DTYPE_BF16, FA3_DTYPE_FP16})
    for (int dim : {64, 96, 128, 192, 256})
      for (bool causal : {false, true})
        for (int s : {1, 17, 128, 1000}) {
          FwdCase c;
          c.dtype = t;
          c.head_dim = dim;
          c.causal = causal;
          c.seqlen_q = c.seqlen_k = s;
          c.batch = 2;
          c.heads_q = c.heads_kv = 2;
          run_fwd_case(c);
        }
}

TEST(FwdGpu, LongSequencesAgainstCpu) {
  FA3_REQUIRE_GPU();
  for (int dim : {64, 96, 128, 256})
    for (bool causal : {false, true}) {
      FwdCase c;
      c.head_dim = dim;
      c.causal = causal;
      c.seqlen_q = c.seqlen_k = 4097;
      c.heads_q = c.heads_kv = 1;
      run_fwd_case(c);
    }
}

TEST(FwdGpu, LongSequencesAgainstOracle) {
  FA3_REQUIRE_GPU();
  for (fa3_dtype t : {FA3_DTYPE_BF16, FA3_DTYPE_FP16})
    for (int dim : {96, 128})
      for (bool causal : {false, true}) {
        FwdCase c;
        c.dtype = t;
        c.head_dim = dim;
        c.causal = causal;
        c.seqlen_q = c.seqlen_k = 8192;
        c.batch = 2;
        c.heads_q = 16;
        c.heads_kv = 2;
        run_fwd_case(c, true, true);
      }
}

// Scores that grow block after block in the kernels' key order (last block first): every new
// block raises the row max far beyond the lazy rescale's 2^8, so O and the sums are rescaled,
// and the short causal d64 tile's stale-max exponentials fail their bound and take the full step.
TEST(FwdGpu, GrowingRowMaxima) {
  FA3_REQUIRE_GPU();
  for (int dim : {64, 128, 256})
    for (bool causal : {false, true})
      for (int s : {1000, 2100}) {
        FwdCase c;
        c.head_dim = dim;
        c.causal = causal;
        c.seqlen_q = c.seqlen_k = s;
        c.key_growth = 32.f;  // the row max grows by ~2^15 per 128-key block at key 0
        run_fwd_case(c);
      }
}

TEST(FwdGpu, UnequalLengthsGqaMqa) {
  FA3_REQUIRE_GPU();
  // d64: the short-sequence stream tile, whose first blocks can be hidden from some of a warpgroup's
  // rows (300 x 9000: finite-masked rows, then the stale max's fallback); d128: the 128x128 tile.
  for (int dim : {64, 128})
    for (auto [sq, sk] : {std::pair{17, 1000}, std::pair{1000, 17}, std::pair{128, 4097}, std::pair{1, 300}, std::pair{300, 9000}})
      for (int hkv : {1, 2})
        for (bool causal : {false, true}) {
          FwdCase c;
          c.head_dim = dim;
          c.seqlen_q = sq;
          c.seqlen_k = sk;
          c.heads_q = 16;
          c.heads_kv = hkv;  // MQA 16:1 and GQA 8:1
          c.causal = causal;
          run_fwd_case(c);
        }
}

TEST(FwdGpu, NonContiguousLayouts) {
  FA3_REQUIRE_GPU();
  for (Layout l : {Layout::kBSHDPadded, Layout::kBHSD})
    for (int dim : {64, 128, 256}) {
      FwdCase c;
      c.layout = l;
      c.head_dim = dim;
      c.batch = 3;
      c.seqlen_q = 333;
      c.seqlen_k = 517;
      c.heads_q = 4;
      c.heads_kv = 2;
      c.causal = dim == 128;
      run_fwd_case(c);
    }
}

TEST(FwdGpu, SlidingWindowsAndOddHeadDims) {
  FA3_REQUIRE_GPU();
  for (int dim : {64, 128})  // d64: the short-sequence stream tile; d128: the 128x128 tile
    for (auto [wl, wr] : {std::pair{100, 0}, std::pair{0, 0}, std::pair{64, 64}, std::pair{-1, 50}, std::pair{300, -1}}) {
      FwdCase c;
      c.head_dim = dim;
      c.seqlen_q = 700;
      c.seqlen_k = 900;
      c.window_left = wl;
      c.window_right = wr;
      run_fwd_case(c);
    }
  for (int dim : {96, 128}) {  // the 192-row tiles of longer key sequences (d128: masked from 4k keys)
    FwdCase c;
    c.head_dim = dim;
    c.seqlen_q = 2100;
    c.seqlen_k = dim == 96 ? 2600 : 8300;
    c.window_left = 300;
    c.window_right = 40;
    run_fwd_case(c);
  }
  for (int dim : {8, 40, 80, 112, 160, 248}) {  // padded up to the next kernel head dim by TMA zero fill
    FwdCase c;
    c.head_dim = dim;
    c.seqlen_q = 200;
    c.seqlen_k = 300;
    c.causal = dim % 16 == 0;
    run_fwd_case(c);
  }
}

TEST(FwdGpu, RowsWithoutKeysAndNoLse) {
  FA3_REQUIRE_GPU();
  FwdCase c;
  c.seqlen_q = 1000;  // causal with sq > sk: the first 700 rows see no key (O = 0, LSE = -inf)
  c.seqlen_k = 300;
  c.causal = true;
  run_fwd_case(c);
  c.with_lse = false;
  run_fwd_case(c);
}

TEST(FwdGpu, FallbackFeaturesUseOracle) {
  FA3_REQUIRE_GPU();
  FwdCase c;
  c.softcap = 10.f;
  run_fwd_case(c, /*expect_hopper=*/false);
  c = FwdCase();
  c.batch = 2;
  c.varlen_q = {100, 3};
  c.varlen_k = {50, 260};
  run_fwd_case(c, false);
}

}  // namespace
}  // namespace fa3::test
