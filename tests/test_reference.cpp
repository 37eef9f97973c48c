// Tests of the double-precision CPU reference (reference/reference.h) and of the host dtype
// emulation (reference/rounding.h). Everything else is checked against these, so they are tested
// against independent definitions: a naive attention written here, closed forms, finite
// differences and an exhaustive nearest-value rounding oracle. Inputs are fresh random numbers
// every run; the seed is printed on failure.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "reference/quantize.h"
#include "src/fp8/fp8_format.h"

#include "reference/reference.h"
#include "reference/rounding.h"

using fa3::ref::Inputs;
using fa3::ref::Problem;
using Tensors = std::vector<std::vector<double>>;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

unsigned fresh_seed() { return std::random_device{}(); }
#define TRACE_SEED(seed) SCOPED_TRACE("random seed " + std::to_string(seed))

Problem make_problem(std::vector<int> sq, std::vector<int> sk, int hq, int hkv, int dqk, int dv) {
  Problem p;
  p.batch = static_cast<int>(sq.size());
  p.seqlen_q = std::move(sq);
  p.seqlen_k = std::move(sk);
  p.heads_q = hq;
  p.heads_kv = hkv;
  p.head_dim_qk = dqk;
  p.head_dim_v = dv;
  return p;
}

std::vector<float> randn(size_t n, std::mt19937& rng, float amp = 1.0f) {
  std::normal_distribution<float> dist(0.0f, amp);
  std::vector<float> x(n);
  for (float& v : x) v = dist(rng);
  return x;
}

Inputs random_inputs(const Problem& p, std::mt19937& rng, float amp = 1.0f) {
  Inputs in;
  for (int b = 0; b < p.batch; ++b) {
    in.q.push_back(randn(size_t(p.seqlen_q[b]) * p.heads_q * p.head_dim_qk, rng, amp));
    in.k.push_back(randn(size_t(p.seqlen_k[b]) * p.heads_kv * p.head_dim_qk, rng, amp));
    in.v.push_back(randn(size_t(p.seqlen_k[b]) * p.heads_kv * p.head_dim_v, rng));
  }
  return in;
}

std::vector<std::vector<float>> random_dout(const Problem& p, std::mt19937& rng) {
  std::vector<std::vector<float>> d;
  for (int b = 0; b < p.batch; ++b)
    d.push_back(randn(size_t(p.seqlen_q[b]) * p.heads_q * p.head_dim_v, rng));
  return d;
}

// Naive attention straight from the definition: full score matrix per (batch, head), mask written
// in terms of the distance to the aligned diagonal, two-pass max / sum softmax.
struct Naive {
  Tensors o, lse;
};

Naive naive_forward(const Problem& p, const Inputs& in) {
  const int hq = p.heads_q, hkv = p.heads_kv, dqk = p.head_dim_qk, dv = p.head_dim_v;
  const double scale = p.softmax_scale != 0 ? p.softmax_scale : 1.0 / std::sqrt(double(dqk));
  Naive r;
  for (int b = 0; b < p.batch; ++b) {
    const int sq = p.seqlen_q[b], sk = p.seqlen_k[b];
    r.o.emplace_back(size_t(sq) * hq * dv, 0.0);
    r.lse.emplace_back(size_t(hq) * sq, 0.0);
    for (int h = 0; h < hq; ++h) {
      const int hk = h * hkv / hq;
      std::vector<std::vector<double>> s(sq, std::vector<double>(sk, -kInf));
      for (int i = 0; i < sq; ++i)
        for (int j = 0; j < sk; ++j) {
          const int ahead = j - (i + sk - sq);  // > 0: key lies in the future of query i
          if (p.causal && ahead > 0) continue;
          if (p.window_right >= 0 && ahead > p.window_right) continue;
          if (p.window_left >= 0 && -ahead > p.window_left) continue;
          double dot = 0;
          for (int x = 0; x < dqk; ++x)
            dot += double(in.q[b][(i * hq + h) * dqk + x]) * in.k[b][(j * hkv + hk) * dqk + x];
          s[i][j] = p.softcap > 0 ? p.softcap * std::tanh(scale * dot / p.softcap) : scale * dot;
        }
      for (int i = 0; i < sq; ++i) {
        const double m = *std::max_element(s[i].begin(), s[i].end());  // -inf if sk == 0 too
        double& lse = r.lse[b][h * sq + i];
        if (sk == 0 || m == -kInf) {
          lse = -kInf;
          continue;
        }
        double sum = 0;
        for (int j = 0; j < sk; ++j) sum += std::exp(s[i][j] - m);
        lse = m + std::log(sum);
        for (int j = 0; j < sk; ++j)
          for (int x = 0; x < dv; ++x)
            r.o[b][(i * hq + h) * dv + x] +=
                std::exp(s[i][j] - m) / sum * in.v[b][(j * hkv + hk) * dv + x];
      }
    }
  }
  return r;
}

// Reports the first mismatch and the number of mismatches instead of one line per element.
void expect_close(const Tensors& got, const Tensors& want, double tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t bad = 0;
  std::string first;
  for (size_t b = 0; b < got.size(); ++b) {
    ASSERT_EQ(got[b].size(), want[b].size()) << what << "[" << b << "]";
    for (size_t e = 0; e < got[b].size(); ++e) {
      const double g = got[b][e], w = want[b][e];
      const bool ok = std::isinf(w) ? g == w : std::abs(g - w) <= tol * (1 + std::abs(w));
      if (!ok && bad++ == 0)
        first = what + "[" + std::to_string(b) + "][" + std::to_string(e) + "]: got " +
                std::to_string(g) + ", want " + std::to_string(w);
    }
  }
  EXPECT_EQ(bad, 0u) << "first mismatch " << first;
}

void expect_equal(const Tensors& got, const Tensors& want, const std::string& what) {
  expect_close(got, want, 0.0, what);
}

struct Case {
  std::string name;
  std::vector<int> sq, sk;
  int hq, hkv, dqk, dv;
  bool causal = false;
  int wl = -1, wr = -1;
  double softcap = 0, scale = 0;
  float amp = 1.0f;
};

