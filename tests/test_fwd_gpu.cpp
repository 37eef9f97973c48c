// The public forward (the Hopper kernel wherever it applies) against the double-precision CPU
// reference, and against the GPU oracle at sizes the CPU reference would take too long for.
#include <cuda_fp16.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "src/api/dispatch.h"
#include "tests/gpu_util.h"

namespace fa3::test {
namespace {

// Runs fa3::forward on fresh random inputs; checks against the CPU reference, or (use_oracle)
// against the oracle kernel on the same inputs. Either way every output element and LSE entry that
// no sequence owns must keep its poison (compare counts them as stray writes).
// e4m3 operands: the Hopper kernel rounds P to e4m3 for the PV GEMM (3 mantissa bits: up to 6%
// per probability), which neither the double reference nor the fp32 oracle does, and the e4m3
// wgmma accumulates QK^T with less than fp32's precision (an LSE error of 1.5e-3 with a single key
// at d256, where the score is ~30). Measured on the H200 (2026-12-01, FwdGpu.Fp8AgainstReference
// prints each case's errors): O rel_fro <= 1.7e-2; LSE up to 8.3e-3 (d256, causal, scores up to
// ~40: 2e-4 of the score), <= 3.4e-3 over 1000 random cases.
constexpr double kFp8Tolerance = 3e-2;  // (LSE: fp8_lse_tolerance, gpu_util.h)
// FwdGpu.Fp8QuantizedPipeline: against the 16-bit inputs, so Q's, K's and V's rounding to e4m3
// (3 mantissa bits each) counts too: measured rel_fro 5.3-5.5e-2, LSE <= 3.3e-3 (H200, 2026-12-02),
// where a float64 model of the roundings (e4m3 Q, K, V and P) gives 5.2e-2 on such N(0, 1) inputs.
constexpr double kFp8QuantizedTolerance = 8e-2, kFp8QuantizedLseTolerance = 2e-2;
double tolerance_for(const FwdCase& c) { return c.dtype == FA3_DTYPE_E4M3 ? fp8_tolerance(c) : 1e-2; }
double lse_tolerance_for(const FwdCase& c) { return c.dtype == FA3_DTYPE_E4M3 ? fp8_lse_tolerance(c) : 1e-3; }

void run_fwd_case(const FwdCase& c, bool expect_hopper = true, bool use_oracle = false) {
  SCOPED_TRACE(c.name());
  FwdData d = make_fwd_data(c, /*reference_inputs=*/!use_oracle);
  const Status valid = fa3::validate(d.args);
  ASSERT_TRUE(valid.ok()) << "the harness built invalid arguments: " << valid.message();
  const char* kernel = nullptr;
  ASSERT_TRUE(fa3::kernel_name(d.args, &kernel).ok());
  if (expect_hopper) {
    EXPECT_STREQ(kernel, "hopper") << "this case should run on the Hopper kernel";
  }
  const Status st = fa3::forward(d.args);
  ASSERT_TRUE(st.ok()) << st.message();
  FA3_CUDA_CHECK(cudaDeviceSynchronize());
  const FwdOutputs got = download_outputs(d);
  if (!use_oracle) {
    expect_close(compare(got, ref::forward(d.prob, d.in), c.with_lse), c.name(), tolerance_for(c), lse_tolerance_for(c));
    return;
  }
  // Oracle on the same inputs, then compare the two as "got" vs "want".
  poison_outputs(d);
  ASSERT_TRUE(detail::oracle_fwd(detail::make_problem(d.args), nullptr).ok());
  FA3_CUDA_CHECK(cudaDeviceSynchronize());
  const FwdOutputs oracle = download_outputs(d);
  EXPECT_EQ(oracle.stray.o + oracle.stray.lse, 0) << "the oracle wrote where no sequence owns: " << oracle.stray.where;
  ref::FwdResult want;
  want.o = oracle.o;
  want.lse = oracle.lse;
  expect_close(compare(got, want, c.with_lse), c.name() + " vs oracle", tolerance_for(c), lse_tolerance_for(c));
}

// The implementation fa3::kernel_name picks for the case's arguments.
std::string kernel_of(const FwdCase& c) {
  FwdData d = make_fwd_data(c, false);
  const char* kernel = nullptr;
  const Status st = fa3::kernel_name(d.args, &kernel);
  return st.ok() ? std::string(kernel) : "error: " + st.message();
}

// ------------------------------------------------------- every instantiation ----

// The instantiations CMakeLists.txt generates, by name (fwd_<dtype>_<tile>_m<masked>_s<softcap>_v<varlen>).
const std::vector<std::string>& instantiation_registry() {
  static const std::vector<std::string> names = {
#include "instantiations/registry.inc"
  };
  return names;
}

// A problem that fwd_dispatch.cpp sends to instantiation `name`: the tile's head dims, its mask
// (causal), softcap, varlen, and lengths on the side of use_alt_tile()'s thresholds (fwd_config.h)
// that the tile serves. Lengths stay off tile multiples.
FwdCase case_for_instantiation(const std::string& name) {
  auto has = [&](const char* part) { return name.find(part) != std::string::npos; };
  FwdCase c;
  c.dtype = has("_fp16_") ? FA3_DTYPE_FP16 : has("_e4m3_") ? FA3_DTYPE_E4M3 : FA3_DTYPE_BF16;
  const bool masked = has("_mtrue"), softcap = has("_strue"), varlen = has("_vtrue"),
             alt = has("alt_") || has("altblk_");
  const size_t d0 = name.find("_d") + 2;
  c.head_dim = std::stoi(name.substr(d0));
  if (has("v128_")) c.head_dim_v = 128;
  if (has("blk_")) {  // e4m3 with block descales
    c.q_block = 64;
    c.kv_block = 128;
  }
  if (has("split_")) {  // the decode kernel: explicit splits (any query length), pack-GQA 2:1
    c.workspace = true;
    c.num_splits = 3;
  }
  c.causal = masked;
  if (softcap) c.softcap = 30.f;
  c.heads_q = 2;
  c.heads_kv = 1;
  c.seqlen_q = 300;
  c.seqlen_k = 517;
  if (varlen) {
    c.batch = 3;
    c.varlen_q = {300, 0, 129};
    c.varlen_k = {517, 77, 129};
  } else if (c.dtype == FA3_DTYPE_E4M3) {
    if (alt && c.head_dim == 64) c.seqlen_q = 2100, c.seqlen_k = masked ? 2100 : 1100;  // use_fp8_alt_tile
    // d256's 128-key tiles: unmasked (first tile) and masked (second tile) from 1k keys
    if (c.head_dim == 256 && (masked ? alt : !alt)) c.seqlen_k = 1100;
    if (c.head_dim == 128 && alt) c.seqlen_k = 4200;  // d128's 192-key tile: from 4k keys
  } else if (c.head_dim == 64 && masked && !alt) {
    c.seqlen_q = c.seqlen_k = 2100;  // the 192-row tile: masked problems from 2k queries
  } else if (c.head_dim == 96 && alt) {
    c.seqlen_k = 2100;  // d96's 192-row tile: from 2k keys
  } else if ((c.head_dim == 128 && masked && alt) || (c.head_dim == 256 && !alt)) {
    c.seqlen_k = 4200;  // d128's masked 192x80 tile, d256's 80-key tile: from 4k keys
  }
  return c;
}

// Every instantiation, reached by name and checked against the double reference (the oracle for
// the longer cases): none is covered only by chance of a length threshold.
TEST(FwdGpu, EveryInstantiationByName) {
  const auto& names = instantiation_registry();
  ASSERT_GE(names.size(), 50u);
  for (const std::string& name : names) {  // the dispatch reads sizes and flags only: no GPU needed
    SCOPED_TRACE(name);
    const FwdCase c = case_for_instantiation(name);
    FwdArgs a;
    a.dtype = c.dtype;
    a.out_dtype = c.dtype == FA3_DTYPE_E4M3 ? FA3_DTYPE_BF16 : c.dtype;
    a.batch = c.batch;
    a.heads_q = c.heads_q;
    a.heads_kv = c.heads_kv;
    a.head_dim_qk = c.head_dim;
    a.head_dim_v = c.head_dim_v ? c.head_dim_v : c.head_dim;
    a.seqlen_q = c.varlen_q.empty() ? c.seqlen_q : *std::max_element(c.varlen_q.begin(), c.varlen_q.end());
    a.seqlen_k = c.varlen_k.empty() ? c.seqlen_k : *std::max_element(c.varlen_k.begin(), c.varlen_k.end());
    a.causal = c.causal;
    a.softcap = c.softcap;
    static const int32_t kSomeArray[1] = {0};
    if (!c.varlen_q.empty()) a.cu_seqlens_q = a.cu_seqlens_k = kSomeArray;
    static const float kSomeFactors[1] = {1.f};  // (block descales: the dispatch reads that they are there)
    if (c.q_block) a.q_block_descale = {kSomeFactors, 0, 0, c.q_block, a.seqlen_q};
    if (c.kv_block) a.k_block_descale = a.v_block_descale = {kSomeFactors, 0, 0, c.kv_block, a.seqlen_k};
    alignas(16) static char some_workspace[16];
    if (c.workspace) {  // (never touched: the dispatch only compares sizes)
      a.num_splits = c.num_splits;
      a.workspace = some_workspace;
      a.workspace_bytes = size_t(1) << 40;
    }
    std::string reached;
    ASSERT_TRUE(detail::hopper_fwd_instance(detail::make_problem(a), &reached).ok());
    EXPECT_EQ(reached, name) << "case_for_instantiation does not reach it";
  }
  FA3_REQUIRE_GPU();
  for (size_t i = 0; i < names.size(); ++i) {
    SCOPED_TRACE(names[i]);
    FwdCase c = case_for_instantiation(names[i]);
    c.sinks = i % 2 == 1;  // each epilogue form with and without sinks somewhere
    run_fwd_case(c, true, /*use_oracle=*/c.seqlen_k > 2000);
  }
}

// Attention sinks on every path: the Hopper kernels' epilogue (rows that see no key get O = 0 and
// LSE = the sink: causal with seqlen_q > seqlen_k, windows, empty sequences, whole tiles the
// producer zeroes), the decode kernel with one split (its own epilogue) and with several (the
// combine adds the sink once), pack-GQA rows of several heads, e4m3 (with softcap too), paged, and
// e4m3 with softcap and block descales; a negative scale.
TEST(FwdGpu, SinksAgainstCpu) {
  FA3_REQUIRE_GPU();
  std::vector<std::pair<FwdCase, bool>> cases;  // (case, on the Hopper kernel)
  auto add = [&](FwdCase c, bool hopper = true) {
    c.sinks = true;
    cases.push_back({c, hopper});
  };
  for (int s : {1, 17, 1000}) {
    FwdCase c;
    c.seqlen_q = c.seqlen_k = s;
    c.heads_q = 8;
    c.heads_kv = 2;
    add(c);
    c.causal = true;
    c.dtype = FA3_DTYPE_FP16;
    c.head_dim = 64;
    add(c);
  }
  {
    FwdCase c;  // rows and whole tiles without a visible key
    c.seqlen_q = 700;
    c.seqlen_k = 129;
    c.causal = true;
    c.heads_q = 5;
    c.heads_kv = 1;
    add(c);
    c.causal = false;
    c.window_left = 3;
    c.window_right = 0;
    c.seqlen_q = 300;
    c.seqlen_k = 300;
    c.head_dim = 256;
    add(c);
    c.window_left = -1;
    c.head_dim = 192;
    c.head_dim_v = 128;
    c.with_lse = false;
    add(c);
  }
  {
    FwdCase c = packed_head_dim_case(128, 128, Layout::kBSHD);  // varlen with empty sequences, guard rows
    c.causal = true;
    add(c);
    c.page_size = 64;  // a paged cache (varlen_k: each sequence's keys in its pages)
    c.causal = false;
    add(c);
    FwdCase z;  // sequences of no queries or no keys
    z.batch = 3;
    z.varlen_q = {5, 130, 0};
    z.varlen_k = {0, 7, 300};
    z.causal = true;
    add(z);
  }
  for (int splits : {0, 1, 3, 16}) {  // the decode kernel: pack-GQA 8:2, one split or the combine
    FwdCase c;
    c.batch = 2;
    c.seqlen_q = splits == 3 ? 4 : 1;
    c.seqlen_k = splits == 16 ? 4097 : 1000;
    c.heads_q = 8;
    c.heads_kv = 2;
    c.causal = splits == 3;
    c.workspace = true;
    c.num_splits = splits;
    if (splits == 1) c.window_left = 0;  // windows leave splits without keys
    add(c);
  }
  {
    FwdCase c;  // e4m3, per-head and block descales
    c.dtype = FA3_DTYPE_E4M3;
    c.seqlen_q = 300;
    c.seqlen_k = 517;
    c.heads_q = 4;
    c.heads_kv = 2;
    c.causal = true;
    add(c);
    c.q_block = 64;
    c.kv_block = 128;
    add(c);
    c.softcap = 20.f;  // e4m3 with softcap and block descales
    add(c);
    c.q_block = c.kv_block = 0;  // e4m3 with softcap: the Hopper kernel
    add(c);
  }
  {
    FwdCase c;  // a negative softmax scale: -Q's copy in the workspace
    c.seqlen_q = 33;
    c.seqlen_k = 200;
    c.softmax_scale = -0.1f;
    c.causal = true;
    c.workspace = true;
    add(c);
  }
  for (const auto& [c, hopper] : cases) {
    EXPECT_EQ(kernel_of(c), hopper ? "hopper" : "reference-gpu") << c.name();
    run_fwd_case(c, hopper);
  }
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

// Any host thread may call fa3: a fresh std::thread has no current CUDA context until it makes a
// runtime call, and the Hopper path's first driver call (encoding the TMA maps) needs one.
TEST(FwdGpu, FreshHostThread) {
  FA3_REQUIRE_GPU();
  FwdCase c;
  c.causal = true;
  c.seqlen_q = c.seqlen_k = 300;
  FwdData d = make_fwd_data(c, /*reference_inputs=*/true);
  Status st;
  std::thread([&] {
    st = fa3::forward(d.args);
    if (st.ok() && cudaDeviceSynchronize() != cudaSuccess) st = Status(FA3_ERROR_CUDA, "sync failed");
  }).join();
  ASSERT_TRUE(st.ok()) << st.message();
  expect_close(compare(download_outputs(d), ref::forward(d.prob, d.in), c.with_lse), c.name());
}

// sm_margin leaves SMs free while a persistent forward runs (fa3_c.h): a short forward on a
// second stream, launched 2 ms into a ~10 ms one, finishes long before it with a margin of 8, and
// not before most of it without one: every SM then holds one of the long call's CTAs until their
// last tiles (an unmasked walk gives each the same number), and a CTA of either kernel takes most
// of an SM's shared memory, so the short one's CTA finds no SM until they retire.
TEST(FwdGpu, SmMarginLeavesSmsFree) {
  FA3_REQUIRE_GPU();
  struct Problem {
    DeviceBuffer q, k, v, o;
    FwdArgs a;
  };
  auto make = [](int batch, int seqlen) {  // bf16 d128, 16 heads, inputs of one finite value (timing only)
    Problem p;
    const size_t bytes = size_t(batch) * seqlen * 16 * 128 * 2;
    for (DeviceBuffer* b : {&p.q, &p.k, &p.v, &p.o}) {
      *b = DeviceBuffer(bytes);
      b->fill_bytes(0x3c);
    }
    p.a.batch = batch;
    p.a.seqlen_q = p.a.seqlen_k = seqlen;
    p.a.heads_q = p.a.heads_kv = 16;
    p.a.head_dim_qk = p.a.head_dim_v = 128;
    p.a.q = fa3::bshd(p.q.get(), seqlen, 16, 128);
    p.a.k = fa3::bshd(p.k.get(), seqlen, 16, 128);
    p.a.v = fa3::bshd(p.v.get(), seqlen, 16, 128);
    p.a.out = fa3::bshd(p.o.get(), seqlen, 16, 128);
    return p;
  };
  Problem big = make(4, 16384), small = make(1, 256);  // ~60 tiles per SM; 32 short tiles
  cudaStream_t sa = nullptr, sb = nullptr;
  FA3_CUDA_CHECK(cudaStreamCreateWithFlags(&sa, cudaStreamNonBlocking));
  FA3_CUDA_CHECK(cudaStreamCreateWithFlags(&sb, cudaStreamNonBlocking));
  cudaEvent_t a0, a1, b1;
  for (cudaEvent_t* e : {&a0, &a1, &b1}) FA3_CUDA_CHECK(cudaEventCreate(e));
  // The short call's end, as a share of the long call's time.
  auto short_ends_at = [&](int margin, double* share) {
    big.a.sm_margin = margin;
    ASSERT_TRUE(fa3::forward(big.a, sa).ok());  // warm-up: the kernels' first-launch setup
    ASSERT_TRUE(fa3::forward(small.a, sb).ok());
    FA3_CUDA_CHECK(cudaDeviceSynchronize());
    FA3_CUDA_CHECK(cudaEventRecord(a0, sa));
    const Status st = fa3::forward(big.a, sa);
    ASSERT_TRUE(st.ok()) << st.message();
    FA3_CUDA_CHECK(cudaEventRecord(a1, sa));
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    ASSERT_TRUE(fa3::forward(small.a, sb).ok());
    FA3_CUDA_CHECK(cudaEventRecord(b1, sb));
    FA3_CUDA_CHECK(cudaDeviceSynchronize());
    float whole = 0, short_end = 0;
    FA3_CUDA_CHECK(cudaEventElapsedTime(&whole, a0, a1));
    FA3_CUDA_CHECK(cudaEventElapsedTime(&short_end, a0, b1));
    *share = short_end / whole;
    std::printf("sm_margin %d: the long call %.2f ms, the short one done at %.2f ms\n", margin, whole, short_end);
  };
  double with_margin = 0, without = 0;
  short_ends_at(8, &with_margin);
  short_ends_at(0, &without);
  EXPECT_LT(with_margin, 0.5) << "with sm_margin 8 the short call should run beside the long one";
  EXPECT_GT(without, 0.8) << "without a margin the short call should wait for the long one's CTAs";
  for (cudaEvent_t e : {a0, a1, b1}) cudaEventDestroy(e);
  cudaStreamDestroy(sa);
  cudaStreamDestroy(sb);
}

// The public API refuses a host pointer passed as a tensor (it would fault inside the kernel);
// only fa3's bindings, whose tensors are device memory by construction, skip that check.
TEST(FwdGpu, HostPointerIsRefusedByName) {
  FA3_REQUIRE_GPU();
  FwdCase c;
  FwdData d = make_fwd_data(c, /*reference_inputs=*/false);
  std::vector<char> host(1 << 20);
  fa3::FwdArgs a = d.args;
  a.k.data = host.data();
  const Status st = fa3::forward(a);
  EXPECT_EQ(st.code(), FA3_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(st.message().find("k.data must point to device memory"), std::string::npos) << st.message();
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

// ------------------------------------------------ the harness's own checks (no GPU) ----

// The stray-write check on host images: what a correct kernel writes passes, and a single write
// into any element no sequence owns (past seqused, between or after the packed sequences, guard
// rows, row padding, unowned LSE entries, any LSE entry without lse) is caught.
TEST(FwdHarness, StrayWriteCheckCatchesEveryUnownedElement) {
  std::vector<FwdCase> cases;
  for (Layout layout : {Layout::kBSHD, Layout::kBSHDPadded, Layout::kBHSD}) {
    FwdCase c;
    c.layout = layout;
    c.batch = 3;
    c.head_dim = 16;
    c.head_dim_v = 8;
    c.heads_q = 2;
    c.heads_kv = 1;
    c.varlen_q = {5, 0, 7};
    c.varlen_k = {3, 4, 0};
    c.seqused_q = {4, 0, 7};
    c.guard_rows = 3;
    cases.push_back(c);
    c.varlen_q.clear();  // dense rows: seqused gaps and guard rows after every batch entry
    c.seqlen_q = 6;
    c.seqused_q = {6, 0, 2};
    cases.push_back(c);
    c.with_lse = false;
    cases.push_back(c);
  }
  for (const FwdCase& c : cases) {
    SCOPED_TRACE(c.name());
    const FwdPlan p = plan_fwd(c);
    std::vector<uint16_t> out(p.o_elems, 0xFFFF);
    std::vector<uint32_t> lse(p.lse_elems, 0xFFFFFFFFu);
    long owned_o = 0, owned_lse = 0;
    for (int b = 0; b < c.batch; ++b)
      for (int i = 0; i < p.used_q[b]; ++i)
        for (int h = 0; h < c.heads_q; ++h) {
          for (int x = 0; x < p.dv; ++x, ++owned_o) out[p.o_index(b, i, h, x)] = 0x3f80;
          if (c.with_lse) lse[p.lse_index(b, h, i)] = 0, ++owned_lse;
        }
    auto strays = [&] { return find_stray_writes(p, out.data(), out.size(), lse.data(), lse.size()); };
    StrayWrites r = strays();
    EXPECT_EQ(r.o, 0) << r.where;
    EXPECT_EQ(r.lse, 0) << r.where;
    // Every other element, one at a time.
    long unowned_o = 0, unowned_lse = 0;
    for (size_t i = 0; i < out.size(); ++i) {
      if (out[i] != 0xFFFF) continue;
      ++unowned_o;
      out[i] = 0;
      r = strays();
      EXPECT_EQ(r.o, 1) << "offset " << i;
      EXPECT_FALSE(r.where.empty());
      out[i] = 0xFFFF;
    }
    for (size_t i = 0; i < lse.size(); ++i) {
      if (lse[i] != 0xFFFFFFFFu) continue;
      ++unowned_lse;
      lse[i] = 0;
      EXPECT_EQ(strays().lse, 1) << "entry " << i;
      lse[i] = 0xFFFFFFFFu;
    }
    EXPECT_EQ(unowned_o + owned_o, long(out.size()));
    EXPECT_EQ(unowned_lse + owned_lse, long(lse.size()));
    EXPECT_GT(unowned_o, 0);
    // The spill of an epilogue that writes one row too many lands in an unowned row and is named.
    const int last = c.batch - 1;
    out[p.o_index(last, p.used_q[last], 0, 0)] = 0;
    r = strays();
    EXPECT_EQ(r.o, 1);
    EXPECT_NE(r.where.find("row"), std::string::npos) << r.where;
    // ... and fails the comparison even where every owned value is right.
    FwdOutputs got;
    got.stray = r;
    got.o.assign(c.batch, {});
    got.lse.assign(c.batch, {});
    EXPECT_FALSE(is_close(compare(got, ref::FwdResult{got.o, got.lse}, true)));
  }
}

TEST(FwdHarness, PlanFollowsTheApiLayouts) {
  FwdCase c;
  c.batch = 3;
  c.heads_q = 4;
  c.heads_kv = 2;
  c.head_dim = 64;
  c.head_dim_v = 32;
  c.varlen_q = {5, 0, 7};
  c.varlen_k = {3, 9, 0};
  c.guard_rows = 4;
  FwdPlan p = plan_fwd(c);
  EXPECT_EQ(p.total_q, 12 + 4);  // cu_seqlens_q[batch] + guard rows inside the tensor
  EXPECT_EQ(p.total_k, 12 + 4);
  EXPECT_EQ(p.seqlen_q, 7);  // the longest sequence
  EXPECT_EQ(p.seqlen_k, 9);
  EXPECT_EQ(p.q_row0, (std::vector<int>{0, 5, 5}));
  EXPECT_EQ(p.lse_index(2, 3, 1), 3 * p.total_q + 5 + 1);  // [heads_q, total_q]
  EXPECT_EQ(p.o_index(2, 1, 3, 2), (5 + 1) * 4 * 32 + 3 * 32 + 2);
  EXPECT_GE(p.o_elems, size_t(p.total_q + 4) * 4 * 32);  // guard rows past total_q allocated too
  c.varlen_q = {0, 0, 0};
  c.guard_rows = 0;
  EXPECT_EQ(plan_fwd(c).total_q, 1);  // the API wants total_q >= 1 even with no rows
  c = FwdCase();
  c.batch = 2;
  c.seqlen_q = 10;
  c.seqused_q = {3, 11};  // more than its rows
  EXPECT_THROW(plan_fwd(c), std::invalid_argument);
  c.seqused_q = {3};  // not one per batch entry
  EXPECT_THROW(plan_fwd(c), std::invalid_argument);
}

// ----------------------------------------------------------------- softcap ----

TEST(FwdGpu, SoftcapOnHopper) {
  FA3_REQUIRE_GPU();
  for (int dim : {64, 128, 256})
    for (float cap : {5.f, 30.f, 50.f})
      for (bool causal : {false, true}) {
        FwdCase c;
        c.dtype = dim == 128 ? FA3_DTYPE_FP16 : FA3_DTYPE_BF16;
        c.head_dim = dim;
        c.softcap = cap;
        c.causal = causal;
        c.seqlen_q = 300;
        c.seqlen_k = 517;
        run_fwd_case(c);
      }
  // Longer rows (several key blocks, the running max under the cap), a window, GQA, a tiny cap
  // that flattens every score, and a scale large enough that the cap matters for every score.
  for (bool causal : {false, true}) {
    FwdCase c;
    c.head_dim = 128;
    c.softcap = 30.f;
    c.causal = causal;
    c.seqlen_q = c.seqlen_k = 2100;
    c.heads_q = c.heads_kv = 1;
    run_fwd_case(c);
  }
  FwdCase c;
  c.head_dim = 64;
  c.heads_q = 16;
  c.heads_kv = 2;
  c.seqlen_q = 700;
  c.seqlen_k = 900;
  c.window_left = 100;
  c.window_right = 20;
  c.softcap = 50.f;
  run_fwd_case(c);
  c.softcap = 0.5f;
  run_fwd_case(c);
  c.softcap = 5.f;
  c.softmax_scale = 1.f;
  c.window_left = c.window_right = -1;
  c.causal = true;
  run_fwd_case(c);
  // Rows that see no key (causal, seqlen_q > seqlen_k) under softcap, whose d <= 128 kernels take
  // half their exponentials on the FMA pipe (tiny values for hidden scores, not 0): O = 0 and LSE
  // = -inf still; and growing row maxima (the stale-max fallback) with those exponentials.
  for (int dim : {64, 128}) {
    FwdCase e;
    e.head_dim = dim;
    e.softcap = 20.f;
    e.causal = true;
    e.seqlen_q = 1000;
    e.seqlen_k = 300;
    run_fwd_case(e);
    e.seqlen_q = e.seqlen_k = 1000;
    e.key_growth = 32.f;
    e.softcap = 200.f;  // wide enough for the growth to show through the cap
    run_fwd_case(e);
  }
}

// ---------------------------------------------------------- head-dim pairs ----

TEST(FwdGpu, HeadDimPairsOnHopper) {
  FA3_REQUIRE_GPU();
  const std::pair<int, int> pairs[] = {{192, 128}, {128, 64}, {64, 128}, {256, 128}, {96, 64},  {40, 200},
                                       {128, 256}, {256, 64}, {64, 256}, {8, 256},   {256, 8},  {192, 64},
                                       {72, 136},  {128, 96}, {160, 248}, {96, 192}, {248, 16}, {16, 8}};
  int n = 0;
  for (auto [dqk, dv] : pairs)
    for (bool causal : {false, true}) {
      FwdCase c;
      c.dtype = n++ % 3 == 2 ? FA3_DTYPE_FP16 : FA3_DTYPE_BF16;
      c.head_dim = dqk;
      c.head_dim_v = dv;
      c.causal = causal;
      c.seqlen_q = 200;
      c.seqlen_k = 333;
      c.heads_q = 4;
      c.heads_kv = 2;
      run_fwd_case(c);
    }
  // The dedicated d_qk 192 / d_v 128 kernel over several blocks, masked and not, and with GQA + window.
  for (fa3_dtype t : {FA3_DTYPE_BF16, FA3_DTYPE_FP16})
    for (bool causal : {false, true}) {
      FwdCase c;
      c.dtype = t;
      c.head_dim = 192;
      c.head_dim_v = 128;
      c.causal = causal;
      c.seqlen_q = 2100;
      c.seqlen_k = 2600;
      c.heads_q = c.heads_kv = 1;
      run_fwd_case(c);
    }
  FwdCase c;
  c.head_dim = 192;
  c.head_dim_v = 128;
  c.seqlen_q = c.seqlen_k = 8192;
  c.heads_q = 16;
  c.heads_kv = 2;
  c.window_left = 1000;
  c.window_right = 0;
  run_fwd_case(c, true, true);
  c.window_left = -1;
  c.causal = true;
  c.key_growth = 32.f;
  c.seqlen_q = c.seqlen_k = 2100;
  c.heads_q = c.heads_kv = 1;
  run_fwd_case(c);
}

// ----------------------------------------------------------------- varlen ----

// Packed Q/O and K/V (cu_seqlens_q/k) with lengths 0, 1, 17, tile edges and s_q != s_k within a
// sequence; every mask; GQA 8:1 and MQA; guard rows around and after the packed rows.
TEST(FwdGpu, VarlenPackedAgainstCpu) {
  FA3_REQUIRE_GPU();
  int n = 0;
  for (const VarlenLengths& l : varlen_length_sets())
    for (int dim : {64, 128})
      for (bool causal : {false, true})
        for (auto [hq, hkv] : {std::pair{16, 2}, std::pair{4, 1}}) {
          FwdCase c;
          c.batch = static_cast<int>(l.q.size());
          c.varlen_q = l.q;
          c.varlen_k = l.k;
          c.head_dim = dim;
          c.heads_q = hq;
          c.heads_kv = hkv;
          c.causal = causal;
          if (!causal) std::tie(c.window_left, c.window_right) = kVarlenWindows[n % 5];
          c.guard_rows = n % 2 ? 77 : 0;
          c.dtype = n % 4 == 3 ? FA3_DTYPE_FP16 : FA3_DTYPE_BF16;
          ++n;
          run_fwd_case(c);
        }
  // The other head dims, layouts, softcap and unequal head dims, packed.
  for (auto [dqk, dv] : {std::pair{96, 96}, std::pair{256, 256}, std::pair{192, 128}, std::pair{40, 200}})
    for (Layout layout : {Layout::kBSHDPadded, Layout::kBHSD}) {
      FwdCase c = packed_head_dim_case(dqk, dv, layout);
      c.causal = dqk == 192;
      c.softcap = dqk == 96 ? 20.f : 0.f;
      run_fwd_case(c);
    }
}

TEST(FwdGpu, VarlenLongAgainstOracle) {
  FA3_REQUIRE_GPU();
  const std::vector<int> q = {4097, 0, 1000, 5000, 1, 17}, k = {4097, 300, 5000, 1000, 4097, 0};
  int n = 0;
  for (auto [dqk, dv] : {std::pair{64, 64}, std::pair{128, 128}, std::pair{192, 128}, std::pair{256, 256}})
    for (int mask = 0; mask < 3; ++mask) {
      FwdCase c;
      c.dtype = n++ % 2 ? FA3_DTYPE_FP16 : FA3_DTYPE_BF16;
      c.batch = static_cast<int>(q.size());
      c.varlen_q = q;
      c.varlen_k = k;
      c.head_dim = dqk;
      c.head_dim_v = dv;
      c.heads_q = dqk <= 128 ? 16 : 8;
      c.heads_kv = dqk == 128 ? 1 : 2;  // MQA 16:1, GQA 8:1 and 4:1
      c.causal = mask == 1;
      if (mask == 2) c.window_left = 500, c.window_right = 64;
      c.softcap = dqk == 64 ? 30.f : 0.f;
      c.guard_rows = 200;
      run_fwd_case(c, true, true);
    }
}

// Many short sequences (up to 256, about a tenth of them empty): the scheduler's walk over
// sequences and every tile's clipping to its own sequence.
TEST(FwdGpu, VarlenManySequences) {
  FA3_REQUIRE_GPU();
  for (int batch : {100, 256})
    for (bool causal : {false, true}) {
      FwdCase c;
      c.batch = batch;
      c.varlen_q = random_lengths(batch, 0, batch == 100 ? 40 : 300);
      c.varlen_k = random_lengths(batch, 0, batch == 100 ? 40 : 300);
      for (int b = 0; b < batch; b += 10) c.varlen_q[b] = 0;
      for (int b = 5; b < batch; b += 10) c.varlen_k[b] = 0;
      c.heads_q = 8;
      c.heads_kv = 1;
      c.head_dim = batch == 100 ? 64 : 128;
      c.causal = causal;
      c.guard_rows = 64;
      run_fwd_case(c, true, /*use_oracle=*/batch == 256);
    }
}

// Sequences of no rows write nothing; rows without any key write O = 0 and LSE = -inf.
TEST(FwdGpu, ZeroLengthSequences) {
  FA3_REQUIRE_GPU();
  for (bool causal : {false, true}) {
    FwdCase c;
    c.causal = causal;
    c.batch = 3;
    c.varlen_q = {0, 0, 0};  // no query at all: total_q is only the guard rows (or 1)
    c.varlen_k = {10, 0, 5};
    c.guard_rows = 0;
    run_fwd_case(c);
    c.guard_rows = 130;
    run_fwd_case(c);
    c.varlen_q = {5, 130, 1};  // queries, but no key anywhere
    c.varlen_k = {0, 0, 0};
    run_fwd_case(c);
    c.varlen_q = {0, 300, 0};
    c.varlen_k = {300, 0, 1};
    run_fwd_case(c);
  }
}

// Strides, unequal head dims, softcap and windows together on packed rows.
TEST(FwdGpu, VarlenWithEveryFeature) {
  FA3_REQUIRE_GPU();
  int n = 0;
  for (Layout layout : {Layout::kBSHD, Layout::kBSHDPadded, Layout::kBHSD})
    for (auto [dqk, dv] : {std::pair{192, 128}, std::pair{128, 64}, std::pair{64, 256}}) {
      FwdCase c;
      c.layout = layout;
      c.dtype = n % 2 ? FA3_DTYPE_FP16 : FA3_DTYPE_BF16;
      c.head_dim = dqk;
      c.head_dim_v = dv;
      c.batch = 4;
      c.varlen_q = {333, 1, 0, 700};
      c.varlen_k = {517, 900, 3, 700};
      c.heads_q = 8;
      c.heads_kv = n % 2 ? 1 : 4;
      c.softcap = n % 2 ? 15.f : 0.f;
      c.causal = n % 3 == 0;
      if (!c.causal) c.window_left = 128, c.window_right = n % 2 ? 0 : 70;
      c.guard_rows = 129;
      c.with_lse = n != 4;
      ++n;
      run_fwd_case(c);
    }
}

// -------------------------------------------------------------- seqused ----

TEST(FwdGpu, SequsedOnHopper) {
  FA3_REQUIRE_GPU();
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "no mask");
    for (const FwdCase& c : seqused_cases(causal)) run_fwd_case(c);
  }
  // A long dense batch with seqused against the oracle.
  FwdCase c;
  c.batch = 2;
  c.seqlen_q = c.seqlen_k = 5000;
  c.seqused_q = {4097, 1000};
  c.seqused_k = {5000, 4097};
  c.heads_q = 16;
  c.heads_kv = 2;
  c.causal = true;
  c.guard_rows = 128;
  run_fwd_case(c, true, true);
}

// ---------------------------------------------------------------- paged KV ----

// A paged cache (shuffled pages, keys per sequence as seqused_k) on the Hopper kernel: page sizes
// below, equal to and above each tile's key block (boxes of gcd(kBlockN, page_size) rows: 16 for
// kBlockN 80 / 112, up to 128), and pages that are not a multiple of 16 rows (gathered row by row:
// 1, 8, 24, 100 — above the 64- and 80-key blocks), partial last pages, every head dim's tile,
// masks, GQA, softcap, packed queries, sequences without keys.
TEST(FwdGpu, PagedOnHopper) {
  FA3_REQUIRE_GPU();
  int n = 0;
  for (int page : {16, 32, 48, 64, 128, 256, 512, 1, 8, 24, 100})
    for (auto [dqk, dv] : {std::pair{64, 64}, std::pair{128, 128}, std::pair{256, 256}, std::pair{192, 128}}) {
      FwdCase c;
      c.batch = 3;
      c.page_size = page;
      c.varlen_k = {700, 1, 300};  // keys per sequence, in its pages
      c.seqlen_q = 200;
      c.head_dim = dqk;
      c.head_dim_v = dv;
      c.heads_q = 8;
      c.heads_kv = n % 2 ? 2 : 8;
      c.causal = n % 3 == 1;
      if (n % 3 == 2) c.window_left = 100, c.window_right = 20;
      c.softcap = n % 5 == 4 ? 20.f : 0.f;
      c.dtype = n % 4 == 3 ? FA3_DTYPE_FP16 : FA3_DTYPE_BF16;
      ++n;
      EXPECT_EQ(kernel_of(c), "hopper") << c.name();
      run_fwd_case(c);
    }
  // Gathered pages on the padded head dims (a part-used panel, columns zero-filled past head_dim)
  // and on a d_qk != d_v pair that shares the square tile (every cache row no sequence uses is NaN).
  for (int page : {1, 24})
    for (auto [dqk, dv] : {std::pair{96, 96}, std::pair{80, 128}, std::pair{128, 64}}) {
      FwdCase c;
      c.batch = 3;
      c.page_size = page;
      c.varlen_k = {333, 1, 100};
      c.seqlen_q = 150;
      c.head_dim = dqk;
      c.head_dim_v = dv;
      c.heads_q = 4;
      c.heads_kv = 2;
      c.causal = dqk == 80;
      EXPECT_EQ(kernel_of(c), "hopper") << c.name();
      run_fwd_case(c);
    }
  // Packed queries with a paged cache (chunked prefill), and sequences without keys.
  for (int page : {16, 256, 1, 7}) {
    FwdCase c;
    c.batch = 4;
    c.page_size = page;
    c.varlen_q = {17, 300, 0, 64};
    c.varlen_k = {1000, 300, 5, 0};
    c.heads_q = 16;
    c.heads_kv = 2;
    c.causal = true;
    c.guard_rows = 40;
    run_fwd_case(c);
  }
  // Fixed lengths (no seqused_k: the fixed-length kernels), every page full but the last.
  for (int page : {16, 64, 3}) {
    FwdCase c;
    c.batch = 2;
    c.page_size = page;
    c.seqlen_q = 333;
    c.seqlen_k = 1000;
    c.causal = page == 64;
    run_fwd_case(c);
  }
}

// --------------------------------------------------- guard rows and stray writes ----

// Tile edges of every tile height (64, 128, 192 rows): each sequence's last tile reaches into the
// next sequence or the guard rows, which only the epilogue's row clipping keeps clean.
TEST(FwdGpu, GuardRowsCatchSpills) {
  FA3_REQUIRE_GPU();
  const std::vector<int> q = {1, 63, 64, 65, 127, 128, 129, 191, 192, 193, 255, 257};
  for (auto [dqk, dv] : {std::pair{64, 64}, std::pair{96, 96}, std::pair{128, 128}, std::pair{192, 128}, std::pair{256, 256}})
    for (bool causal : {false, true}) {
      FwdCase c;
      c.head_dim = dqk;
      c.head_dim_v = dv;
      c.batch = static_cast<int>(q.size());
      c.varlen_q = q;
      c.varlen_k.assign(q.rbegin(), q.rend());
      c.seqused_q = q;
      for (int b = 0; b < c.batch; b += 3) c.seqused_q[b] = q[b] / 2;  // rows past seqused inside a sequence
      c.causal = causal;
      c.heads_q = 2;
      c.heads_kv = 1;
      c.guard_rows = 300;
      run_fwd_case(c);
    }
}

// The poison check itself catches a single write into rows no sequence owns (a real run first:
// nothing stray; then one element of a guard row, of a row past seqused_q, and of an LSE entry).
TEST(FwdGpu, PoisonCheckCatchesOneStrayElement) {
  FA3_REQUIRE_GPU();
  FwdCase c;
  c.batch = 3;
  c.varlen_q = {100, 0, 70};
  c.varlen_k = {90, 10, 300};
  c.seqused_q = {60, 0, 70};
  c.guard_rows = 10;
  FwdData d = make_fwd_data(c, false);
  ASSERT_TRUE(fa3::forward(d.args).ok());
  FA3_CUDA_CHECK(cudaDeviceSynchronize());
  EXPECT_EQ(download_outputs(d).stray.o, 0);
  EXPECT_EQ(download_outputs(d).stray.lse, 0);
  const uint16_t one = 0x3f80;  // bf16 1.0
  const int64_t offsets[] = {d.plan.o_index(2, 70, 1, 5),   // after the last sequence, inside total_q
                             d.plan.o_index(0, 60, 0, 0),   // past seqused_q of sequence 0
                             int64_t(d.plan.total_q) * d.plan.os.row};  // past total_q
  for (int64_t off : offsets) {
    FA3_CUDA_CHECK(cudaMemcpy(static_cast<uint16_t*>(d.out.get()) + off, &one, 2, cudaMemcpyHostToDevice));
    const FwdOutputs got = download_outputs(d);
    EXPECT_EQ(got.stray.o, 1) << got.stray.where;
    EXPECT_FALSE(is_close(compare(got, ref::FwdResult{got.o, got.lse}, true)));
    const uint16_t poison = 0xFFFF;
    FA3_CUDA_CHECK(cudaMemcpy(static_cast<uint16_t*>(d.out.get()) + off, &poison, 2, cudaMemcpyHostToDevice));
  }
  const float zero = 0.f;
  FA3_CUDA_CHECK(cudaMemcpy(static_cast<float*>(d.lse.get()) + d.plan.lse_index(0, 1, 60), &zero, 4,
                            cudaMemcpyHostToDevice));
  EXPECT_EQ(download_outputs(d).stray.lse, 1);
}

// ------------------------------------------------- what stays on reference-gpu ----

// ------------------------------------------------------------- the decode path ----

// Which instantiation the case's arguments reach ("fwd_bf16_d128split_..." is the decode kernel).
std::string instance_of(const FwdCase& c) {
  FwdData d = make_fwd_data(c, false);
  std::string name;
  const Status st = detail::hopper_fwd_instance(detail::make_problem(d.args), &name);
  return st.ok() ? name : "error: " + st.message();
}
bool on_decode_kernel(const FwdCase& c) { return instance_of(c).find("split_") != std::string::npos; }

// Decodes (few queries, long caches) on the decode kernel: query lengths 1, 4, 17 x key lengths 1,
// 17, 1000, 4097 x packing (GQA 4:1 and 8:1 packed, 6:2 = 3 per kv head not packed, MQA 16:1,
// MHA), head dims 64..256 and 192/128, causal, windows, both dtypes, automatic and explicit
// splits up to 128 (more than key blocks: capped), LSE and not.
TEST(FwdGpu, DecodeAgainstCpu) {
  FA3_REQUIRE_GPU();
  struct Heads {
    int q, kv;
  };
  const Heads heads[] = {{8, 2}, {16, 2}, {6, 2}, {16, 1}, {4, 4}};
  const std::pair<int, int> dims[] = {{128, 128}, {64, 64}, {256, 256}, {96, 96}, {192, 128}, {80, 80}};
  const int splits[] = {0, 1, 2, 7, 128, 0, 3};
  int n = 0;
  for (int sq : {1, 4, 17})
    for (int sk : {1, 17, 1000, 4097}) {
      for (int i = 0; i < 3; ++i, ++n) {
        FwdCase c;
        c.batch = 1 + n % 3;
        c.seqlen_q = sq;
        c.seqlen_k = sk;
        c.heads_q = heads[n % 5].q;
        c.heads_kv = heads[n % 5].kv;
        c.head_dim = dims[n % 6].first;
        c.head_dim_v = dims[n % 6].second;
        c.causal = n % 2 == 1;
        if (n % 7 == 3) c.causal = false, c.window_left = 300, c.window_right = n % 2 ? 0 : 2;
        c.dtype = n % 4 == 3 ? FA3_DTYPE_FP16 : FA3_DTYPE_BF16;
        c.with_lse = n % 9 != 4;
        c.workspace = true;
        c.num_splits = splits[n % 7];
        if (sq == 17 && c.num_splits <= 1) c.num_splits = 2;  // 17 x 8 rows: explicit splits only
        EXPECT_TRUE(on_decode_kernel(c)) << c.name() << " reached " << instance_of(c);
        run_fwd_case(c);
      }
    }
}

// e4m3 decodes on the decode kernel (FwdFp8SplitConfig: V transposed by the producer's warps 1-3,
// pack-GQA rows, split-KV): query lengths 1, 4, 17 x key lengths 1, 17, 1000, 4097, packing (GQA 4:1
// and 8:1 packed, 6:2 not, MQA, MHA, each with several head dims), head dims 64 / 128 / 256 and
// padded ones, causal and windows (on 1000 and 4097 keys), sinks, automatic and explicit splits,
// paged caches (TMA boxes and gathered pages), descales different per (batch, kv head) — which a
// packed tile must index by its kv head.
TEST(FwdGpu, DecodeFp8AgainstCpu) {
  FA3_REQUIRE_GPU();
  struct Heads {
    int q, kv;
  };
  const Heads heads[] = {{8, 2}, {16, 2}, {6, 2}, {16, 1}, {4, 4}};
  const int dims[] = {128, 64, 256, 96, 192};
  const int splits[] = {0, 1, 2, 7, 128, 0, 3};
  const int pages[] = {0, 0, 16, 1, 0, 24};
  int n = 0;
  for (int sq : {1, 4, 17})
    for (int sk : {1, 17, 1000, 4097})
      for (int i = 0; i < 2; ++i, ++n) {
        FwdCase c;
        c.dtype = FA3_DTYPE_E4M3;
        c.batch = 1 + n % 3;
        c.seqlen_q = sq;
        c.seqlen_k = sk;
        c.heads_q = heads[n % 5].q;
        c.heads_kv = heads[n % 5].kv;
        c.head_dim = dims[(n + n / 5) % 5];  // every head dim with every packing over the cases
        c.causal = n % 2 == 1;
        if (n % 4 == 2 && sk >= 1000) c.causal = false, c.window_left = 300, c.window_right = n % 3 ? 0 : 2;
        c.sinks = n % 3 == 1;
        c.with_lse = n % 9 != 4;
        c.workspace = true;
        c.num_splits = splits[n % 7];
        if (sq == 17 && c.num_splits <= 1) c.num_splits = 2;  // 17 x 8 rows: explicit splits only
        c.page_size = pages[n % 6];
        EXPECT_TRUE(on_decode_kernel(c)) << c.name() << " reached " << instance_of(c);
        run_fwd_case(c);
      }
}

// Splitting changes the summation order and P's rounding: 2..128 splits of the same inputs agree
// with one split to P's rounding (bounded in rms and in every element, below) and LSE to fp32
// rounding.
TEST(FwdGpu, DecodeSplitsAgreeWithOneSplit) {
  FA3_REQUIRE_GPU();
  for (fa3_dtype dt : {FA3_DTYPE_BF16, FA3_DTYPE_FP16}) {
    FwdCase c;
    c.dtype = dt;
    c.batch = 2;
    c.seqlen_q = 4;
    c.seqlen_k = 128 * 128 + 77;  // 129 key blocks of 128
    c.heads_q = 8;
    c.heads_kv = 2;
    c.causal = true;
    c.workspace = true;
    c.num_splits = 1;
    FwdData d = make_fwd_data(c, false);
    ASSERT_TRUE(fa3::forward(d.args).ok());
    FA3_CUDA_CHECK(cudaDeviceSynchronize());
    const FwdOutputs one = download_outputs(d);
    for (int s : {2, 3, 5, 16, 64, 127, 128}) {
      SCOPED_TRACE("splits " + std::to_string(s));
      fa3::FwdArgs a = d.args;
      a.num_splits = s;
      size_t bytes = 0;
      ASSERT_TRUE(fa3::workspace_size(a, &bytes).ok());
      DeviceBuffer ws(bytes);
      ws.fill_bytes(0xFF);
      a.workspace = ws.get();
      a.workspace_bytes = bytes;
      poison_outputs(d);
      const Status st = fa3::forward(a);
      ASSERT_TRUE(st.ok()) << st.message();
      FA3_CUDA_CHECK(cudaDeviceSynchronize());
      const FwdOutputs got = download_outputs(d);
      // P is rounded to 16 bits against each split's own row maximum, not the row's, so the two
      // runs round each probability independently: a relative error uniform within +-u (half an
      // ulp: at most 2^-8 bf16, 2^-11 fp16) per probability gives O an error of rms at most
      // u/sqrt(3) of O's own size (V random), and the difference of two runs sigma = sqrt(2/3) u
      // of O's rms (0.32% bf16, 0.04% fp16), summed over thousands of keys; each run also rounds
      // O to 16 bits (a step of |o| at most). Measured (H200, 2026-12-03, 12 runs, 84 split counts a
      // dtype): rms 0.77-0.99 sigma, the largest excess of an element over its step median 2.2,
      // at most 4.1 sigma, alike for bf16 and fp16 (so it is P's rounding). The former allowance,
      // 1% of O's rms past the step (3.06 sigma), was passed by 5 of the 168: one run of the test
      // in three failed. The bounds: the difference's rms within 2 sigma, every element within its
      // step plus 8 sigma. A wrong split or weight moves whole rows by a large part of O's rms.
      double sq = 0, sq_diff = 0;
      size_t n = 0;
      for (size_t b = 0; b < got.o.size(); ++b)
        for (size_t i = 0; i < got.o[b].size(); ++i) {
          const double y = one.o[b][i], e = got.o[b][i] - y;
          sq += y * y, sq_diff += e * e, ++n;
        }
      const double rms = std::sqrt(sq / std::max<size_t>(n, 1));
      const double rms_diff = std::sqrt(sq_diff / std::max<size_t>(n, 1));
      const double u = dt == FA3_DTYPE_BF16 ? 1.0 / 256 : 1.0 / 2048;
      const double sigma = std::sqrt(2.0 / 3.0) * u * rms;
      const double step = dt == FA3_DTYPE_BF16 ? 1.0 / 128 : 1.0 / 1024;
      long bad = 0, bad_lse = 0;
      double worst = 0;  // the largest excess over an element's rounding step, in sigmas
      for (size_t b = 0; b < got.o.size(); ++b)
        for (size_t i = 0; i < got.o[b].size(); ++i) {
          const double excess = std::abs(got.o[b][i] - one.o[b][i]) - step * std::abs(one.o[b][i]);
          worst = std::max(worst, excess / sigma);
          if (!(excess <= 8 * sigma)) ++bad;
        }
      for (size_t b = 0; b < got.lse.size(); ++b)
        for (size_t i = 0; i < got.lse[b].size(); ++i)
          if (!(std::abs(got.lse[b][i] - one.lse[b][i]) <= 1e-5 * std::max(1.0, std::abs(one.lse[b][i])))) ++bad_lse;
      std::printf("[splits %3d %s] O difference rms %.2f sigma, largest excess over the rounding step %.2f sigma\n",
                  s, dt == FA3_DTYPE_BF16 ? "bf16" : "fp16", rms_diff / sigma, worst);
      EXPECT_LE(rms_diff, 2 * sigma) << "rms of O " << rms;
      EXPECT_EQ(bad, 0);
      EXPECT_EQ(bad_lse, 0);
      EXPECT_EQ(got.stray.o + got.stray.lse, 0) << got.stray.where;
    }
  }
}

// Serving's call: packed query lengths (0 among them), a paged cache with random keys per sequence
// (seqused_k), pages of 16 and 256, GQA 32:8, causal (speculative decoding) and not, guard rows.
// Pages of 48 (three 16-row boxes a page, so a key block's boxes cross pages mid-block) and 32 on
// the d256 and d64 decode tiles (64- and 128-key blocks); gathered pages of 1 (d256) and 12 (d64).
TEST(FwdGpu, DecodePagedVarlen) {
  FA3_REQUIRE_GPU();
  int n = 0;
  for (int page : {16, 256, 64, 48, 32, 1, 12})
    for (bool causal : {false, true}) {
      FwdCase c;
      c.batch = 5;
      c.page_size = page;
      c.head_dim = page == 48 || page == 1 ? 256 : page == 32 || page == 12 ? 64 : 128;
      c.varlen_q = {1, 4, 0, 3, 1};
      c.varlen_k = {1000, 4, 37, 0, 2049};
      c.heads_q = 32;
      c.heads_kv = 8;
      c.causal = causal;
      c.guard_rows = 9;
      c.workspace = true;
      c.num_splits = n++ % 2 ? 0 : 5;
      EXPECT_TRUE(on_decode_kernel(c)) << c.name() << " reached " << instance_of(c);
      run_fwd_case(c);
    }
  // Dense queries, cache lengths as seqused_k, contiguous.
  FwdCase c;
  c.batch = 3;
  c.seqlen_q = 2;
  c.seqlen_k = 3000;
  c.seqused_k = {3000, 1, 1500};
  c.heads_q = 4;
  c.heads_kv = 1;
  c.causal = true;
  c.workspace = true;
  EXPECT_TRUE(on_decode_kernel(c)) << c.name();
  run_fwd_case(c);
}

// Several host threads, a stream each, decoding at the same time (serving engines' workers).
TEST(FwdGpu, DecodeFromSeveralThreads) {
  FA3_REQUIRE_GPU();
  constexpr int kThreads = 4;
  std::vector<FwdData> data;
  for (int t = 0; t < kThreads; ++t) {
    FwdCase c;
    c.seqlen_q = 1 + t;
    c.seqlen_k = 3000 + 100 * t;
    c.heads_q = 8;
    c.heads_kv = 2;
    c.causal = true;
    c.workspace = true;
    data.push_back(make_fwd_data(c, true));
  }
  std::vector<Status> st(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      cudaStream_t stream = nullptr;
      if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
        st[t] = Status(FA3_ERROR_CUDA, "stream");
        return;
      }
      for (int i = 0; i < 20 && st[t].ok(); ++i) st[t] = fa3::forward(data[t].args, stream);
      if (st[t].ok() && cudaStreamSynchronize(stream) != cudaSuccess) st[t] = Status(FA3_ERROR_CUDA, "sync failed");
      cudaStreamDestroy(stream);
    });
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) {
    ASSERT_TRUE(st[t].ok()) << st[t].message();
    expect_close(compare(download_outputs(data[t]), ref::forward(data[t].prob, data[t].in), true), data[t].c.name());
  }
}

