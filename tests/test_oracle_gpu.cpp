// The reference GPU kernel (the oracle) against the double-precision CPU reference, over every
// forward feature of the API.  Once it passes here it can stand in for the CPU reference at sizes
// where that is too slow.
#include <gtest/gtest.h>

#include "src/api/dispatch.h"
#include "tests/gpu_util.h"

namespace fa3::test {
namespace {

void run_oracle_case(const FwdCase& c) {
  SCOPED_TRACE(c.name());
  FwdData d = make_fwd_data(c);
  ASSERT_TRUE(fa3::validate(d.args).ok()) << fa3::validate(d.args).message();
  const auto f = detail::make_problem(d.args);
  const Status st = detail::oracle_fwd(f, nullptr);
  ASSERT_TRUE(st.ok()) << st.message();
  FA3_CUDA_CHECK(cudaDeviceSynchronize());
  const auto want = ref::forward(d.prob, d.in);
  expect_close(compare(download_outputs(d), want, c.with_lse), c.name());
}

TEST(OracleGpu, SeqlenGrid) {
  FA3_REQUIRE_GPU();
  for (const FwdCase& c : seqlen_grid_cases()) run_oracle_case(c);
}

TEST(OracleGpu, UnequalLengthsGqaAndWindows) {
  FA3_REQUIRE_GPU();
  for (auto [sq, sk] : {std::pair{17, 1000}, std::pair{1000, 17}, std::pair{300, 129}}) {
    FwdCase c;
    c.batch = 2;
    c.seqlen_q = sq;
    c.seqlen_k = sk;
    c.heads_q = 8;
    c.heads_kv = 1;  // MQA; 8:1 GQA
    c.causal = true;
    run_oracle_case(c);
    c.causal = false;
    c.window_left = 33;
    c.window_right = 7;
    c.heads_kv = 2;
    run_oracle_case(c);
  }
}

TEST(OracleGpu, DtypesHeadDimsLayouts) {
  FwdCase c;
  FA3_REQUIRE_GPU();
  for (fa3_dtype t : {FA3_DTYPE_BF16, FA3_DTYPE_FP16, FA3_DTYPE_E4M3})
    for (int dim : {64, 80, 128, 256}) {
      c.dtype = t;
      c.head_dim = dim;
      c.seqlen_q = 70;
      c.seqlen_k = 150;
      c.layout = dim == 80 ? Layout::kBHSD : Layout::kBSHDPadded;
      run_oracle_case(c);
    }
  c = FwdCase();
  c.head_dim = 128;
  c.head_dim_v = 64;
  run_oracle_case(c);
}

TEST(OracleGpu, SoftcapVarlenPaged) {
  FA3_REQUIRE_GPU();
  FwdCase c;
  c.softcap = 5.f;
  c.causal = true;
  run_oracle_case(c);
  c = FwdCase();
  c.batch = 3;
  c.varlen_q = {5, 170, 1};
  c.varlen_k = {9, 130, 40};
  c.causal = true;
  run_oracle_case(c);
  c.page_size = 16;  // paged K/V with per-sequence key counts (seqused_k)
  run_oracle_case(c);
}

}  // namespace
}  // namespace fa3::test