Problem problem_of(const Case& c) {
  Problem p = make_problem(c.sq, c.sk, c.hq, c.hkv, c.dqk, c.dv);
  p.causal = c.causal;
  p.window_left = c.wl;
  p.window_right = c.wr;
  p.softcap = c.softcap;
  p.softmax_scale = c.scale;
  return p;
}

// --- forward ------------------------------------------------------------------------------------

TEST(ReferenceForward, MatchesNaiveDefinition) {
  const unsigned seed = fresh_seed();
  TRACE_SEED(seed);
  std::mt19937 rng(seed);
  const std::vector<Case> cases = {
      {"square", {17}, {17}, 2, 2, 16, 16},
      {"sq<sk causal, dv != dqk", {5}, {17}, 2, 1, 8, 12, true},
      {"sq>sk causal", {17}, {5}, 2, 2, 8, 8, true},
      {"gqa 4:1", {9}, {13}, 8, 2, 16, 8},
      {"window", {17}, {17}, 2, 1, 8, 8, false, 3, 2},
      {"causal + window, sq<sk", {7}, {19}, 2, 2, 8, 8, true, 4, -1},
      {"window left only, sq>sk", {19}, {7}, 1, 1, 8, 8, false, 2, -1},
      {"softcap, explicit scale", {11}, {17}, 2, 2, 16, 16, false, -1, -1, 2.0, 0.3, 2.0f},
      {"varlen", {1, 17, 6}, {17, 1, 9}, 2, 2, 8, 8, false, -1, 1},
      {"seqlen 1", {1}, {1}, 3, 1, 4, 4},
      {"everything", {6, 17, 1}, {9, 17, 3}, 4, 1, 8, 16, true, 5, -1, 3.0, 0, 2.0f},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const Problem p = problem_of(c);
    const Inputs in = random_inputs(p, rng, c.amp);
    const auto got = fa3::ref::forward(p, in, 2);
    const Naive want = naive_forward(p, in);
    expect_close(got.o, want.o, 1e-12, "o");
    expect_close(got.lse, want.lse, 1e-12, "lse");
  }
}

// All keys equal: every visible key has the same score s, so attention is uniform over the
// visible keys and O is the mean of their V rows, LSE = s + log(count).
TEST(ReferenceForward, IdenticalKeysGiveUniformAttention) {
  const unsigned seed = fresh_seed();
  TRACE_SEED(seed);
  std::mt19937 rng(seed);
  for (const int window_left : {-1, 3}) {
    const double cap = window_left < 0 ? 0.0 : 1.5;
    SCOPED_TRACE("window_left " + std::to_string(window_left));
    Problem p = make_problem({12}, {12}, 2, 1, 8, 5);
    p.causal = true;
    p.window_left = window_left;
    p.softcap = cap;
    Inputs in = random_inputs(p, rng);
    for (int j = 1; j < 12; ++j)
      std::copy(in.k[0].begin(), in.k[0].begin() + 8, in.k[0].begin() + j * 8);
    const auto r = fa3::ref::forward(p, in);
    for (int h = 0; h < 2; ++h)
      for (int i = 0; i < 12; ++i) {
        const int lo = window_left < 0 ? 0 : std::max(0, i - window_left);
        const int count = i - lo + 1;
        double dot = 0;
        for (int x = 0; x < 8; ++x) dot += double(in.q[0][(i * 2 + h) * 8 + x]) * in.k[0][x];
        double s = dot / std::sqrt(8.0);
        if (cap > 0) s = cap * std::tanh(s / cap);
        EXPECT_NEAR(r.lse[0][h * 12 + i], s + std::log(double(count)), 1e-12);
        for (int x = 0; x < 5; ++x) {
          double mean = 0;
          for (int j = lo; j <= i; ++j) mean += in.v[0][j * 5 + x];
          EXPECT_NEAR(r.o[0][(i * 2 + h) * 5 + x], mean / count, 1e-12);
        }
      }
  }
}

// A window of width zero leaves only the key on the aligned diagonal: O is exactly that V row and
// LSE is exactly its score.
TEST(ReferenceForward, SingleVisibleKey) {
  const unsigned seed = fresh_seed();
  TRACE_SEED(seed);
  std::mt19937 rng(seed);
  for (const int sk : {9, 14}) {
    for (const double cap : {0.0, 2.5}) {
      Problem p = make_problem({9}, {sk}, 1, 1, 6, 4);
      p.window_left = p.window_right = 0;
      p.softcap = cap;
      p.softmax_scale = 0.7;
      const Inputs in = random_inputs(p, rng, 2.0f);
      const auto r = fa3::ref::forward(p, in);
      for (int i = 0; i < 9; ++i) {
        const int j = i + sk - 9;
        double dot = 0;
        for (int x = 0; x < 6; ++x) dot += double(in.q[0][i * 6 + x]) * in.k[0][j * 6 + x];
        const double s = cap > 0 ? cap * std::tanh(0.7 * dot / cap) : 0.7 * dot;
        EXPECT_NEAR(r.lse[0][i], s, 1e-13 * (1 + std::abs(s))) << "row " << i;
        for (int x = 0; x < 4; ++x) EXPECT_EQ(r.o[0][i * 4 + x], double(in.v[0][j * 4 + x]));
      }
    }
  }
}

// Bottom-right causal alignment with more queries than keys: the first sq - sk rows see nothing.
TEST(ReferenceForward, CausalRowsWithoutKeys) {
  const unsigned seed = fresh_seed();
  TRACE_SEED(seed);
  std::mt19937 rng(seed);
  Problem p = make_problem({10}, {4}, 2, 2, 8, 8);
  p.causal = true;
  const Inputs in = random_inputs(p, rng);
  const auto r = fa3::ref::forward(p, in);
  for (int h = 0; h < 2; ++h) {
    for (int i = 0; i < 6; ++i) {
      EXPECT_EQ(r.lse[0][h * 10 + i], -kInf) << "row " << i;
      for (int x = 0; x < 8; ++x) EXPECT_EQ(r.o[0][(i * 2 + h) * 8 + x], 0.0);
    }
    // Row 6 is the first to see a key, and sees only key 0.
    for (int x = 0; x < 8; ++x) EXPECT_EQ(r.o[0][(6 * 2 + h) * 8 + x], double(in.v[0][h * 8 + x]));
    EXPECT_TRUE(std::isfinite(r.lse[0][h * 10 + 9]));
  }
  // Empty rows also receive no gradient.
  const auto g = fa3::ref::backward(p, in, random_dout(p, rng));
  for (size_t e = 0; e < size_t(6) * 2 * 8; ++e) EXPECT_EQ(g.dq[0][e], 0.0);
}