// Bad decode arguments get an error naming them: explicit splits without their workspace, too
// many splits, a misaligned workspace; a small workspace with automatic splits takes fewer, and
// none takes one split (the decode kernel writes O itself).
TEST(FwdGpu, DecodeBadArguments) {
  FA3_REQUIRE_GPU();
  FwdCase c;
  c.seqlen_q = 1;
  c.seqlen_k = 5000;
  c.heads_q = 8;
  c.heads_kv = 2;
  c.workspace = true;
  FwdData d = make_fwd_data(c, true);
  fa3::FwdArgs a = d.args;
  a.num_splits = 8;
  a.workspace = nullptr;
  a.workspace_bytes = 0;
  Status st = fa3::forward(a);
  EXPECT_EQ(st.code(), FA3_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(st.message().find("workspace_bytes"), std::string::npos) << st.message();
  a.num_splits = 129;
  st = fa3::forward(a);
  EXPECT_EQ(st.code(), FA3_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(st.message().find("num_splits"), std::string::npos) << st.message();
  a = d.args;
  a.workspace = static_cast<char*>(a.workspace) + 4;
  a.workspace_bytes -= 16;
  st = fa3::forward(a);
  EXPECT_EQ(st.code(), FA3_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(st.message().find("16-byte aligned"), std::string::npos) << st.message();
  // One split needs no workspace; automatic splits in a workspace that holds two take two.
  a = d.args;
  a.num_splits = 1;
  size_t bytes = 1;
  ASSERT_TRUE(fa3::workspace_size(a, &bytes).ok());
  EXPECT_EQ(bytes, 0u);
  a.num_splits = 2;
  ASSERT_TRUE(fa3::workspace_size(a, &bytes).ok());
  a.num_splits = 0;
  a.workspace_bytes = bytes;
  poison_outputs(d);
  st = fa3::forward(a);
  ASSERT_TRUE(st.ok()) << st.message();
  FA3_CUDA_CHECK(cudaDeviceSynchronize());
  expect_close(compare(download_outputs(d), ref::forward(d.prob, d.in), true), c.name() + " small workspace");
  a.workspace = nullptr;
  a.workspace_bytes = 0;
  EXPECT_TRUE(on_decode_kernel(c));
  poison_outputs(d);
  st = fa3::forward(a);
  ASSERT_TRUE(st.ok()) << st.message();
  FA3_CUDA_CHECK(cudaDeviceSynchronize());
  expect_close(compare(download_outputs(d), ref::forward(d.prob, d.in), true), c.name() + " no workspace");
}

// fa3::combine on its own against double math: FlashAttention-3's layouts [splits, batch, seqlen,
// heads, d] / [splits, batch, seqlen, heads], splits of weight 0 holding NaN (never read), a row no
// split saw (O = 0, LSE = -inf), packed rows with seqused (rows past it keep their poison), every
// output dtype, head dims 4..256, 1..128 splits.
TEST(FwdGpu, CombineAgainstCpu) {
  FA3_REQUIRE_GPU();
  struct Case {
    int splits, batch, seqlen, heads, dim;
    fa3_dtype dtype;
    bool packed, sinks;
  };
  const Case cases[] = {{5, 3, 7, 4, 64, FA3_DTYPE_FP32, false, true}, {1, 2, 3, 2, 4, FA3_DTYPE_BF16, false, false},
                        {128, 1, 3, 3, 256, FA3_DTYPE_FP16, false, false}, {33, 3, 5, 2, 136, FA3_DTYPE_BF16, true, true},
                        {2, 2, 3, 4, 8, FA3_DTYPE_FP32, false, false}};
  std::mt19937 g(7);
  std::normal_distribution<float> nd;
  for (const Case& k : cases) {
    SCOPED_TRACE(std::to_string(k.splits) + " splits d" + std::to_string(k.dim) + (k.sinks ? " sinks" : ""));
    const int64_t rows = int64_t(k.batch) * k.seqlen;  // packed: the same rows, cu_seqlens 0, s, 2s, ...
    std::vector<float> o(size_t(k.splits) * rows * k.heads * k.dim), l(size_t(k.splits) * rows * k.heads);
    for (auto& x : o) x = nd(g);
    for (size_t i = 0; i < l.size(); ++i) l[i] = 3 * nd(g);
    auto lidx = [&](int s, int64_t r, int h) { return (int64_t(s) * rows + r) * k.heads + h; };
    for (int s = 0; s < k.splits; ++s) {
      if (s >= 1) l[lidx(s, 0, 0)] = -INFINITY;  // row 0 head 0: only split 0
      l[lidx(s, 1, 0)] = -INFINITY;              // row 1 head 0: no split
      if (s % 3 == 2)
        for (int x = 0; x < k.dim; ++x) o[lidx(s, 2, 1 % k.heads) * k.dim + x] = NAN, l[lidx(s, 2, 1 % k.heads)] = -INFINITY;
    }
    DeviceBuffer dop(o.size() * 4), dlp(l.size() * 4);
    dop.upload(o.data(), o.size() * 4);
    dlp.upload(l.data(), l.size() * 4);
    const int64_t esize = k.dtype == FA3_DTYPE_FP32 ? 4 : 2;
    DeviceBuffer dout(rows * k.heads * k.dim * esize), dlse(rows * k.heads * 4);
    dout.fill_bytes(0xFF);
    dlse.fill_bytes(0xFF);
    std::vector<int> cu, used;
    for (int b = 0; b <= k.batch; ++b) cu.push_back(b * k.seqlen);
    for (int b = 0; b < k.batch; ++b) used.push_back(b == 1 ? 1 : k.seqlen);
    DeviceBuffer dcu(cu.size() * 4), dused(used.size() * 4);
    dcu.upload(cu.data(), cu.size() * 4);
    dused.upload(used.data(), used.size() * 4);
    fa3::CombineArgs c;
    c.out_dtype = k.dtype;
    c.num_splits = k.splits;
    c.batch = k.batch;
    c.seqlen = k.seqlen;
    c.heads = k.heads;
    c.head_dim = k.dim;
    c.out_partial = static_cast<const float*>(dop.get());
    c.out_partial_split_stride = rows * k.heads * k.dim;
    c.out_partial_batch_stride = int64_t(k.seqlen) * k.heads * k.dim;
    c.out_partial_row_stride = int64_t(k.heads) * k.dim;
    c.out_partial_head_stride = k.dim;
    c.lse_partial = static_cast<const float*>(dlp.get());
    c.lse_partial_split_stride = rows * k.heads;
    c.lse_partial_batch_stride = int64_t(k.seqlen) * k.heads;
    c.lse_partial_row_stride = k.heads;
    c.lse_partial_head_stride = 1;
    c.out = {dout.get(), int64_t(k.seqlen) * k.heads * k.dim, int64_t(k.heads) * k.dim, k.dim};
    c.lse = static_cast<float*>(dlse.get());
    c.lse_batch_stride = int64_t(k.seqlen) * k.heads;
    c.lse_row_stride = k.heads;
    c.lse_head_stride = 1;
    if (k.packed) {
      c.cu_seqlens = static_cast<const int32_t*>(dcu.get());
      c.seqused = static_cast<const int32_t*>(dused.get());
    }
    std::vector<float> sinks(k.heads);
    for (int h = 0; h < k.heads; ++h) sinks[h] = sink_logit(h);
    DeviceBuffer dsinks(sinks.size() * 4);
    dsinks.upload(sinks.data(), sinks.size() * 4);
    if (k.sinks) c.sinks = static_cast<const float*>(dsinks.get());
    const Status st = fa3::combine(c);
    ASSERT_TRUE(st.ok()) << st.message();
    FA3_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<uint8_t> got_o(rows * k.heads * k.dim * esize);
    std::vector<float> got_l(rows * k.heads);
    dout.download(got_o.data(), got_o.size());
    dlse.download(got_l.data(), got_l.size() * 4);
    auto value = [&](int64_t i) -> double {
      if (k.dtype == FA3_DTYPE_FP32) return reinterpret_cast<const float*>(got_o.data())[i];
      uint16_t u = reinterpret_cast<const uint16_t*>(got_o.data())[i];
      if (k.dtype == FA3_DTYPE_BF16) {
        uint32_t w = uint32_t(u) << 16;
        float f;
        std::memcpy(&f, &w, 4);
        return f;
      }
      return static_cast<double>(__half2float(*reinterpret_cast<const __half*>(&u)));
    };
    const double tol = k.dtype == FA3_DTYPE_FP32 ? 1e-5 : k.dtype == FA3_DTYPE_BF16 ? 1e-2 : 2e-3;
    long bad = 0, poisoned = 0;
    for (int b = 0; b < k.batch; ++b)
      for (int i = 0; i < k.seqlen; ++i)
        for (int h = 0; h < k.heads; ++h) {
          const int64_t r = int64_t(b) * k.seqlen + i, orow = (r * k.heads + h) * k.dim;
          const bool owned = !k.packed || i < used[b];
          if (!owned) {  // untouched: the 0xFF poison, in LSE and O
            uint32_t bits;
            std::memcpy(&bits, &got_l[r * k.heads + h], 4);
            poisoned += bits == 0xFFFFFFFFu ? 0 : 1;
            for (int64_t x = 0; x < k.dim * esize; ++x) poisoned += got_o[orow * esize + x] == 0xFF ? 0 : 1;
            continue;
          }
          // A sink is one more term of the sum, with no partial O.
          double m = k.sinks ? sinks[h] : -INFINITY;
          for (int s = 0; s < k.splits; ++s) m = std::max(m, double(l[lidx(s, r, h)]));
          double sum = k.sinks ? std::exp(sinks[h] - m) : 0.0;
          for (int s = 0; s < k.splits; ++s) sum += m == -INFINITY ? 0 : std::exp(l[lidx(s, r, h)] - m);
          const double lse = m == -INFINITY ? -INFINITY : m + std::log(sum);
          const double gl = got_l[r * k.heads + h];
          if (!(lse == -INFINITY ? gl == -INFINITY : std::abs(gl - lse) <= 1e-5 * std::max(1.0, std::abs(lse)))) ++bad;
          for (int x = 0; x < k.dim; ++x) {
            double want = 0;
            for (int s = 0; s < k.splits; ++s)
              if (m != -INFINITY && l[lidx(s, r, h)] != -INFINITY)
                want += std::exp(l[lidx(s, r, h)] - lse) * o[lidx(s, r, h) * k.dim + x];
            const double got = value(orow + x);
            if (!(std::abs(got - want) <= tol * std::max(1.0, std::abs(want)))) ++bad;
          }
        }
    EXPECT_EQ(bad, 0);
    EXPECT_EQ(poisoned, 0) << "rows past seqused were written";
  }
  // Bad arguments name themselves.
  fa3::CombineArgs c;
  c.num_splits = 129;
  EXPECT_NE(fa3::validate(c).message().find("num_splits"), std::string::npos);
  c.num_splits = 2;
  c.batch = c.seqlen = c.heads = 1;
  c.head_dim = 6;
  EXPECT_NE(fa3::validate(c).message().find("head_dim"), std::string::npos);
}

// The combine's contract that a split of weight 0 is never read, where a read would leave the
// allocation: the partial outputs hold splits 0 and 1 only, splits 2..5 have LSE -inf, and row 1
// has keys in split 1 alone (an empty split's load is redirected to the first split with keys,
// which there is not split 0). Plain runs check the output; compute-sanitizer memcheck
// (tools/gpu-check.sh's filter) the reads.
TEST(FwdGpu, CombineNeverReadsEmptySplits) {
  FA3_REQUIRE_GPU();
  constexpr int kSplits = 6, kRows = 2, kDim = 96;  // d96: lanes past the head dim in the first chunk
  std::vector<float> o(size_t(2) * kRows * kDim), l(size_t(kSplits) * kRows, -INFINITY);
  std::mt19937 g(11);
  std::normal_distribution<float> nd;
  for (auto& x : o) x = nd(g);
  l[0 * kRows + 0] = 0.7f;   // row 0: splits 0 and 1
  l[1 * kRows + 0] = -0.4f;
  l[1 * kRows + 1] = 1.3f;   // row 1: split 1 only
  DeviceBuffer dop(o.size() * 4), dlp(l.size() * 4), dout(size_t(kRows) * kDim * 4);
  dop.upload(o.data(), o.size() * 4);
  dlp.upload(l.data(), l.size() * 4);
  fa3::CombineArgs c;
  c.out_dtype = FA3_DTYPE_FP32;
  c.num_splits = kSplits;
  c.batch = 1;
  c.seqlen = kRows;
  c.heads = 1;
  c.head_dim = kDim;
  c.out_partial = static_cast<const float*>(dop.get());
  c.out_partial_split_stride = int64_t(kRows) * kDim;
  c.out_partial_batch_stride = int64_t(kRows) * kDim;
  c.out_partial_row_stride = c.out_partial_head_stride = kDim;
  c.lse_partial = static_cast<const float*>(dlp.get());
  c.lse_partial_split_stride = c.lse_partial_batch_stride = kRows;
  c.lse_partial_row_stride = c.lse_partial_head_stride = 1;
  c.out = {dout.get(), int64_t(kRows) * kDim, kDim, kDim};
  const Status st = fa3::combine(c);
  ASSERT_TRUE(st.ok()) << st.message();
  std::vector<float> got(size_t(kRows) * kDim);
  dout.download(got.data(), got.size() * 4);
  const double lse0 = std::log(std::exp(0.7) + std::exp(-0.4));
  for (int x = 0; x < kDim; ++x) {
    const double want0 = std::exp(0.7 - lse0) * o[x] + std::exp(-0.4 - lse0) * o[size_t(kRows) * kDim + x];
    EXPECT_NEAR(got[x], want0, 1e-5) << "row 0 column " << x;
    EXPECT_NEAR(got[kDim + x], o[size_t(kRows) * kDim + kDim + x], 1e-5) << "row 1 column " << x;
  }
}

// ------------------------------------------------------------------------ fp8 ----

// The FP8 cases of the three tests below (Fp8BlockDescales and Fp8Softcap add block descales or
// softcap to each: none here has either): lengths off the tiles (1, 17, 1000), causal, windows,
// GQA and MQA, every padded head dim and a d_qk != d_v pair, varlen with empty sequences, paged
// K/V, gathered pages.
std::vector<FwdCase> fp8_cases() {
  std::vector<FwdCase> cases;
  for (int dim : {64, 128, 256})
    for (bool causal : {false, true})
      for (int s : {1, 17, 1000}) {
        FwdCase c;
        c.dtype = FA3_DTYPE_E4M3;
        c.head_dim = dim;
        c.causal = causal;
        c.seqlen_q = s;
        c.seqlen_k = s == 17 ? 300 : s;
        c.batch = 2;
        c.heads_q = 4;
        c.heads_kv = dim == 128 ? 1 : 2;  // MQA, GQA 2:1
        cases.push_back(c);
      }
  FwdCase c;
  c.dtype = FA3_DTYPE_E4M3;
  c.head_dim = 96;  // padded onto d128
  c.seqlen_q = 333;
  c.seqlen_k = 777;
  c.window_left = 100;
  c.window_right = 20;
  cases.push_back(c);
  c = FwdCase();
  c.dtype = FA3_DTYPE_E4M3;
  c.head_dim = 192;  // d_qk 192 / d_v 128 on the d256 tile
  c.head_dim_v = 128;
  c.seqlen_q = 200;
  c.seqlen_k = 900;
  c.causal = true;
  cases.push_back(c);
  c = FwdCase();
  c.dtype = FA3_DTYPE_E4M3;
  c.batch = 4;
  c.heads_q = 8;
  c.heads_kv = 2;
  c.varlen_q = {300, 0, 129, 1};
  c.varlen_k = {517, 77, 129, 0};
  c.causal = true;
  c.guard_rows = 8;
  cases.push_back(c);
  c = FwdCase();
  c.dtype = FA3_DTYPE_E4M3;
  c.batch = 3;
  c.seqlen_q = 64;
  c.seqlen_k = 1000;
  c.page_size = 16;
  c.key_growth = 0.f;
  cases.push_back(c);
  c.page_size = 256;
  c.head_dim = 256;
  cases.push_back(c);
  // Pages that are not a multiple of 16 rows: gathered row by row (warps 1 and 2), V transposed by
  // warp 3 alone (more tiles, block descales and softcap: Fp8GatheredPages). Each head dim's first
  // tile, the d256 128-key (from 1k keys) and d128 192-key (from 4k) tiles, varlen with a one-key sequence,
  // GQA and MQA, masks.
  int n = 0;
  for (int page : {1, 24, 7})
    for (int dim : {64, 128, 256}) {
      c = FwdCase();
      c.dtype = FA3_DTYPE_E4M3;
      c.page_size = page;
      c.head_dim = dim;
      c.heads_q = 4;
      c.heads_kv = n % 2 ? 1 : 2;
      if (page == 7) {  // fixed lengths from 4k keys, unmasked
        c.batch = 2;
        c.seqlen_q = 100;
        c.seqlen_k = 4200;
      } else {
        c.batch = 3;
        c.varlen_k = {700, 1, 300};
        c.seqlen_q = 130;
        c.causal = n % 3 == 0;
        if (n % 3 == 1) c.window_left = 90, c.window_right = 10;
      }
      ++n;
      cases.push_back(c);
    }
  return cases;
}

// Each case against the double reference, its error printed (the FP8 error is stated as measured).
void expect_fp8_matches_reference(const std::vector<FwdCase>& cases) {
  for (const FwdCase& fc : cases) {
    SCOPED_TRACE(fc.name());
    FwdData d = make_fwd_data(fc, true);
    const char* kernel = nullptr;
    ASSERT_TRUE(fa3::kernel_name(d.args, &kernel).ok());
    EXPECT_STREQ(kernel, "hopper");
    ASSERT_TRUE(fa3::forward(d.args).ok());
    FA3_CUDA_CHECK(cudaDeviceSynchronize());
    const Errors e = compare(download_outputs(d), ref::forward(d.prob, d.in), fc.with_lse);
    std::printf("fp8 %-60s %s\n", fc.name().c_str(), e.summary().c_str());
    expect_close(e, fc.name(), fp8_tolerance(fc), fp8_lse_tolerance(fc));
  }
}

// The FP8 kernels (e4m3 Q/K/V, bf16 O, per-(batch, kv head) descales) on those cases, and 4097
// against the oracle.
TEST(FwdGpu, Fp8AgainstReference) {
  FA3_REQUIRE_GPU();
  expect_fp8_matches_reference(fp8_cases());
  FwdCase c;
  c.dtype = FA3_DTYPE_E4M3;
  c.seqlen_q = c.seqlen_k = 4097;
  for (bool causal : {false, true}) {
    c.causal = causal;
    run_fwd_case(c, true, /*use_oracle=*/true);
  }
}

// FP8 block descales (fa3_block_scales: a factor per block of Q rows and of K/V rows, on top of the
// per-head descales; the WithBlockDescales kernels) on the same cases, against the double reference
// on the de-quantized inputs: Q blocks of 1 (per token), 64 and 100 rows (not a tile's), K/V blocks
// of 128 and 256 keys (a factor change every 64- or 128-key block: V's shift of the logits
// between blocks), Q's or K/V's alone; V's factors over 2^-6 .. 2^6 with a zero one; 4097
// against the oracle.
TEST(FwdGpu, Fp8BlockDescales) {
  FA3_REQUIRE_GPU();
  std::vector<FwdCase> cases = fp8_cases();
  const int q_blocks[] = {64, 1, 100, 0, 7}, kv_blocks[] = {128, 256, 128, 256, 0};
  for (size_t i = 0; i < cases.size(); ++i) {
    cases[i].q_block = q_blocks[i % 5];
    cases[i].kv_block = kv_blocks[i % 5];
  }
  expect_fp8_matches_reference(cases);
  std::vector<FwdCase> wide;
  for (int dim : {64, 128, 256})
    for (bool causal : {false, true}) {
      FwdCase w;
      w.dtype = FA3_DTYPE_E4M3;
      w.head_dim = dim;
      w.seqlen_q = 200;
      w.seqlen_k = 1000;
      w.causal = causal;
      w.q_block = 64;
      w.kv_block = 128;
      w.wide_v_factors = true;
      wide.push_back(w);
    }
  expect_fp8_matches_reference(wide);
  FwdCase c;
  c.dtype = FA3_DTYPE_E4M3;
  c.seqlen_q = c.seqlen_k = 4097;
  c.q_block = 64;
  c.kv_block = 384;
  for (bool causal : {false, true}) {
    c.causal = causal;
    run_fwd_case(c, true, /*use_oracle=*/true);
  }
}

// fa3_quantize_fp8 then the FP8 forward with its block descales, against the double reference on
// the 16-bit inputs themselves (so the quantization error counts): Q and K rotated with one seed,
// V not. Prints the error; bounded by what e4m3 allows on these N(0, 1) inputs.
TEST(FwdGpu, Fp8QuantizedPipeline) {
  FA3_REQUIRE_GPU();
  for (int dim : {64, 128, 256})
    for (bool causal : {false, true}) {
      FwdCase c;
      c.batch = 2;
      c.seqlen_q = 300;
      c.seqlen_k = 1000;
      c.heads_q = 4;
      c.heads_kv = 2;
      c.head_dim = dim;
      c.causal = causal;
      SCOPED_TRACE(c.name());
      FwdData d = make_fwd_data(c, true);  // bf16 inputs and their double reference
      const ref::FwdResult want = ref::forward(d.prob, d.in);
      fa3::FwdArgs a = d.args;
      a.dtype = FA3_DTYPE_E4M3;
      a.out_dtype = FA3_DTYPE_BF16;
      struct Operand {
        fa3_tensor t;
        int seqlen, heads;
        bool rotate;
        fa3_block_scales* scales;
      };
      const Operand ops[3] = {{a.q, a.seqlen_q, a.heads_q, true, &a.q_block_descale},
                              {a.k, a.seqlen_k, a.heads_kv, true, &a.k_block_descale},
                              {a.v, a.seqlen_k, a.heads_kv, false, &a.v_block_descale}};
      std::vector<DeviceBuffer> bufs;
      fa3_tensor* targets[3] = {&a.q, &a.k, &a.v};
      for (int i = 0; i < 3; ++i) {
        const Operand& o = ops[i];
        const int blocks = (o.seqlen + 127) / 128;
        bufs.emplace_back(size_t(c.batch) * o.seqlen * o.heads * dim);  // e4m3, contiguous
        bufs.emplace_back(size_t(c.batch) * o.heads * blocks * 4);
        fa3::QuantizeArgs qa;
        qa.in_dtype = FA3_DTYPE_BF16;
        qa.batch = c.batch;
        qa.seqlen = o.seqlen;
        qa.heads = o.heads;
        qa.head_dim = dim;
        qa.in = o.t;
        qa.out = fa3::bshd(bufs[2 * i].get(), o.seqlen, o.heads, dim);
        qa.descale = static_cast<float*>(bufs[2 * i + 1].get());
        qa.descale_batch_stride = int64_t(o.heads) * blocks;
        qa.descale_head_stride = blocks;
        qa.block_size = 128;
        qa.hadamard = o.rotate;
        qa.seed = 2026;
        const Status st = fa3::quantize_fp8(qa);
        ASSERT_TRUE(st.ok()) << st.message();
        *targets[i] = qa.out;
        *o.scales = {qa.descale, qa.descale_batch_stride, blocks, 128, blocks};
      }
      poison_outputs(d);
      const Status st = fa3::forward(a);
      ASSERT_TRUE(st.ok()) << st.message();
      FA3_CUDA_CHECK(cudaDeviceSynchronize());
      const Errors e = compare(download_outputs(d), want, c.with_lse);
      std::printf("fp8 quantized %-50s %s\n", c.name().c_str(), e.summary().c_str());
      expect_close(e, c.name(), kFp8QuantizedTolerance, kFp8QuantizedLseTolerance);
    }
}

// FP8 with softcap (per-head descales, which go inside the tanh: score_mod.cuh) on the FP8 cases,
// caps from near-linear (30) to saturating (0.5, where most scores sit at +-c), against the double
// reference on the de-quantized inputs; descales differ per (batch, kv head), so a tanh that missed
// them, or an exp2 scale that took them a second time, would be off by their ratio. 4097 against
// the oracle.
TEST(FwdGpu, Fp8Softcap) {
  FA3_REQUIRE_GPU();
  std::vector<FwdCase> cases = fp8_cases();
  const float caps[] = {30.f, 5.f, 0.5f};
  for (size_t i = 0; i < cases.size(); ++i) cases[i].softcap = caps[i % 3];
  expect_fp8_matches_reference(cases);
  // With block descales (ScoreMod<true, true, true>: each row's Q factor and each key block's K
  // factor inside the tanh, V's as the logits' shift): Q blocks of 1, 64 and 100 rows, K/V blocks
  // of 128 and 256 keys, Q's or K/V's alone, V's factors over 2^-6 .. 2^6.
  std::vector<FwdCase> blocks = fp8_cases();
  const int q_blocks[] = {64, 1, 100, 0, 7}, kv_blocks[] = {128, 256, 128, 256, 0};
  for (size_t i = 0; i < blocks.size(); ++i) {
    blocks[i].softcap = caps[(i + 1) % 3];
    blocks[i].q_block = q_blocks[i % 5];
    blocks[i].kv_block = kv_blocks[i % 5];
    blocks[i].wide_v_factors = i % 4 == 0 && blocks[i].kv_block > 0;
  }
  expect_fp8_matches_reference(blocks);
  FwdCase c;
  c.dtype = FA3_DTYPE_E4M3;
  c.seqlen_q = c.seqlen_k = 4097;
  c.softcap = 10.f;
  for (bool causal : {false, true}) {
    c.causal = causal;
    run_fwd_case(c, true, /*use_oracle=*/true);
  }
  c.q_block = 64;
  c.kv_block = 384;
  run_fwd_case(c, true, /*use_oracle=*/true);
}

// Gathered pages (not a multiple of 16 rows) on every FP8 tile the dispatch picks: the d256 64-key
// tiles (fixed lengths under 1k keys), d256's masked 128-key tile from 1k keys,
// the d64 192-row tiles (unmasked from 1k queries, masked from 2k), d128's 192-key tile masked; block
// descales (the block-descale tiles, d64's 192-row one included) and softcap with per-head descales.
TEST(FwdGpu, Fp8GatheredPages) {
  FA3_REQUIRE_GPU();
  std::vector<FwdCase> cases;
  auto add = [&](int dim, int page, int q, int k, bool causal, int q_block = 0, int kv_block = 0,
                 float softcap = 0.f) {
    FwdCase c;
    c.dtype = FA3_DTYPE_E4M3;
    c.head_dim = dim;
    c.page_size = page;
    c.batch = 2;
    c.seqlen_q = q;
    c.seqlen_k = k;
    c.causal = causal;
    c.heads_q = 4;
    c.heads_kv = 2;
    c.q_block = q_block;
    c.kv_block = kv_block;
    c.softcap = softcap;
    cases.push_back(c);
  };
  add(256, 1, 150, 777, true);     // 128 x 64, masked under 1k keys
  add(256, 8, 150, 1000, false);   // 128 x 64, unmasked under 1k keys
  add(256, 24, 150, 4200, true);   // 128 x 128, masked from 1k keys
  add(64, 1, 1100, 1300, false);   // 192 x 128, unmasked from 1k queries
  add(64, 7, 2100, 2100, true);    // 192 x 128, masked from 2k
  add(128, 1, 150, 4200, true);    // 128 x 192, masked
  add(128, 24, 150, 1000, true, 64, 128);   // block descales
  add(256, 1, 150, 777, false, 1, 256);
  add(64, 7, 1100, 1300, false, 64, 128);   // d64's 192-row block-descale tile
  add(64, 24, 150, 1000, true, 0, 0, 15.f);  // softcap
  add(256, 1, 150, 4200, false, 0, 0, 30.f);
  FwdCase v;  // varlen queries and keys over gathered pages, a window
  v.dtype = FA3_DTYPE_E4M3;
  v.batch = 3;
  v.page_size = 5;
  v.varlen_q = {70, 0, 129};
  v.varlen_k = {200, 50, 129};
  v.window_left = 60;
  v.window_right = 0;
  cases.push_back(v);
  expect_fp8_matches_reference(cases);
}

// A few small FP8 problems (every head dim, masks, varlen with an empty sequence, GQA): the
// sanitizer's cases (tools/gpu-check.sh), the V transposer's rings included.
TEST(FwdGpu, Fp8SmallCases) {
  FA3_REQUIRE_GPU();
  for (int dim : {64, 128, 256}) {
    FwdCase c;
    c.dtype = FA3_DTYPE_E4M3;
    c.head_dim = dim;
    c.seqlen_q = 150;
    c.seqlen_k = 333;
    c.causal = dim != 128;
    c.heads_q = 4;
    c.heads_kv = 2;
    run_fwd_case(c);
    c.batch = 3;
    c.varlen_q = {70, 0, 129};
    c.varlen_k = {200, 50, 129};
    c.causal = !c.causal;
    run_fwd_case(c);
    c.q_block = 64;  // block descales
    c.kv_block = 128;
    run_fwd_case(c);
    c.softcap = 5.f;  // softcap with block descales, then with per-head descales
    run_fwd_case(c);
    c.q_block = c.kv_block = 0;
    run_fwd_case(c);
    c.softcap = 0.f;  // gathered pages (two gather warps and a lone transposer)
    c.page_size = dim == 128 ? 1 : 24;
    run_fwd_case(c);
  }
  // Fixed lengths of 4200 keys: d256's 128-key tiles (from 1k keys; shorter key sequences take
  // the 64-key tiles), and d128's 192-key tile (from 4k) with per-head descales (block descales
  // stay on the 128-key tile; 4200 = 21 x 192 + 168, a key tail).
  for (int dim : {128, 256}) {
    for (bool causal : {false, true}) {
      FwdCase c;
      c.dtype = FA3_DTYPE_E4M3;
      c.head_dim = dim;
      c.seqlen_q = 150;
      c.seqlen_k = 4200;
      c.causal = causal;
      c.heads_q = 2;
      c.heads_kv = 1;
      run_fwd_case(c);
      c.q_block = 64;
      c.kv_block = 128;
      run_fwd_case(c);
      if (dim == 128) {  // the 192-key tile's K/V paged (boxes of gcd(192, page) rows), a window, GQA 4:1
        c.q_block = c.kv_block = 0;
        c.page_size = causal ? 16 : 256;
        run_fwd_case(c);
        c.page_size = 0;
        c.heads_q = 4;
        c.window_left = 700;
        c.window_right = causal ? -1 : 300;
        run_fwd_case(c);
      }
    }
  }
}


// A negative softmax scale: the Hopper kernels on -Q's copy in the workspace with |scale|
// (append_kv.h), on every path that reads Q: the 16-bit tiles (both dtypes, d64 / d128 / d256,
// the d192 / d128 pair, masks, softcap, tails), packed sequences with guard rows, the decode
// kernel with splits and pack-GQA, a paged cache, e4m3 with per-head and block descales and with
// softcap; Q in BHSD with guard rows. Without the workspace: an error that names it.
TEST(FwdGpu, NegativeScaleOnHopper) {
  FA3_REQUIRE_GPU();
  std::vector<FwdCase> cases;
  auto add = [&](FwdCase c, float scale) {
    c.softmax_scale = scale;
    c.workspace = true;
    cases.push_back(c);
  };
  for (fa3_dtype t : {FA3_DTYPE_BF16, FA3_DTYPE_FP16})
    for (int d : {64, 128, 256}) {
      FwdCase c;
      c.dtype = t;
      c.head_dim = d;
      c.seqlen_q = d == 128 ? 1000 : 17;
      c.seqlen_k = d == 64 ? 4097 : 1000;
      c.heads_q = 4;
      c.heads_kv = d == 256 ? 1 : 2;
      c.causal = d != 64;
      add(c, d == 128 ? -0.5f : -0.08f);
    }
  {
    FwdCase c;
    c.head_dim = 192;
    c.head_dim_v = 128;
    c.seqlen_q = c.seqlen_k = 300;
    c.window_left = 40;
    c.window_right = 7;
    c.layout = Layout::kBHSD;  // (Q's copy from a strided Q)
    c.guard_rows = 5;
    add(c, -0.1f);
    c.layout = Layout::kBSHD;
    c.guard_rows = 0;
    c.head_dim = c.head_dim_v = 64;
    c.window_left = c.window_right = -1;
    c.softcap = 7.f;
    c.causal = true;
    add(c, -0.3f);
  }
  {
    FwdCase c = packed_head_dim_case(128, 128, Layout::kBSHD);  // varlen, empty sequences, guard rows
    c.causal = true;
    add(c, -0.1f);
    c.page_size = 64;
    c.causal = false;
    add(c, -0.1f);
  }
  for (int splits : {0, 1, 5}) {  // the decode kernel, pack-GQA 8:2
    FwdCase c;
    c.batch = 3;
    c.seqlen_q = splits == 5 ? 4 : 1;
    c.seqlen_k = 3000;
    c.heads_q = 8;
    c.heads_kv = 2;
    c.causal = splits == 5;
    c.num_splits = splits;
    add(c, -0.09f);
  }
  {
    FwdCase c;  // e4m3: per-head descales, block descales, softcap
    c.dtype = FA3_DTYPE_E4M3;
    c.seqlen_q = 200;
    c.seqlen_k = 1100;
    c.heads_q = 4;
    c.heads_kv = 2;
    c.head_dim = 256;
    add(c, -0.06f);
    c.head_dim = 128;
    c.causal = true;
    c.q_block = 64;
    c.kv_block = 128;
    add(c, -0.09f);
    c.q_block = c.kv_block = 0;
    c.softcap = 15.f;
    add(c, -0.09f);
  }
  for (const FwdCase& c : cases) {
    EXPECT_EQ(kernel_of(c), "hopper") << c.name();
    run_fwd_case(c, /*expect_hopper=*/true);
  }
  // Without the workspace for -Q's copy: refused, naming it.
  FwdCase c;
  c.softmax_scale = -0.1f;
  FwdData d = make_fwd_data(c);
  const Status st = fa3::forward(d.args);
  EXPECT_EQ(st.code(), FA3_ERROR_INVALID_ARGUMENT) << st.message();
  EXPECT_NE(st.message().find("workspace_bytes"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("negative softmax_scale"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace fa3::test
