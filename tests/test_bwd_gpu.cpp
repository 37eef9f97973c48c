// The backward through the public API (the Hopper kernels and the reference GPU kernels) against
// the double-precision CPU reference: dQ, dK and dV on fresh random inputs, poisoned gradients
// (elements no row owns must keep the poison), every Hopper instantiation by its features,
// lengths that are not tile multiples, unequal lengths, GQA/MQA, windows, softcap, head-dim pairs,
// strided layouts, varlen (packed rows, seqused, empty sequences), and deterministic mode bitwise
// reproducible; and randomised configurations of
// the Hopper backward against the reference GPU backward (itself checked against the CPU above).
//
// Random test environment: FA3_RANDOM_SEED=S (default random, printed), FA3_BWD_RANDOM_CASES=N
// (default 300), FA3_RANDOM_CASE=I (only case I of seed S, as a failure message says).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <chrono>
#include <cstdio>
#include <limits>
#include <map>
#include <random>
#include <tuple>

#include "reference/rounding.h"
#include "src/api/dispatch.h"
#include "tests/gpu_util.h"

namespace fa3::test {
namespace {

uint16_t to_bits(float x, fa3_dtype t) { return t == FA3_DTYPE_BF16 ? ref::to_bf16_bits(x) : ref::to_fp16_bits(x); }
float from_bits(uint16_t b, fa3_dtype t) { return t == FA3_DTYPE_BF16 ? ref::from_bf16_bits(b) : ref::from_fp16_bits(b); }

// A backward problem: the forward's data (run through fa3::forward for O and LSE), dO and the
// three gradient buffers in the layouts of O, Q, K and V.
struct BwdData {
  FwdData f;
  std::vector<std::vector<float>> dout;  // logical, as ref::backward wants it
  std::vector<std::vector<float>> dlse;  // with_dlse: logical ([heads_q][rows] per sequence)
  DeviceBuffer ddo, dq, dk, dv, workspace, dsinks, ddlse;
  BwdArgs args;
};

// with_dlse: a random gradient of the loss w.r.t. LSE (fa3_bwd_params.dlse) in LSE's layout, NaN
// in the rows the sequences do not use (a read of one shows).
BwdData make_bwd_data(const FwdCase& c, int deterministic = 0, bool with_dlse = false) {
  BwdData d;
  FwdCase fc = c;
  fc.with_lse = true;
  fc.workspace = fc.workspace || c.softmax_scale < 0.f;  // (the forward's -Q copy: append_kv.h)
  d.f = make_fwd_data(fc);
  const FwdPlan& P = d.f.plan;
  Status st = fa3::forward(d.f.args);
  EXPECT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(cudaSuccess, cudaDeviceSynchronize());

  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<uint16_t> img(d.f.out.bytes() / 2, 0);
  d.dout.resize(P.batch);
  for (int b = 0; b < P.batch; ++b)
    for (int i = 0; i < P.used_q[b]; ++i)
      for (int h = 0; h < P.heads_q; ++h)
        for (int x = 0; x < P.dv; ++x) {
          const uint16_t bits = to_bits(normal(rng()), c.dtype);
          img[P.o_index(b, i, h, x)] = bits;
          d.dout[b].push_back(from_bits(bits, c.dtype));
        }
  d.ddo = DeviceBuffer(img.size() * 2);
  d.ddo.upload(img.data(), img.size() * 2);
  d.dq = DeviceBuffer(d.f.q.bytes());
  d.dk = DeviceBuffer(d.f.k.bytes());
  d.dv = DeviceBuffer(d.f.v.bytes());
  for (DeviceBuffer* b : {&d.dq, &d.dk, &d.dv}) b->fill_bytes(0xFF);

  BwdArgs& a = d.args;
  a.fwd = d.f.args;
  auto with = [](fa3_tensor t, void* data) {
    t.data = data;
    return t;
  };
  a.dout = with(d.f.args.out, d.ddo.get());
  a.dq = with(d.f.args.q, d.dq.get());
  a.dk = with(d.f.args.k, d.dk.get());
  a.dv = with(d.f.args.v, d.dv.get());
  a.deterministic = deterministic;
  if (with_dlse) {
    std::vector<float> img_lse(P.lse_elems, std::numeric_limits<float>::quiet_NaN());
    d.dlse.resize(P.batch);
    for (int b = 0; b < P.batch; ++b)
      for (int h = 0; h < P.heads_q; ++h)
        for (int i = 0; i < P.used_q[b]; ++i) {
          const float g = normal(rng());
          img_lse[P.lse_index(b, h, i)] = g;
          d.dlse[b].push_back(g);  // [heads_q][rows], the reference's order
        }
    d.ddlse = DeviceBuffer(img_lse.size() * 4);
    d.ddlse.upload(img_lse.data(), img_lse.size() * 4);
    a.dlse = static_cast<const float*>(d.ddlse.get());
  }
  if (c.sinks) {  // the sinks' gradient, poisoned
    d.dsinks = DeviceBuffer(size_t(c.heads_q) * 4);
    d.dsinks.fill_bytes(0xFF);
    a.dsinks = static_cast<float*>(d.dsinks.get());
  }
  size_t bytes = 0;
  st = fa3::workspace_size(a, &bytes);
  EXPECT_TRUE(st.ok()) << st.message();
  d.workspace = DeviceBuffer(std::max<size_t>(bytes, 16));
  d.workspace.fill_bytes(0x7F);  // garbage: the backward must clear what it accumulates into
  a.workspace = d.workspace.get();
  a.workspace_bytes = bytes;
  return d;
}

struct Grads {
  std::vector<uint16_t> dq, dk, dv;  // raw device images
  std::vector<float> dsinks;         // with sinks
};

// reference = true: the reference kernels (src/oracle/oracle_bwd.cu) instead of fa3::backward; their
// scratch fits the workspace the API asks for.
Grads run_bwd(BwdData& d, bool reference = false) {
  // Fresh poison before every launch: a run that writes nothing must not pass on an earlier run's
  // gradients (the determinism tests compare runs with each other).
  for (DeviceBuffer* b : {&d.dq, &d.dk, &d.dv}) b->fill_bytes(0xFF);
  if (d.args.dsinks != nullptr) d.dsinks.fill_bytes(0xFF);
  const Status st = reference ? detail::oracle_bwd(d.args, detail::make_problem(d.args.fwd), nullptr)
                              : fa3::backward(d.args);
  EXPECT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(cudaSuccess, cudaDeviceSynchronize());
  Grads g;
  g.dq.resize(d.dq.bytes() / 2);
  g.dk.resize(d.dk.bytes() / 2);
  g.dv.resize(d.dv.bytes() / 2);
  d.dq.download(g.dq.data(), d.dq.bytes());
  d.dk.download(g.dk.data(), d.dk.bytes());
  d.dv.download(g.dv.data(), d.dv.bytes());
  if (d.args.dsinks != nullptr) {
    g.dsinks.resize(d.dsinks.bytes() / 4);
    d.dsinks.download(g.dsinks.data(), d.dsinks.bytes());
  }
  return g;
}

// The sinks' gradient against the reference, no NaN. dsink_h sums -P_sink D over every row of the
// head, and D = rowsum(dO * O) comes from the forward's 16-bit O (as in every flash backward), a
// ~2e-3 relative error per row; the rows' terms have random signs, so the sum can cancel far below
// its terms and its relative error has a heavy tail (d128, 1000 x 1000: 6e-3 on average, up to
// 2.3e-2 in 12 runs, 2026-12-02). The error is measured against the larger of |dsink| and the size
// of such a sum (ref::BwdResult::dsinks_scale, sqrt of the squared terms' sum), which a wrong factor,
// sign or missing row still exceeds.
void expect_dsinks(const std::vector<float>& got, const std::vector<double>& want, const std::vector<double>& scale,
                   const std::string& name, double tol = 1e-2) {
  ASSERT_EQ(got.size(), want.size()) << name;
  ASSERT_EQ(scale.size(), want.size()) << name;
  double num = 0, den = 0;
  for (size_t h = 0; h < got.size(); ++h) {
    EXPECT_FALSE(std::isnan(got[h])) << name << " dsinks[" << h << "] is NaN";
    num += (got[h] - want[h]) * (got[h] - want[h]);
    den += std::max(want[h] * want[h], scale[h] * scale[h]);
  }
  const double rel = std::sqrt(num / std::max(den, 1e-30));
  std::printf("%-60s dsinks rel_err %.2e\n", name.c_str(), rel);
  EXPECT_LE(rel, tol) << name << " dsinks: relative error";
}

// Relative Frobenius error of one gradient, its worst element against the largest reference one,
// NaNs, and elements written where no row owns them (the poison 0xFFFF changed).
struct GradError {
  double rel = 0, max_abs = 0, max_ref = 0;
  long nan = 0, stray = 0;
};

template <class Index>
GradError grad_error(const std::vector<uint16_t>& img, const std::vector<std::vector<double>>& want,
                     const std::vector<int>& rows, int heads, int dim, fa3_dtype t, Index index) {
  GradError e;
  std::vector<char> owned(img.size(), 0);
  double num = 0, den = 0;
  for (size_t b = 0; b < want.size(); ++b)
    for (int i = 0; i < rows[b]; ++i)
      for (int h = 0; h < heads; ++h)
        for (int x = 0; x < dim; ++x) {
          const int64_t at = index(int(b), i, h, x);
          owned[at] = 1;
          const double got = from_bits(img[at], t), ref = want[b][(size_t(i) * heads + h) * dim + x];
          if (std::isnan(got)) ++e.nan;
          num += (got - ref) * (got - ref);
          den += ref * ref;
          e.max_abs = std::max(e.max_abs, std::fabs(got - ref));
          e.max_ref = std::max(e.max_ref, std::fabs(ref));
        }
  for (size_t i = 0; i < img.size(); ++i)
    if (!owned[i] && img[i] != 0xFFFF) ++e.stray;
  e.rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  return e;
}

void expect_grad(const GradError& e, const char* what, const std::string& name, double tol) {
  EXPECT_EQ(e.nan, 0) << name << " " << what << ": NaNs";
  EXPECT_EQ(e.stray, 0) << name << " " << what << ": writes outside the owned elements";
  EXPECT_LE(e.rel, tol) << name << " " << what << ": relative error " << e.rel << " (max abs " << e.max_abs
                        << " of " << e.max_ref << ")";
  // A few wrong elements must not hide in the norm.
  EXPECT_LE(e.max_abs, 8 * tol * std::max(e.max_ref, 1e-3) + 1e-3) << name << " " << what << ": max abs " << e.max_abs;
}

// dQ, dK, dV (and dsinks) of run g against the double reference of d's inputs.
void expect_grads(const BwdData& d, const Grads& g, const FwdCase& c, double tol) {
  const ref::BwdResult want = ref::backward(d.f.prob, d.f.in, d.dout, 0, d.dlse.empty() ? nullptr : &d.dlse);
  const FwdPlan& P = d.f.plan;
  const fa3_dtype t = c.dtype;
  expect_grad(grad_error(g.dq, want.dq, P.used_q, P.heads_q, P.dqk, t,
                         [&](int b, int i, int h, int x) { return P.q_index(b, i, h, x); }),
              "dq", c.name(), tol);
  expect_grad(grad_error(g.dk, want.dk, P.used_k, P.heads_kv, P.dqk, t,
                         [&](int b, int j, int h, int x) { return P.k_index(b, j, h, x); }),
              "dk", c.name(), tol);
  expect_grad(grad_error(g.dv, want.dv, P.used_k, P.heads_kv, P.dv, t,
                         [&](int b, int j, int h, int x) { return P.v_index(b, j, h, x); }),
              "dv", c.name(), tol);
  if (c.sinks) expect_dsinks(g.dsinks, want.dsinks, want.dsinks_scale, c.name(), tol);
}

void check_bwd_case(const FwdCase& c, const char* want_kernel, double tol = 1e-2, int deterministic = 0) {
  SCOPED_TRACE(c.name() + (deterministic ? " deterministic" : ""));
  BwdData d = make_bwd_data(c, deterministic);
  const char* name = nullptr;
  ASSERT_TRUE(fa3::kernel_name(d.args, &name).ok());
  EXPECT_STREQ(want_kernel, name) << c.name();
  expect_grads(d, run_bwd(d), c, tol);
}

// Every Hopper backward instantiation (dtype x tile x mask x softcap; varlen below), by its
// features, in both modes (deterministic mode orders the dQ adds in other code: the dQ writer's
// waits for d64 / d128, the gate warps for the query-rows d256 tile).
TEST(BwdGpu, EveryHopperInstantiation) {
  FA3_REQUIRE_GPU();
  for (fa3_dtype t : {FA3_DTYPE_BF16, FA3_DTYPE_FP16})
    for (int dim : {64, 128, 256})
      for (int deterministic : {0, 1})
        for (bool causal : {false, true})
          for (float cap : {0.f, 5.f}) {
            FwdCase c;
            c.dtype = t;
            c.head_dim = dim;
            c.seqlen_q = 300;
            c.seqlen_k = 300;
            c.causal = causal;
            c.softcap = cap;
            check_bwd_case(c, "hopper", 1e-2, deterministic);
          }
}

TEST(BwdGpu, SeqlenGrid) {
  FA3_REQUIRE_GPU();
  for (int dim : {128, 256})
    for (FwdCase c : seqlen_grid_cases()) {
      c.head_dim = dim;
      check_bwd_case(c, "hopper");
    }
}

TEST(BwdGpu, UnequalLengthsGqaWindows) {
  FA3_REQUIRE_GPU();
  for (auto [sq, sk] : {std::pair{17, 1000}, std::pair{1000, 17}, std::pair{300, 129}}) {
    FwdCase c;
    c.batch = 2;
    c.seqlen_q = sq;
    c.seqlen_k = sk;
    c.heads_q = 8;
    c.heads_kv = 1;  // MQA (rows that see no key when sq > sk: dQ = 0)
    c.causal = true;
    check_bwd_case(c, "hopper");
    c.causal = false;
    c.window_left = 33;
    c.window_right = 7;
    c.heads_kv = 2;  // GQA 4:1
    c.head_dim = 64;
    check_bwd_case(c, "hopper");
  }
}

TEST(BwdGpu, HeadDimsAndLayouts) {
  FA3_REQUIRE_GPU();
  FwdCase c;
  c.seqlen_q = 200;
  c.seqlen_k = 333;
  c.heads_q = 4;
  c.heads_kv = 2;
  for (int dim : {40, 80, 96, 128, 136, 160, 192, 256}) {
    c.head_dim = dim;
    c.layout = dim == 80 || dim == 192 ? Layout::kBHSD : Layout::kBSHDPadded;
    check_bwd_case(c, "hopper");
  }
  c.layout = Layout::kBSHD;
  c.causal = true;
  // d_qk != d_v on the d128 and d256 tiles (DeepSeek's 192 / 128 among them).
  for (auto [dqk, dv] : {std::pair{128, 64}, std::pair{64, 128}, std::pair{192, 128}, std::pair{256, 64},
                         std::pair{96, 256}}) {
    c.head_dim = dqk;
    c.head_dim_v = dv;
    check_bwd_case(c, "hopper");
  }
}

// A broadcast dO (an input, so zero strides are legal): one head's gradient for every query head.
// TMA maps take the zero head stride as it is.
TEST(BwdGpu, BroadcastDout) {
  FA3_REQUIRE_GPU();
  for (int dim : {64, 128}) {
    FwdCase c;
    c.head_dim = dim;
    c.seqlen_q = 300;
    c.seqlen_k = 200;
    c.heads_q = 4;
    c.heads_kv = 2;
    c.causal = true;
    SCOPED_TRACE(c.name());
    BwdData d = make_bwd_data(c);
    d.args.dout.head_stride = 0;  // every head reads head 0's rows
    const FwdPlan& P = d.f.plan;
    for (int b = 0; b < P.batch; ++b)
      for (int i = 0; i < P.used_q[b]; ++i)
        for (int h = 1; h < P.heads_q; ++h)
          for (int x = 0; x < P.dv; ++x)
            d.dout[b][(size_t(i) * P.heads_q + h) * P.dv + x] = d.dout[b][size_t(i) * P.heads_q * P.dv + x];
    const char* name = nullptr;
    ASSERT_TRUE(fa3::kernel_name(d.args, &name).ok());
    EXPECT_STREQ("hopper", name);
    expect_grads(d, run_bwd(d), c, 1e-2);
  }
}

// Packed Q/dO and K/V (cu_seqlens_q/k): lengths 0, 1, 17, tile edges, s_q != s_k within a
// sequence, every mask, GQA 8:1 and MQA, softcap, head-dim pairs, guard rows inside and after the
// packed rows (a sequence's last blocks read the next one's rows: they must add nothing).
TEST(BwdGpu, VarlenPacked) {
  FA3_REQUIRE_GPU();
  int n = 0;
  for (const VarlenLengths& l : varlen_length_sets())
    for (int dim : {64, 128})
      for (bool causal : {false, true}) {
        FwdCase c;
        c.batch = static_cast<int>(l.q.size());
        c.varlen_q = l.q;
        c.varlen_k = l.k;
        c.head_dim = dim;
        c.heads_q = n % 2 ? 8 : 4;
        c.heads_kv = n % 2 ? 1 : 2;
        c.causal = causal;
        if (!causal) std::tie(c.window_left, c.window_right) = kVarlenWindows[n % 5];
        c.guard_rows = n % 2 ? 77 : 0;
        c.dtype = n % 4 == 3 ? FA3_DTYPE_FP16 : FA3_DTYPE_BF16;
        c.softcap = n % 3 == 2 ? 8.f : 0.f;
        ++n;
        check_bwd_case(c, "hopper");
      }
  for (auto [dqk, dv] : {std::pair{96, 96}, std::pair{128, 64}, std::pair{40, 120}, std::pair{256, 256},
                         std::pair{192, 128}})
    for (Layout layout : {Layout::kBSHDPadded, Layout::kBHSD}) {
      FwdCase c = packed_head_dim_case(dqk, dv, layout);
      c.causal = dqk == 128 || dqk == 192;
      c.softcap = dqk == 256 ? 10.f : 0.f;
      check_bwd_case(c, "hopper");
    }
}

// seqused_q / seqused_k in each layout (the forward's cases: dense rows past them hold finite data
// that must add nothing), and sequences without queries or keys.
TEST(BwdGpu, VarlenSequsedAndEmptySequences) {
  FA3_REQUIRE_GPU();
  for (bool causal : {false, true}) {
    SCOPED_TRACE(causal ? "causal" : "no mask");
    for (const FwdCase& c : seqused_cases(causal)) check_bwd_case(c, "hopper");
    FwdCase c;
    c.causal = causal;
    c.batch = 3;
    c.varlen_q = {0, 0, 0};  // no query at all: dK = dV = 0
    c.varlen_k = {10, 0, 5};
    check_bwd_case(c, "hopper");
    c.varlen_q = {5, 130, 1};  // queries, but no key anywhere: dQ = 0
    c.varlen_k = {0, 0, 0};
    c.guard_rows = 130;
    check_bwd_case(c, "hopper");
    c.varlen_q = {0, 300, 0};
    c.varlen_k = {300, 0, 1};
    check_bwd_case(c, "hopper");
  }
}

// Many short sequences (about a tenth of them empty): every CTA past its sequence's keys leaves,
// every workspace block belongs to one sequence.
TEST(BwdGpu, VarlenManySequences) {
  FA3_REQUIRE_GPU();
  for (bool causal : {false, true}) {
    FwdCase c;
    c.batch = 100;
    c.varlen_q = random_lengths(c.batch, 0, 150);
    c.varlen_k = random_lengths(c.batch, 0, 150);
    for (int b = 0; b < c.batch; b += 10) c.varlen_q[b] = 0;
    for (int b = 5; b < c.batch; b += 10) c.varlen_k[b] = 0;
    c.heads_q = 4;
    c.heads_kv = 1;
    c.head_dim = causal ? 128 : 64;
    c.causal = causal;
    c.guard_rows = 64;
    check_bwd_case(c, "hopper");
  }
}

// A negative softmax scale: the Hopper backward on -Q's copy in the workspace with |scale|, dQ's
// sign taken back in the postprocess (append_kv.h), on each tile (d64, d128, d256, the d192 / d128
// pair), with softcap, windows, GQA and packed sequences, in both modes.
// d_qk 192 / d_v 128 with softcap and a negative scale (once the reference backward's alone).
FwdCase negative_scale_case() {
  FwdCase c;
  c.head_dim = 192;
  c.head_dim_v = 128;
  c.seqlen_q = 150;
  c.seqlen_k = 190;
  c.softcap = 3.f;
  c.softmax_scale = -0.05f;
  return c;
}

TEST(BwdGpu, NegativeScale) {
  FA3_REQUIRE_GPU();
  FwdCase c = negative_scale_case();
  check_bwd_case(c, "hopper");
  c.window_left = 20;
  c.window_right = 0;
  c.head_dim = c.head_dim_v = 64;
  check_bwd_case(c, "hopper");
  c = FwdCase();
  c.seqlen_q = 1000;
  c.seqlen_k = 517;
  c.heads_q = 8;
  c.heads_kv = 2;
  c.causal = true;
  c.softmax_scale = -0.2f;
  for (int det : {0, 1}) check_bwd_case(c, "hopper", 1e-2, det);
  c.head_dim = 256;
  c.causal = false;
  c.dtype = FA3_DTYPE_FP16;
  check_bwd_case(c, "hopper");
  c = packed_head_dim_case(128, 128, Layout::kBSHD);
  c.causal = true;
  c.softmax_scale = -0.1f;
  check_bwd_case(c, "hopper");
}

// The reference backward, which no API call reaches now but the long-sequence tests below use as
// their oracle, against the CPU: the d192 / d128 pair with softcap, a window, sinks, packed
// sequences, negative scales.
TEST(BwdGpu, ReferenceKernelsAgainstCpu) {
  FA3_REQUIRE_GPU();
  std::vector<FwdCase> cases;
  FwdCase c = negative_scale_case();
  cases.push_back(c);
  c.window_left = 20;
  c.window_right = 0;
  c.head_dim = c.head_dim_v = 64;
  c.softcap = 0.f;
  c.sinks = true;
  cases.push_back(c);
  c = packed_head_dim_case(128, 128, Layout::kBSHD);
  c.causal = true;
  cases.push_back(c);
  for (const FwdCase& r : cases) {
    SCOPED_TRACE(r.name());
    BwdData d = make_bwd_data(r);
    expect_grads(d, run_bwd(d, /*reference=*/true), r, 1e-2);
  }
}

// LSE's own gradient (fa3_bwd_params.dlse: a loss that uses LSE): dQ/dK/dV (and dsinks) against the
// reference's gradient through O and LSE together, on every backward tile (d64, d128, d256), causal
// rows without a key, softcap, GQA, packed sequences with seqused and empty ones, sinks, a negative
// scale, the deterministic mode (bitwise reproducible). The dLSE entries of rows no
// sequence uses are NaN. dV does not depend on dLSE; dQ must (checked against the run without).
TEST(BwdGpu, LseGradient) {
  FA3_REQUIRE_GPU();
  std::vector<std::pair<FwdCase, const char*>> cases;
  for (int d : {64, 128, 256}) {
    FwdCase c;
    c.head_dim = c.head_dim_v = d;
    c.seqlen_q = 333;
    c.seqlen_k = 517;
    c.heads_q = 4;
    c.heads_kv = d == 128 ? 1 : 4;
    cases.push_back({c, "hopper"});
  }
  {
    FwdCase c;
    c.seqlen_q = 300;  // causal rows without a key (LSE -inf: no gradient from dLSE)
    c.seqlen_k = 100;
    c.causal = true;
    c.softcap = 10.f;
    c.dtype = FA3_DTYPE_FP16;
    cases.push_back({c, "hopper"});
    c.sinks = true;  // the same rows with a sink: LSE = sink, dsink takes their dLSE
    c.softcap = 0.f;
    cases.push_back({c, "hopper"});
  }
  {
    FwdCase c = packed_head_dim_case(128, 128, Layout::kBSHD);
    c.causal = true;
    c.seqused_q = {10, 0, 150, 1, 100};
    cases.push_back({c, "hopper"});
  }
  {
    FwdCase c;
    c.seqlen_q = 150;
    c.seqlen_k = 190;
    c.softmax_scale = -0.05f;
    c.sinks = true;
    cases.push_back({c, "hopper"});
  }
  for (const auto& [c, kernel] : cases)
    for (int det : {0, 1}) {
      if (det && std::string(kernel) != "hopper") continue;
      SCOPED_TRACE(c.name() + (det ? " deterministic" : ""));
      BwdData d = make_bwd_data(c, det, /*with_dlse=*/true);
      const char* name = nullptr;
      ASSERT_TRUE(fa3::kernel_name(d.args, &name).ok());
      EXPECT_STREQ(kernel, name);
      const Grads g = run_bwd(d);
      expect_grads(d, g, c, 1e-2);
      if (det) EXPECT_TRUE(run_bwd(d).dq == g.dq) << "dq differs between deterministic runs";
      d.args.dlse = nullptr;
      const Grads g0 = run_bwd(d);
      EXPECT_TRUE(g0.dv == g.dv) << "dV moved with dLSE";
      EXPECT_FALSE(g0.dq == g.dq) << "dQ did not move with dLSE";
    }
}

// Attention sinks: dQ/dK/dV through the LSE that holds the sink, and the sinks' own gradient
// (its kernel after the preprocess), on the Hopper backward (dense, rows
// without keys, GQA, d256, varlen with empty sequences and seqused, a negative scale);
// always bitwise reproducible.
TEST(BwdGpu, SinksGradient) {
  FA3_REQUIRE_GPU();
  std::vector<std::pair<FwdCase, const char*>> cases;
  {
    FwdCase c;
    c.sinks = true;
    c.heads_q = 8;
    c.heads_kv = 2;
    for (int s : {1, 17, 1000}) {
      c.seqlen_q = c.seqlen_k = s;
      cases.push_back({c, "hopper"});
    }
    c.seqlen_q = 700;  // causal rows without a key: LSE = sink, O = 0, D = 0
    c.seqlen_k = 129;
    c.causal = true;
    c.head_dim = 256;
    cases.push_back({c, "hopper"});
    c.head_dim = 64;
    c.dtype = FA3_DTYPE_FP16;
    c.causal = false;
    c.window_left = 5;
    c.window_right = 0;
    cases.push_back({c, "hopper"});
  }
  {
    FwdCase c = packed_head_dim_case(128, 128, Layout::kBSHD);
    c.sinks = true;
    c.causal = true;
    cases.push_back({c, "hopper"});
    c.seqused_q = {10, 0, 150, 1, 100};
    cases.push_back({c, "hopper"});
  }
  {
    FwdCase c;
    c.sinks = true;
    c.seqlen_q = 150;
    c.seqlen_k = 190;
    c.softmax_scale = -0.05f;
    cases.push_back({c, "hopper"});
  }
  // One key and a sink: a row's dS = p (1 - p) dO.V, where p is the key's probability, and D =
  // dO . O comes from the forward's bf16 O: its rounding (2^-9) is amplified by p / (1 - p) in dS
  // (7 at p = 0.88). Measured 1.15e-2 on dQ (H200, 2026-12-02, racecheck run of this test); a
  // property of a bf16 O, not of the kernel. Longer rows average it away.
  for (const auto& [c, kernel] : cases) check_bwd_case(c, kernel, c.seqlen_k == 1 ? 3e-2 : 1e-2);
  for (int det : {0, 1}) {  // the sinks' sum has a fixed order in either mode
    FwdCase c;
    c.sinks = true;
    c.batch = 3;
    c.seqlen_q = c.seqlen_k = 2000;
    c.heads_q = 4;
    c.heads_kv = 1;
    BwdData d = make_bwd_data(c, det);
    const Grads first = run_bwd(d);
    for (int rep = 0; rep < 3; ++rep) {
      d.workspace.fill_bytes(0x7F);
      d.dsinks.fill_bytes(0xFF);
      EXPECT_TRUE(run_bwd(d).dsinks == first.dsinks) << c.name() << " dsinks differ on run " << rep + 2;
    }
  }
}

// Repeated runs of the deterministic mode: FA3_BWD_DETERMINISM_RUNS (default 100; the sanitizer
// runs take fewer).
int determinism_runs() {
  const char* env = std::getenv("FA3_BWD_DETERMINISM_RUNS");
  return env ? std::max(2, std::atoi(env)) : 100;
}

// Runs d's deterministic backward determinism_runs() times (the workspace refilled with garbage in
// between), expects bitwise identical gradients, and returns the first run's.
Grads run_reproducibly(BwdData& d, const FwdCase& c) {
  const Grads first = run_bwd(d);
  for (int rep = 0, runs = determinism_runs(); rep + 1 < runs; ++rep) {
    d.workspace.fill_bytes(0x7F);
    const Grads again = run_bwd(d);
    EXPECT_TRUE(again.dq == first.dq) << c.name() << " dq differs on run " << rep + 2;
    EXPECT_TRUE(again.dk == first.dk) << c.name() << " dk differs on run " << rep + 2;
    EXPECT_TRUE(again.dv == first.dv) << c.name() << " dv differs on run " << rep + 2;
  }
  return first;
}

// Deterministic mode: bitwise identical gradients over repeated runs (the workspace refilled with
// garbage in between), and still correct.
TEST(BwdGpu, DeterministicIsBitwiseReproducible) {
  FA3_REQUIRE_GPU();
  // Each dQ order (bwd_params.h): rotating (unmasked, key blocks <= query blocks; also with one kv
  // head), decreasing (causal), increasing (unmasked with more key blocks than query blocks), each
  // at d256 too.
  struct Shape {
    int dim, sq, sk;
    bool causal;
    int heads_kv;
  };
  for (const Shape& sh : {Shape{64, 2048, 2048, false, 2}, Shape{128, 2048, 2048, true, 2}, Shape{128, 300, 2100, false, 2},
                          Shape{64, 1500, 1000, true, 2}, Shape{256, 1500, 1500, true, 2}, Shape{256, 1024, 1024, false, 2},
                          Shape{128, 2100, 2100, false, 1}, Shape{256, 300, 2100, false, 2}}) {
    FwdCase c;
    c.head_dim = sh.dim;
    c.seqlen_q = sh.sq;
    c.seqlen_k = sh.sk;
    c.heads_q = 8;
    c.heads_kv = sh.heads_kv;
    c.causal = sh.causal;
    BwdData d = make_bwd_data(c, 1);
    expect_grads(d, run_reproducibly(d, c), c, 1e-2);
  }
}

// A gradient image in the double reference's layout ([sequence][(row * heads + head) * dim + x]),
// so that grad_error can hold one run's gradients to another's.
template <class Index>
std::vector<std::vector<double>> as_reference(const std::vector<uint16_t>& img, const std::vector<int>& rows, int heads,
                                              int dim, fa3_dtype t, Index index) {
  std::vector<std::vector<double>> r(rows.size());
  for (size_t b = 0; b < rows.size(); ++b) {
    r[b].resize(size_t(rows[b]) * heads * dim);
    for (int i = 0; i < rows[b]; ++i)
      for (int h = 0; h < heads; ++h)
        for (int x = 0; x < dim; ++x) r[b][(size_t(i) * heads + h) * dim + x] = from_bits(img[index(int(b), i, h, x)], t);
  }
  return r;
}

// More key blocks than SMs (the increasing order, over two waves of CTAs: the second wave's key
// blocks wait for the first's) at d256, where the query-rows tile's gate warps order the adds;
// too large for the double reference, so it is held to the default mode's gradients (tested
// against the reference elsewhere) within the tests' bound.
TEST(BwdGpu, DeterministicOverTwoWavesOfKeyBlocks) {
  FA3_REQUIRE_GPU();
  int sms = 0;
  ASSERT_EQ(cudaSuccess, cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  FwdCase c;
  c.head_dim = 256;
  c.seqlen_q = c.seqlen_k = (sms + 6) * 80;  // 80 keys per CTA (BwdQueryRowsConfig)
  c.heads_q = 2;
  c.heads_kv = 1;
  BwdData d = make_bwd_data(c, 1);
  const Grads first = run_reproducibly(d, c);
  d.args.deterministic = 0;
  const Grads unordered = run_bwd(d);
  const FwdPlan& P = d.f.plan;
  auto q_at = [&](int b, int i, int h, int x) { return P.q_index(b, i, h, x); };
  auto k_at = [&](int b, int j, int h, int x) { return P.k_index(b, j, h, x); };
  auto v_at = [&](int b, int j, int h, int x) { return P.v_index(b, j, h, x); };
  const fa3_dtype t = c.dtype;
  expect_grad(grad_error(first.dq, as_reference(unordered.dq, P.used_q, P.heads_q, P.dqk, t, q_at), P.used_q, P.heads_q,
                         P.dqk, t, q_at),
              "dq against the default mode", c.name(), 1e-2);
  expect_grad(grad_error(first.dk, as_reference(unordered.dk, P.used_k, P.heads_kv, P.dqk, t, k_at), P.used_k,
                         P.heads_kv, P.dqk, t, k_at),
              "dk against the default mode", c.name(), 1e-2);
  expect_grad(grad_error(first.dv, as_reference(unordered.dv, P.used_k, P.heads_kv, P.dv, t, v_at), P.used_k, P.heads_kv,
                         P.dv, t, v_at),
              "dv against the default mode", c.name(), 1e-2);
}

// Varlen: causal takes the descending order; unmasked the rotation per sequence (sequence 0: 1500
// keys on 1500 queries) or, with more key blocks than query blocks, the descending order (sequence
// 2: 2000 keys on 700 queries). CTAs past a sequence's keys add nothing and are waited for by nobody.
TEST(BwdGpu, DeterministicVarlenIsBitwiseReproducible) {
  FA3_REQUIRE_GPU();
  struct Shape {
    int dim;
    bool causal;
  };
  for (const Shape& sh : {Shape{128, false}, Shape{256, false}, Shape{64, true}}) {
    FwdCase c;
    c.batch = 4;
    c.varlen_q = {1500, 0, 700, 129};
    c.varlen_k = {1500, 300, 2000, 0};
    c.head_dim = sh.dim;
    c.heads_q = 8;
    c.heads_kv = 2;
    c.causal = sh.causal;
    BwdData d = make_bwd_data(c, 1);
    expect_grads(d, run_reproducibly(d, c), c, 1e-2);
  }
}

// One random configuration the Hopper backward serves (head dims <= 256).
FwdCase random_bwd_case(std::mt19937& g, bool* deterministic) {
  auto uni = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(g); };
  auto chance = [&](double p) { return std::bernoulli_distribution(p)(g); };
  auto log_len = [&](int hi) { return std::max(1, int(std::exp(std::uniform_real_distribution<double>(0, std::log(hi))(g)))); };
  FwdCase c;
  c.dtype = chance(0.7) ? FA3_DTYPE_BF16 : FA3_DTYPE_FP16;
  c.head_dim = chance(0.6) ? 64 << uni(0, 2) : 8 * uni(1, 32);
  c.head_dim_v = chance(0.7) ? c.head_dim : 8 * uni(1, 32);
  c.heads_kv = uni(1, 3);
  c.heads_q = c.heads_kv * (1 << uni(0, 3));
  c.batch = uni(1, 3);
  c.seqlen_q = log_len(1500);
  c.seqlen_k = chance(0.4) ? c.seqlen_q : log_len(1500);
  const int mask = uni(0, 9);
  if (mask < 4) {
    c.causal = true;
  } else if (mask < 6) {
    c.window_left = chance(0.8) ? uni(0, 300) : -1;
    c.window_right = c.window_left < 0 || chance(0.8) ? uni(0, 300) : -1;
  }
  if (chance(0.25)) c.softcap = std::uniform_real_distribution<float>(2.f, 30.f)(g);
  const int layout = uni(0, 2);
  c.layout = layout == 0 ? Layout::kBSHD : layout == 1 ? Layout::kBSHDPadded : Layout::kBHSD;
  *deterministic = chance(0.3);
  // Keep the reference kernels' work per case small: batch * heads * sq * sk * (d_qk + d_v).
  while (double(c.batch) * c.heads_q * c.seqlen_q * c.seqlen_k * (c.head_dim + c.head_dim_v) > 1.5e9) {
    c.seqlen_q = std::max(1, c.seqlen_q * 3 / 4);
    c.seqlen_k = std::max(1, c.seqlen_k * 3 / 4);
  }
  // Varlen, in each of its layouts: packed Q and K, packed Q with dense K and seqused_k, dense rows
  // with seqused_q / seqused_k, packed with seqused on top; lengths up to the dense ones, some 0.
  if (chance(0.35)) {
    auto lengths = [&](int hi) {
      std::vector<int> v = random_lengths(c.batch, 0, hi, g);
      for (int& x : v)
        if (chance(0.1)) x = 0;
      return v;
    };
    auto used = [&](const std::vector<int>& rows) {
      std::vector<int> v(rows.size());
      for (size_t b = 0; b < rows.size(); ++b) v[b] = chance(0.5) ? rows[b] : uni(0, rows[b]);
      return v;
    };
    const int kind = uni(0, 3);
    if (kind == 0 || kind == 3) {
      c.varlen_q = lengths(c.seqlen_q);
      c.varlen_k = lengths(c.seqlen_k);
      if (kind == 3) {
        c.seqused_q = used(c.varlen_q);
        c.seqused_k = used(c.varlen_k);
      }
    } else if (kind == 1) {
      c.varlen_q = lengths(c.seqlen_q);
      c.seqused_k = used(std::vector<int>(c.batch, c.seqlen_k));
    } else {
      if (chance(0.7)) c.seqused_q = used(std::vector<int>(c.batch, c.seqlen_q));
      c.seqused_k = used(std::vector<int>(c.batch, c.seqlen_k));
    }
    if (chance(0.5)) c.guard_rows = uni(1, 130);
  }
  return c;
}

// The Hopper backward and the reference kernels on the same inputs: each gradient within 1e-2.
std::string compare_with_reference_kernels(const FwdCase& c, bool deterministic) {
  BwdData d = make_bwd_data(c, deterministic);
  const char* name = nullptr;
  if (!fa3::kernel_name(d.args, &name).ok() || std::string(name) != "hopper")
    return std::string("not on the Hopper backward: ") + (name ? name : "?");
  const Grads got = run_bwd(d);
  DeviceBuffer rq(d.dq.bytes()), rk(d.dk.bytes()), rv(d.dv.bytes());
  // Rows the reference does not own are downloaded too: defined bytes (compute-sanitizer's initcheck).
  for (DeviceBuffer* r : {&rq, &rk, &rv}) r->fill_bytes(0xFF);
  fa3_bwd_params b = d.args;
  b.dq.data = rq.get();
  b.dk.data = rk.get();
  b.dv.data = rv.get();
  const Status st = detail::oracle_bwd(b, detail::make_problem(b.fwd), nullptr);  // its scratch fits the workspace
  if (!st.ok()) return "reference kernels: " + st.message();
  if (cudaDeviceSynchronize() != cudaSuccess) return "CUDA error after the reference kernels";
  const FwdPlan& P = d.f.plan;
  std::string why;
  auto check = [&](const char* what, const std::vector<uint16_t>& img, const DeviceBuffer& ref_buf,
                   const std::vector<int>& rows, int heads, int dim, auto index) {
    std::vector<uint16_t> ref_img(ref_buf.bytes() / 2);
    ref_buf.download(ref_img.data(), ref_buf.bytes());
    std::vector<std::vector<double>> want(P.batch);
    for (int bb = 0; bb < P.batch; ++bb)
      for (int i = 0; i < rows[bb]; ++i)
        for (int h = 0; h < heads; ++h)
          for (int x = 0; x < dim; ++x) want[bb].push_back(from_bits(ref_img[index(bb, i, h, x)], c.dtype));
    const GradError e = grad_error(img, want, rows, heads, dim, c.dtype, index);
    const bool ok = e.nan == 0 && e.stray == 0 && e.rel <= 1e-2 && e.max_abs <= 8e-2 * std::max(e.max_ref, 1e-3) + 1e-3;
    if (!ok)
      why += std::string(what) + ": rel " + std::to_string(e.rel) + " max abs " + std::to_string(e.max_abs) + " of " +
             std::to_string(e.max_ref) + " nan " + std::to_string(e.nan) + " stray " + std::to_string(e.stray) + "; ";
  };
  check("dq", got.dq, rq, P.used_q, P.heads_q, P.dqk, [&](int bb, int i, int h, int x) { return P.q_index(bb, i, h, x); });
  check("dk", got.dk, rk, P.used_k, P.heads_kv, P.dqk, [&](int bb, int j, int h, int x) { return P.k_index(bb, j, h, x); });
  check("dv", got.dv, rv, P.used_k, P.heads_kv, P.dv, [&](int bb, int j, int h, int x) { return P.v_index(bb, j, h, x); });
  return why;
}

// Long packed sequences (lengths 0..3000, the CPU reference would take minutes): against the
// reference kernels, which the tests above check against the CPU.
TEST(BwdGpu, VarlenLongAgainstReferenceKernels) {
  FA3_REQUIRE_GPU();
  const std::vector<int> q = {3000, 0, 1000, 2500, 1, 17}, k = {3000, 300, 2500, 1000, 3000, 0};
  int n = 0;
  for (int dim : {64, 128, 256})
    for (int mask = 0; mask < 3; ++mask) {
      FwdCase c;
      c.dtype = n % 2 ? FA3_DTYPE_FP16 : FA3_DTYPE_BF16;
      c.batch = static_cast<int>(q.size());
      c.varlen_q = q;
      c.varlen_k = k;
      c.head_dim = dim;
      c.heads_q = 8;
      c.heads_kv = dim == 64 ? 1 : 2;
      c.causal = mask == 1;
      if (mask == 2) c.window_left = 500, c.window_right = 64;
      c.softcap = n == 4 ? 30.f : 0.f;
      c.guard_rows = 200;
      const std::string why = compare_with_reference_kernels(c, n % 3 == 0);
      EXPECT_TRUE(why.empty()) << c.name() << ": " << why;
      ++n;
    }
}

TEST(BwdRandomGpu, AgreesWithReferenceKernelsOnRandomConfigs) {
  FA3_REQUIRE_GPU();
  long long seed_ll = 0, cases = 300, only = -1;
  const unsigned seed = env_long("FA3_RANDOM_SEED", &seed_ll) ? unsigned(seed_ll) : std::random_device{}();
  env_long("FA3_BWD_RANDOM_CASES", &cases);
  const bool single = env_long("FA3_RANDOM_CASE", &only);
  std::printf("[fa3 bwd random] FA3_RANDOM_SEED=%u FA3_BWD_RANDOM_CASES=%lld\n", seed, cases);
  std::fflush(stdout);
  const std::mt19937 saved = rng();
  const auto t0 = std::chrono::steady_clock::now();
  std::map<std::string, int> covered;
  int failures = 0, run = 0;
  for (long long i = single ? only : 0; i < (single ? only + 1 : cases) && failures < 10; ++i) {
    std::seed_seq seq{seed, unsigned(i), 0xb00du};
    std::mt19937 engine(seq);
    bool deterministic = false;
    const FwdCase c = random_bwd_case(engine, &deterministic);
    rng().seed(engine());  // this case's inputs depend on (seed, i) only
    covered[c.causal ? "causal" : c.window_left >= 0 || c.window_right >= 0 ? "window" : "no mask"]++;
    if (c.softcap > 0) covered["softcap"]++;
    if (c.head_dim != c.head_dim_v) covered["d_qk != d_v"]++;
    if (c.heads_q != c.heads_kv) covered["gqa/mqa"]++;
    if (!c.varlen_q.empty() || !c.varlen_k.empty() || !c.seqused_q.empty() || !c.seqused_k.empty()) covered["varlen"]++;
    if (deterministic) covered["deterministic"]++;
    ++run;
    const std::string why = compare_with_reference_kernels(c, deterministic);
    if (why.empty()) continue;
    ++failures;
    ADD_FAILURE() << "random backward case " << i << " failed; reproduce with FA3_RANDOM_SEED=" << seed
                  << " FA3_RANDOM_CASE=" << i << "\n  " << c.name() << (deterministic ? " deterministic" : "")
                  << "\n  FwdCase c; " << c.repro() << "\n  " << why;
  }
  rng() = saved;
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("[fa3 bwd random] %d cases in %.1f s, %d failed; seed %u; covered:", run, secs, failures, seed);
  for (const auto& [what, n] : covered) std::printf(" %s %d,", what.c_str(), n);
  std::printf("\n");
}

}  // namespace
}  // namespace fa3::test