TEST(ReferenceForward, WindowEdgeCases) {
  const unsigned seed = fresh_seed();
  TRACE_SEED(seed);
  std::mt19937 rng(seed);
  {  // left = right = 0 on a square problem: only the diagonal.
    Problem p = make_problem({6}, {6}, 1, 1, 4, 4);
    p.window_left = p.window_right = 0;
    for (int i = 0; i < 6; ++i)
      for (int j = -1; j <= 6; ++j) EXPECT_EQ(fa3::ref::key_visible(p, 0, i, j), i == j);
    p.causal = true;
    p.window_left = 1;
    p.window_right = -1;
    for (int i = 0; i < 6; ++i)
      for (int j = 0; j < 6; ++j)
        EXPECT_EQ(fa3::ref::key_visible(p, 0, i, j), j == i || j == i - 1) << i << "," << j;
  }
  {  // left = right = 0 with sq > sk: the diagonal is left of key 0 for the first rows.
    Problem p = make_problem({8}, {3}, 1, 1, 4, 4);
    p.window_left = p.window_right = 0;
    const Inputs in = random_inputs(p, rng);
    const auto r = fa3::ref::forward(p, in);
    for (int i = 0; i < 8; ++i) {
      if (i < 5) {
        EXPECT_EQ(r.lse[0][i], -kInf);
        for (int x = 0; x < 4; ++x) EXPECT_EQ(r.o[0][i * 4 + x], 0.0);
      } else {
        for (int x = 0; x < 4; ++x) EXPECT_EQ(r.o[0][i * 4 + x], double(in.v[0][(i - 5) * 4 + x]));
      }
    }
  }
  {  // Non-causal window_right = 1 with sq > sk: rows 0..5 have their whole window before key 0.
    Problem p = make_problem({10}, {3}, 1, 1, 4, 4);
    p.window_right = 1;
    const Inputs in = random_inputs(p, rng);
    const auto r = fa3::ref::forward(p, in);
    for (int i = 0; i < 10; ++i) EXPECT_EQ(std::isinf(r.lse[0][i]), i < 6) << "row " << i;
  }
}

TEST(ReferenceForward, GqaEqualsReplicatedKv) {
  const unsigned seed = fresh_seed();
  TRACE_SEED(seed);
  std::mt19937 rng(seed);
  const int hq = 8, hkv = 2, group = hq / hkv, d = 8, sq = 7, sk = 11;
  Problem p = make_problem({sq}, {sk}, hq, hkv, d, d);
  p.causal = true;
  const Inputs in = random_inputs(p, rng);
  Problem rp = p;
  rp.heads_kv = hq;
  Inputs rin;
  rin.q = in.q;
  rin.k.emplace_back(size_t(sk) * hq * d);
  rin.v.emplace_back(size_t(sk) * hq * d);
  for (int j = 0; j < sk; ++j)
    for (int h = 0; h < hq; ++h)
      for (int x = 0; x < d; ++x) {
        rin.k[0][(j * hq + h) * d + x] = in.k[0][(j * hkv + h / group) * d + x];
        rin.v[0][(j * hq + h) * d + x] = in.v[0][(j * hkv + h / group) * d + x];
      }
  const auto a = fa3::ref::forward(p, in), b = fa3::ref::forward(rp, rin);
  expect_equal(a.o, b.o, "o");
  expect_equal(a.lse, b.lse, "lse");

  // Backward: dQ is identical; GQA dK/dV are the sums of the replicated heads' gradients.
  const auto dout = random_dout(p, rng);
  const auto ga = fa3::ref::backward(p, in, dout), gb = fa3::ref::backward(rp, rin, dout);
  expect_close(ga.dq, gb.dq, 1e-13, "dq");
  Tensors dk_sum(1, std::vector<double>(size_t(sk) * hkv * d, 0.0)), dv_sum = dk_sum;
  for (int j = 0; j < sk; ++j)
    for (int h = 0; h < hq; ++h)
      for (int x = 0; x < d; ++x) {
        dk_sum[0][(j * hkv + h / group) * d + x] += gb.dk[0][(j * hq + h) * d + x];
        dv_sum[0][(j * hkv + h / group) * d + x] += gb.dv[0][(j * hq + h) * d + x];
      }
  expect_close(ga.dk, dk_sum, 1e-12, "dk");
  expect_close(ga.dv, dv_sum, 1e-12, "dv");
}

// Each batch element is an independent problem; the arithmetic per element is the same, so the
// results must be bitwise identical.
TEST(ReferenceForward, VarlenEqualsSeparateProblems) {
  const unsigned seed = fresh_seed();
  TRACE_SEED(seed);
  std::mt19937 rng(seed);
  const std::vector<int> sq = {5, 17, 1};
  for (const auto& sk : {std::vector<int>{5, 17, 1}, std::vector<int>{9, 12, 3}}) {
    Problem p = make_problem(sq, sk, 4, 2, 8, 6);
    p.causal = true;
    const Inputs in = random_inputs(p, rng);
    const auto dout = random_dout(p, rng);
    const auto f = fa3::ref::forward(p, in);
    const auto g = fa3::ref::backward(p, in, dout);
    for (int b = 0; b < 3; ++b) {
      SCOPED_TRACE("batch element " + std::to_string(b));
      Problem one = make_problem({sq[b]}, {sk[b]}, 4, 2, 8, 6);
      one.causal = true;
      const Inputs in1{{in.q[b]}, {in.k[b]}, {in.v[b]}};
      const auto f1 = fa3::ref::forward(one, in1);
      const auto g1 = fa3::ref::backward(one, in1, {dout[b]});
      expect_equal({f.o[b]}, f1.o, "o");
      expect_equal({f.lse[b]}, f1.lse, "lse");
      expect_equal({g.dq[b]}, g1.dq, "dq");
      expect_equal({g.dk[b]}, g1.dk, "dk");
      expect_equal({g.dv[b]}, g1.dv, "dv");
    }
  }
}

TEST(ReferenceForward, ThreadCountDoesNotChangeResults) {
  const unsigned seed = fresh_seed();
  TRACE_SEED(seed);
  std::mt19937 rng(seed);
  Problem p = make_problem({40, 23}, {37, 50}, 4, 2, 16, 8);
  p.causal = true;
  p.softcap = 4.0;
  const Inputs in = random_inputs(p, rng);
  const auto dout = random_dout(p, rng);
  const auto f1 = fa3::ref::forward(p, in, 1), f3 = fa3::ref::forward(p, in, 3);
  expect_equal(f3.o, f1.o, "o");
  expect_equal(f3.lse, f1.lse, "lse");
  const auto g1 = fa3::ref::backward(p, in, dout, 1), g3 = fa3::ref::backward(p, in, dout, 3);
  expect_equal(g3.dq, g1.dq, "dq");
  expect_equal(g3.dk, g1.dk, "dk");
  expect_equal(g3.dv, g1.dv, "dv");
}

// --- backward -----------------------------------------------------------------------------------

double loss(const Problem& p, const Inputs& in, const std::vector<std::vector<float>>& dout) {
  const auto f = fa3::ref::forward(p, in, 1);
  double l = 0;
  for (size_t b = 0; b < f.o.size(); ++b)
    for (size_t e = 0; e < f.o[b].size(); ++e) l += f.o[b][e] * dout[b][e];
  return l;
}

// Central differences of a loss with an absolute step h = 2^-18 (~4e-6; inputs are O(1)) at six
// random entries of each of Q, K, V, against `grads(in)` (the analytic gradient, recomputed after the
// probed entries are snapped to multiples of h, so that x +- h are exact floats and the quotient is
// truly central). Observed error ~1e-9 absolute (rounding in L over 2h, plus h^2 terms), well inside
// the 1e-6 relative tolerance.
template <class Grads, class Loss>
void expect_matches_central_differences(const Problem& p, Inputs& in, std::mt19937& rng, Grads&& grads, Loss&& loss_of) {
  const float h = std::ldexp(1.0f, -18);
  struct Probe {
    int tensor, b;
    size_t e;
  };
  std::vector<std::vector<float>>* tensors[3] = {&in.q, &in.k, &in.v};
  std::vector<Probe> probes;
  for (int t = 0; t < 3; ++t)
    for (int n = 0; n < 6; ++n) {
      const int b = std::uniform_int_distribution<int>(0, p.batch - 1)(rng);
      auto& xb = (*tensors[t])[b];
      const size_t e = std::uniform_int_distribution<size_t>(0, xb.size() - 1)(rng);
      xb[e] = std::round(xb[e] / h) * h;
      probes.push_back({t, b, e});
    }
  const fa3::ref::BwdResult g = grads(in);
  const Tensors* gs[3] = {&g.dq, &g.dk, &g.dv};
  double gmax[3] = {0, 0, 0};
  for (int t = 0; t < 3; ++t)
    for (const auto& gb : *gs[t])
      for (double v : gb) gmax[t] = std::max(gmax[t], std::abs(v));
  for (const Probe& pr : probes) {
    float& x = (*tensors[pr.tensor])[pr.b][pr.e];
    const float x0 = x;
    x = x0 + h;
    const double lp = loss_of(in);
    x = x0 - h;
    const double lm = loss_of(in);
    x = x0;
    const double fd = (lp - lm) / (2.0 * double(h));
    const double an = (*gs[pr.tensor])[pr.b][pr.e];
    EXPECT_NEAR(an, fd, 1e-6 * std::max(std::abs(an), 0.01 * gmax[pr.tensor]))
        << "d"
        << "qkv"[pr.tensor] << "[" << pr.b << "][" << pr.e << "]";
  }
}

const std::vector<Case>& finite_difference_cases() {
  static const std::vector<Case> cases = {
      {"plain", {6}, {7}, 2, 2, 8, 6},
      {"causal varlen with empty rows", {7, 3}, {4, 5}, 2, 2, 8, 8, true},
      {"softcap + window", {8}, {8}, 2, 1, 8, 8, false, 2, 1, 1.0, 0, 1.5f},
      {"gqa 4:1 causal", {5}, {9}, 4, 1, 8, 4, true},
  };
  return cases;
}

// L = sum(O * dO).
TEST(ReferenceBackward, MatchesFiniteDifferences) {
  const unsigned seed = fresh_seed();
  TRACE_SEED(seed);
  std::mt19937 rng(seed);
  for (const Case& c : finite_difference_cases()) {
    SCOPED_TRACE(c.name);
    const Problem p = problem_of(c);
    Inputs in = random_inputs(p, rng, c.amp);
    const auto dout = random_dout(p, rng);
    expect_matches_central_differences(
        p, in, rng, [&](const Inputs& x) { return fa3::ref::backward(p, x, dout); },
        [&](const Inputs& x) { return loss(p, x, dout); });
  }
}

// LSE's own gradient: L = sum(O * dO) + sum(LSE * dLSE) over the rows with a visible key (a row
// without one has LSE -inf, or the sink's: it takes none from dLSE through Q/K/V), on the cases
// above with and without sinks (whose gradient moves too).
double loss_with_lse(const Problem& p, const Inputs& in, const std::vector<std::vector<float>>& dout,
                     const std::vector<std::vector<float>>& dlse) {
  const auto f = fa3::ref::forward(p, in, 1);
  double l = 0;
  for (size_t b = 0; b < f.o.size(); ++b) {
    for (size_t e = 0; e < f.o[b].size(); ++e) l += f.o[b][e] * dout[b][e];
    for (size_t r = 0; r < f.lse[b].size(); ++r)
      if (std::isfinite(f.lse[b][r])) l += f.lse[b][r] * dlse[b][r];
  }
  return l;
}

TEST(ReferenceBackward, LseGradientMatchesFiniteDifferences) {
  const unsigned seed = fresh_seed();
  TRACE_SEED(seed);
  std::mt19937 rng(seed);
  for (bool sinks : {false, true})
    for (const Case& c : finite_difference_cases()) {
      SCOPED_TRACE(c.name + (sinks ? " with sinks" : ""));
      Problem p = problem_of(c);
      if (sinks) p.sinks.assign(p.heads_q, 0.5);
      Inputs in = random_inputs(p, rng, c.amp);
      const auto dout = random_dout(p, rng);
      std::vector<std::vector<float>> dlse(p.batch);
      std::normal_distribution<float> nd(0.f, 1.f);
      for (int b = 0; b < p.batch; ++b)
        for (int r = 0; r < p.heads_q * p.seqlen_q[b]; ++r) dlse[b].push_back(nd(rng));
      expect_matches_central_differences(
          p, in, rng, [&](const Inputs& x) { return fa3::ref::backward(p, x, dout, 0, &dlse); },
          [&](const Inputs& x) { return loss_with_lse(p, x, dout, dlse); });
      const auto g = fa3::ref::backward(p, in, dout, 0, &dlse), g0 = fa3::ref::backward(p, in, dout);
      expect_close(g.dv, g0.dv, 0, "dv (dLSE does not reach V)");
      double moved = 0;  // and dLSE does reach Q (a test that cannot fail otherwise)
      for (size_t b = 0; b < g.dq.size(); ++b)
        for (size_t e = 0; e < g.dq[b].size(); ++e) moved = std::max(moved, std::abs(g.dq[b][e] - g0.dq[b][e]));
      EXPECT_GT(moved, 1e-3);
      if (sinks) {
        const double hs = std::ldexp(1.0, -18);
        for (int head = 0; head < p.heads_q; ++head) {
          Problem pp = p, pm = p;
          pp.sinks[head] += hs;
          pm.sinks[head] -= hs;
          const double fd = (loss_with_lse(pp, in, dout, dlse) - loss_with_lse(pm, in, dout, dlse)) / (2 * hs);
          EXPECT_NEAR(g.dsinks[head], fd, 1e-6 * std::max(1.0, std::abs(fd))) << "dsinks[" << head << "]";
        }
      }
    }
}

// --- attention sinks ----------------------------------------------------------------------------

// A sink is a key with no value whose score is the sink: one more head-dim column, 1 in every q
// row and sink / scale in that extra key (0 in the real keys), V = 0 there. Unmasked MHA, so each
// query head has its own extra key in every sequence.
TEST(ReferenceSinks, EqualAnExtraKeyWithoutValue) {
  const unsigned seed = fresh_seed();
  TRACE_SEED(seed);
  std::mt19937 rng(seed);
  const int hq = 3, d = 8, dv = 6;
  const double scale = 0.3;
  Problem p = make_problem({5, 1, 9}, {7, 3, 1}, hq, hq, d, dv);
  p.softmax_scale = scale;
  p.sinks = {-1.0, 0.5, 4.0};
  const Inputs in = random_inputs(p, rng);
  Problem wide = make_problem({5, 1, 9}, {8, 4, 2}, hq, hq, d + 1, dv);
  wide.softmax_scale = scale;
  Inputs win;
  for (int b = 0; b < p.batch; ++b) {
    std::vector<float> q, k, v;
    for (int i = 0; i < p.seqlen_q[b]; ++i)
      for (int h = 0; h < hq; ++h) {
        for (int x = 0; x < d; ++x) q.push_back(in.q[b][(size_t(i) * hq + h) * d + x]);
        q.push_back(1.f);
      }
    for (int h = 0; h < hq; ++h) {  // key 0: the sink
      for (int x = 0; x < d; ++x) k.push_back(0.f);
      k.push_back(static_cast<float>(p.sinks[h] / scale));
      for (int x = 0; x < dv; ++x) v.push_back(0.f);
    }
    for (int j = 0; j < p.seqlen_k[b]; ++j)
      for (int h = 0; h < hq; ++h) {
        for (int x = 0; x < d; ++x) k.push_back(in.k[b][(size_t(j) * hq + h) * d + x]);
        k.push_back(0.f);
        for (int x = 0; x < dv; ++x) v.push_back(in.v[b][(size_t(j) * hq + h) * dv + x]);
      }
    win.q.push_back(q);
    win.k.push_back(k);
    win.v.push_back(v);
  }
  const auto got = fa3::ref::forward(p, in, 2), want = fa3::ref::forward(wide, win, 2);
  // (sink / scale * scale is the sink up to float rounding of sink / scale)
  expect_close(got.o, want.o, 1e-6, "o");
  expect_close(got.lse, want.lse, 1e-6, "lse");
}

// A row that sees no key: O = 0, LSE = the sink; a sink of -inf is no sink.
TEST(ReferenceSinks, RowsWithoutKeysAndMinusInfinity) {
  const unsigned seed = fresh_seed();
  TRACE_SEED(seed);
  std::mt19937 rng(seed);
  Problem p = make_problem({6}, {2}, 2, 1, 8, 8);
  p.causal = true;  // rows 0..3 see no key
  const Inputs in = random_inputs(p, rng);
  const auto plain = fa3::ref::forward(p, in);
  p.sinks = {-kInf, -kInf};
  const auto none = fa3::ref::forward(p, in);
  expect_close(none.o, plain.o, 0, "o with -inf sinks");
  expect_close(none.lse, plain.lse, 0, "lse with -inf sinks");
  p.sinks = {1.5, -2.0};
  const auto r = fa3::ref::forward(p, in);
  for (int h = 0; h < 2; ++h)
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(r.lse[0][size_t(h) * 6 + i], p.sinks[h]);
      for (int x = 0; x < 8; ++x) EXPECT_EQ(r.o[0][(size_t(i) * 2 + h) * 8 + x], 0.0);
    }
  // A visible row: O shrinks by e^LSE / (e^LSE + e^sink), LSE grows to log(e^LSE + e^sink).
  for (int h = 0; h < 2; ++h)
    for (int i = 4; i < 6; ++i) {
      const double l0 = plain.lse[0][size_t(h) * 6 + i], l1 = r.lse[0][size_t(h) * 6 + i];
      EXPECT_NEAR(l1, std::log(std::exp(l0) + std::exp(p.sinks[h])), 1e-12);
      for (int x = 0; x < 8; ++x)
        EXPECT_NEAR(r.o[0][(size_t(i) * 2 + h) * 8 + x], plain.o[0][(size_t(i) * 2 + h) * 8 + x] * std::exp(l0 - l1),
                    1e-12);
    }
}

// dL/dsink by central differences (L = sum(O * dO)), and dQ/dK/dV with sinks as in
// ReferenceBackward.MatchesFiniteDifferences.
TEST(ReferenceSinks, GradientMatchesFiniteDifferences) {
  const unsigned seed = fresh_seed();
  TRACE_SEED(seed);
  std::mt19937 rng(seed);
  const double h = std::ldexp(1.0, -18);
  for (bool causal : {false, true}) {
    Problem p = make_problem({7, 3}, {4, 5}, 4, 2, 8, 6);
    p.causal = causal;
    p.sinks = {0.25, -1.0, 2.0, 0.0};
    const Inputs in = random_inputs(p, rng);
    const auto dout = random_dout(p, rng);
    const auto g = fa3::ref::backward(p, in, dout);
    ASSERT_EQ(g.dsinks.size(), 4u);
    for (int head = 0; head < 4; ++head) {
      Problem pp = p, pm = p;
      pp.sinks[head] += h;
      pm.sinks[head] -= h;
      const double fd = (loss(pp, in, dout) - loss(pm, in, dout)) / (2 * h);
      EXPECT_NEAR(g.dsinks[head], fd, 1e-6 * std::max(1.0, std::abs(fd))) << "dsinks[" << head << "]";
    }
    Inputs moved = in;  // one probe of dQ: the sinks change P, so dQ must see them
    const float step = std::ldexp(1.0f, -18);
    float& x = moved.q[0][3];
    x = std::round(x / step) * step;
    const auto g2 = fa3::ref::backward(p, moved, dout);
    const float x0 = x;
    x = x0 + step;
    const double lp = loss(p, moved, dout);
    x = x0 - step;
    const double lm = loss(p, moved, dout);
    EXPECT_NEAR(g2.dq[0][3], (lp - lm) / (2.0 * step), 1e-6 * std::max(1.0, std::abs(g2.dq[0][3])));
  }
  Problem bad = make_problem({2}, {2}, 2, 1, 8, 8);
  bad.sinks = {1.0};
  EXPECT_THROW(fa3::ref::forward(bad, random_inputs(bad, rng)), std::invalid_argument);
}

// --- paged KV -----------------------------------------------------------------------------------

TEST(ReferencePaged, GatherReassemblesShuffledPages) {
  const unsigned seed = fresh_seed();
  TRACE_SEED(seed);
  std::mt19937 rng(seed);
  const int num_pages = 9, page_size = 4, heads = 2, d = 3, seqlen = 22;  // 6 pages, last partial
  const int row = heads * d;
  const std::vector<float> seq = randn(size_t(seqlen) * row, rng);
  std::vector<int> table(num_pages);
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), rng);
  std::vector<float> pool(size_t(num_pages) * page_size * row, 1e30f);  // unused slots: poison
  for (int t = 0; t < seqlen; ++t)
    for (int e = 0; e < row; ++e)
      pool[(size_t(table[t / page_size]) * page_size + t % page_size) * row + e] = seq[t * row + e];
  EXPECT_EQ(fa3::ref::gather_paged(pool.data(), page_size, heads, d, table.data(), seqlen), seq);
}

// --- validation ---------------------------------------------------------------------------------

TEST(ReferenceValidate, RejectsInconsistentSizes) {
  std::mt19937 rng(1);
  const Problem good = make_problem({3, 4}, {5, 2}, 4, 2, 8, 6);
  const Inputs in = random_inputs(good, rng);
  EXPECT_NO_THROW(fa3::ref::validate(good, in));

  auto expect_reject = [&](const Problem& p, const Inputs& x, const std::string& mention) {
    try {
      fa3::ref::validate(p, x);
      ADD_FAILURE() << "accepted; expected a complaint about " << mention;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(mention), std::string::npos) << e.what();
    }
  };
  Inputs short_q = in;
  short_q.q[1].pop_back();
  expect_reject(good, short_q, "q[1]");
  Inputs missing_v = in;
  missing_v.v.pop_back();
  expect_reject(good, missing_v, "v");
  Problem p = good;
  p.seqlen_k = {5};
  expect_reject(p, in, "seqlen_k");
  p = good;
  p.heads_kv = 3;
  expect_reject(p, in, "heads_kv");
  p = good;
  p.head_dim_v = 5;
  expect_reject(p, in, "head_dim_v");
  p = good;
  p.window_left = -2;
  expect_reject(p, in, "window");
  p = good;
  p.softcap = -1;
  expect_reject(p, in, "softcap");

  auto dout = random_dout(good, rng);
  dout[0].push_back(1.0f);
  EXPECT_THROW(fa3::ref::backward(good, in, dout), std::invalid_argument);
  EXPECT_THROW(fa3::ref::forward(good, short_q), std::invalid_argument);
}

// --- rounding -----------------------------------------------------------------------------------

using fa3::ref::from_bf16_bits;
using fa3::ref::from_e4m3_bits;
using fa3::ref::from_fp16_bits;
using fa3::ref::to_bf16_bits;
using fa3::ref::to_e4m3_bits;
using fa3::ref::to_fp16_bits;

TEST(Rounding, Bf16KnownPatterns) {
  EXPECT_EQ(to_bf16_bits(1.0f), 0x3f80);
  EXPECT_EQ(to_bf16_bits(-2.0f), 0xc000);
  EXPECT_EQ(to_bf16_bits(1.0f + std::ldexp(1.0f, -8)), 0x3f80);      // tie -> even (down)
  EXPECT_EQ(to_bf16_bits(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);  // tie -> even (up)
  EXPECT_EQ(to_bf16_bits(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)), 0x3f81);
  EXPECT_EQ(to_bf16_bits(INFINITY), 0x7f80);
  EXPECT_EQ(to_bf16_bits(std::numeric_limits<float>::max()), 0x7f80);  // above the last midpoint
  EXPECT_TRUE(std::isnan(from_bf16_bits(to_bf16_bits(NAN))));
  EXPECT_TRUE(std::isnan(from_bf16_bits(to_bf16_bits(-NAN))));
  EXPECT_EQ(from_bf16_bits(0x3f80), 1.0f);
  EXPECT_EQ(fa3::ref::round_bf16(3.14159265f), 3.140625f);
}

TEST(Rounding, Fp16KnownPatterns) {
  EXPECT_EQ(to_fp16_bits(1.0f), 0x3c00);
  EXPECT_EQ(to_fp16_bits(-0.0f), 0x8000);
  EXPECT_EQ(to_fp16_bits(1.0f + std::ldexp(1.0f, -11)), 0x3c00);      // tie -> even (down)
  EXPECT_EQ(to_fp16_bits(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);  // tie -> even (up)
  EXPECT_EQ(to_fp16_bits(65504.0f), 0x7bff);
  EXPECT_EQ(from_fp16_bits(0x7bff), 65504.0f);
  EXPECT_EQ(to_fp16_bits(65519.0f), 0x7bff);
  EXPECT_EQ(to_fp16_bits(65520.0f), 0x7c00);  // the midpoint to 2^16 rounds to inf
  EXPECT_EQ(to_fp16_bits(-1e6f), 0xfc00);
  EXPECT_EQ(to_fp16_bits(std::ldexp(1.0f, -14)), 0x0400);  // smallest normal
  EXPECT_EQ(to_fp16_bits(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(from_fp16_bits(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(to_fp16_bits(std::ldexp(1.0f, -25)), 0x0000);  // tie -> 0
  EXPECT_EQ(to_fp16_bits(std::ldexp(1.0f, -25) * (1 + std::ldexp(1.0f, -20))), 0x0001);
  EXPECT_EQ(to_fp16_bits(3 * std::ldexp(1.0f, -25)), 0x0002);  // tie -> even
  // The largest subnormal rounds up into the smallest normal.
  EXPECT_EQ(to_fp16_bits(std::ldexp(1.0f, -14) - std::ldexp(1.0f, -26)), 0x0400);
  EXPECT_TRUE(std::isnan(from_fp16_bits(to_fp16_bits(NAN))));
  EXPECT_TRUE(std::isinf(from_fp16_bits(0x7c00)));
}

TEST(Rounding, E4m3KnownPatterns) {
  EXPECT_EQ(to_e4m3_bits(1.0f), 0x38);
  EXPECT_EQ(to_e4m3_bits(-1.0f), 0xb8);
  EXPECT_EQ(to_e4m3_bits(1.0625f), 0x38);  // tie -> even (down)
  EXPECT_EQ(to_e4m3_bits(1.1875f), 0x3a);  // tie -> even (up)
  EXPECT_EQ(to_e4m3_bits(448.0f), 0x7e);
  EXPECT_EQ(from_e4m3_bits(0x7e), 448.0f);
  EXPECT_EQ(to_e4m3_bits(464.0f), 0x7e);
  EXPECT_EQ(to_e4m3_bits(500.0f), 0x7e);  // saturates
  EXPECT_EQ(to_e4m3_bits(-500.0f), 0xfe);
  EXPECT_EQ(to_e4m3_bits(INFINITY), 0x7e);
  EXPECT_EQ(to_e4m3_bits(NAN), 0x7f);
  EXPECT_EQ(to_e4m3_bits(std::ldexp(1.0f, -6)), 0x08);  // smallest normal
  EXPECT_EQ(to_e4m3_bits(std::ldexp(1.0f, -9)), 0x01);  // smallest subnormal
  EXPECT_EQ(from_e4m3_bits(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(to_e4m3_bits(std::ldexp(1.0f, -10)), 0x00);  // tie -> 0
  EXPECT_EQ(to_e4m3_bits(-std::ldexp(1.0f, -12)), 0x80);
  EXPECT_TRUE(std::isnan(from_e4m3_bits(0x7f)));
  EXPECT_TRUE(std::isnan(from_e4m3_bits(0xff)));
  EXPECT_EQ(fa3::ref::round_e4m3(300.0f), 288.0f);
}

TEST(Rounding, EveryCodeRoundTrips) {
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7f) == 0x7f) continue;  // NaN
    EXPECT_EQ(to_e4m3_bits(from_e4m3_bits(uint8_t(c))), c) << "e4m3 code " << c;
  }
  int bad16 = 0, badbf = 0;
  for (int c = 0; c < 65536; ++c) {
    const uint16_t u = uint16_t(c);
    if ((c & 0x7c00) != 0x7c00 || (c & 0x3ff) == 0) bad16 += to_fp16_bits(from_fp16_bits(u)) != u;
    if ((c & 0x7f80) != 0x7f80 || (c & 0x7f) == 0) badbf += to_bf16_bits(from_bf16_bits(u)) != u;
  }
  EXPECT_EQ(bad16, 0);
  EXPECT_EQ(badbf, 0);
}

// An independent rounding oracle: decode every non-negative finite code from the format's field
// widths, then round by searching for the nearest value (ties to the even code). The overflow
// boundary is modelled by treating inf as the next power of two; e4m3 has none, which is exactly
// saturation.
struct MiniFloat {
  int exp_bits, man_bits, bias;
  uint32_t sign_bit, top_code;  // top_code: the largest finite code (or the inf code)
  bool has_inf;
};

double decode(const MiniFloat& f, uint32_t code) {
  const int e = int(code >> f.man_bits), m = int(code & ((1u << f.man_bits) - 1));
  if (e == 0) return std::ldexp(double(m), 1 - f.bias - f.man_bits);
  return std::ldexp(double(m + (1 << f.man_bits)), e - f.bias - f.man_bits);
}

uint32_t oracle_round(const MiniFloat& f, const std::vector<double>& values, float x) {
  const uint32_t sign = std::signbit(x) ? f.sign_bit : 0;
  const double a = std::abs(double(x));
  auto it = std::lower_bound(values.begin(), values.end(), a);
  if (it == values.end()) return sign | uint32_t(values.size() - 1);
  const uint32_t hi = uint32_t(it - values.begin());
  if (*it == a || hi == 0) return sign | hi;
  const uint32_t lo = hi - 1;
  const double dlo = a - values[lo], dhi = values[hi] - a;  // exact: nearby doubles
  if (dlo < dhi) return sign | lo;
  if (dhi < dlo) return sign | hi;
  return sign | ((lo & 1) ? hi : lo);
}

template <class To, class From>
void check_against_oracle(const MiniFloat& f, To to_bits, From from_bits, int emin, int emax,
                          std::mt19937& rng, const char* name) {
  std::vector<double> values;
  for (uint32_t c = 0; c <= f.top_code; ++c) values.push_back(decode(f, c));
  if (f.has_inf) values.back() = std::ldexp(1.0, (1 << f.exp_bits) - 1 - f.bias);
  for (uint32_t c = 0; c < f.top_code; ++c)
    ASSERT_EQ(double(from_bits(c)), values[c]) << name << " decode of code " << c;

  std::uniform_int_distribution<int> exp_dist(emin, emax), pick(0, int(values.size()) - 2);
  int bad = 0;
  for (int trial = 0; trial < 100000; ++trial) {
    float x;
    if (trial % 4 == 0) {  // exact midpoints between neighbouring codes: the tie cases
      const int c = pick(rng);
      x = float((values[c] + values[c + 1]) / 2);
    } else {  // random significand bits at a random binade
      x = std::ldexp(float(rng() & 0xffffff), exp_dist(rng) - 24);
    }
    if (rng() & 1) x = -x;
    const uint32_t want = oracle_round(f, values, x), got = to_bits(x);
    if (got != want && bad++ < 5)
      ADD_FAILURE() << name << "(" << x << ") = " << got << ", nearest-even code is " << want;
  }
  EXPECT_EQ(bad, 0) << name;
}

TEST(Rounding, MatchesNearestValueOracle) {
  const unsigned seed = fresh_seed();
  TRACE_SEED(seed);
  std::mt19937 rng(seed);
  check_against_oracle({5, 10, 15, 0x8000, 0x7c00, true}, to_fp16_bits, from_fp16_bits, -27, 17,
                       rng, "fp16");
  check_against_oracle({8, 7, 127, 0x8000, 0x7f80, true}, to_bf16_bits, from_bf16_bits, -140, 127,
                       rng, "bf16");
  check_against_oracle({4, 3, 7, 0x80, 0x7e, false}, to_e4m3_bits, from_e4m3_bits, -12, 10, rng,
                       "e4m3");
}

TEST(Rounding, RoundVecUsesFa3DtypeNumbers) {
  const std::vector<float> x = {1.0f + std::ldexp(1.0f, -10), 300.0f, 1e-8f};
  for (int dtype = 0; dtype <= 3; ++dtype) {
    std::vector<float> y = x;
    fa3::ref::round_vec(y, dtype);
    for (size_t e = 0; e < x.size(); ++e) {
      const float want = dtype == 0   ? fa3::ref::round_fp16(x[e])
                         : dtype == 1 ? fa3::ref::round_bf16(x[e])
                         : dtype == 2 ? fa3::ref::round_e4m3(x[e])
                                      : x[e];
      EXPECT_EQ(y[e], want) << "dtype " << dtype;
    }
  }
  std::vector<float> y = x;
  EXPECT_THROW(fa3::ref::round_vec(y, 7), std::invalid_argument);
}

}  // namespace

// ---- the quantizer's CPU reference (reference/quantize.h), the tests' model of fa3_quantize_fp8 ----

// H H = d I: rotating twice gives d times the input (exactly, for small integers). hadamard_row
// multiplies by the signs first, so the second rotation gets them cancelled beforehand.
TEST(ReferenceQuantize, HadamardTwiceIsDTimesTheInput) {
  for (int d : {16, 64, 128, 256}) {
    std::vector<float> x(d);
    for (int c = 0; c < d; ++c) x[c] = float((c * 7) % 11) - 5.f;
    std::vector<float> z(x);
    fa3::ref::hadamard_row(z.data(), d, 7);  // (x * s) H
    for (int c = 0; c < d; ++c) z[c] *= fa3::fp8::hadamard_sign(7, c);
    fa3::ref::hadamard_row(z.data(), d, 7);  // (x * s) H H
    for (int c = 0; c < d; ++c)
      EXPECT_EQ(z[c], float(d) * x[c] * fa3::fp8::hadamard_sign(7, c)) << "d " << d << " c " << c;
  }
}

// descale * e4m3 value is the rotated input (x * s) H / sqrt(d) to e4m3's precision (3 mantissa
// bits: relative 2^-4, plus half a subnormal step), each block's largest |y| lands on 448, and
// an all-zero block gets descale 1.
TEST(ReferenceQuantize, DequantizesToTheRotatedInput) {
  std::mt19937 g(5);
  std::normal_distribution<float> normal(0.f, 1.f);
  const int rows = 70, d = 64, block = 32;
  std::vector<float> x(size_t(rows) * d);
  for (auto& v : x) v = normal(g) * (1.f + 20.f * (normal(g) > 2.5f));
  for (int r = 64; r < rows; ++r)  // the third block (rows 64..69): zeros
    for (int e = 0; e < d; ++e) x[size_t(r) * d + e] = 0.f;
  for (bool hadamard : {false, true}) {
    const auto q = fa3::ref::quantize_fp8(x, rows, d, block, hadamard, 99);
    ASSERT_EQ(q.descale.size(), 3u);
    EXPECT_EQ(q.descale[2], 1.f);
    for (int b = 0; b < 2; ++b) {
      int top = 0;
      for (int r = b * block; r < (b + 1) * block; ++r) {
        std::vector<float> y(x.begin() + size_t(r) * d, x.begin() + size_t(r + 1) * d);
        if (hadamard) {
          fa3::ref::hadamard_row(y.data(), d, 99);
          for (float& v : y) v /= std::sqrt(float(d));
        }
        for (int e = 0; e < d; ++e) {
          const uint8_t byte = q.bytes[size_t(r) * d + e];
          top = std::max(top, int(byte & 0x7f));
          const float got = fa3::ref::from_e4m3_bits(byte) * q.descale[b];
          EXPECT_LE(std::fabs(got - y[e]), std::fabs(y[e]) / 16.f + q.descale[b] / 1024.f * 1.001f)
              << "row " << r << " col " << e << (hadamard ? " rotated" : "");
        }
      }
      EXPECT_EQ(top, 0x7e) << "block " << b << ": its largest value is 448";
    }
  }
}
