// Direct-definition attention in double precision. Every (query, key) score is recomputed where it
// is needed instead of being cached, trading speed for simplicity: forward, dQ and dK/dV each
// read only their own loop's operands.
#include "reference/reference.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <exception>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>

namespace fa3::ref {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();
constexpr int kRowsPerTask = 16;

// Rows [begin, end) of one (batch, head). Tasks write disjoint output ranges, so the result does
// not depend on which thread runs which task.
struct Task {
  int b, h, begin, end;
};

std::vector<Task> make_tasks(int heads, const std::vector<int>& lengths) {
  std::vector<Task> tasks;
  for (int b = 0; b < static_cast<int>(lengths.size()); ++b)
    for (int h = 0; h < heads; ++h)
      for (int r = 0; r < lengths[b]; r += kRowsPerTask)
        tasks.push_back({b, h, r, std::min(r + kRowsPerTask, lengths[b])});
  return tasks;
}

template <class Fn>
void run_tasks(const std::vector<Task>& tasks, int threads, const Fn& fn) {
  if (threads <= 0) threads = static_cast<int>(std::thread::hardware_concurrency());
  threads = std::max(1, std::min<int>(threads, static_cast<int>(tasks.size())));
  std::atomic<size_t> next{0};
  std::exception_ptr error;
  std::mutex error_mutex;
  auto worker = [&] {
    for (size_t t; (t = next++) < tasks.size();) {
      try {
        fn(tasks[t]);
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
        next = tasks.size();  // stop handing out work
      }
    }
  };
  std::vector<std::thread> pool;
  for (int i = 1; i < threads; ++i) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

// A score after scaling and softcap, plus d(score)/d(scale * q.k) for the backward.
struct Score {
  double s, dcap;
};

Score score(const float* q, const float* k, int d, double scale, double softcap) {
  double dot = 0;
  for (int x = 0; x < d; ++x) dot += static_cast<double>(q[x]) * k[x];
  const double raw = scale * dot;
  if (softcap <= 0) return {raw, 1.0};
  const double t = std::tanh(raw / softcap);
  return {softcap * t, 1.0 - t * t};
}

// Offsets of row `i`, head `h` in the [seqlen][heads][d] layouts.
size_t at(int i, int heads, int h, int d) {
  return (static_cast<size_t>(i) * heads + h) * static_cast<size_t>(d);
}

std::string bad(const std::string& what) { return "fa3::ref: " + what; }

void check_tensor(const std::vector<std::vector<float>>& t, const char* name, int batch,
                  const std::vector<int>& len, const char* len_name, int heads,
                  const char* heads_name, int d, const char* d_name) {
  if (static_cast<int>(t.size()) != batch)
    throw std::invalid_argument(bad(std::string(name) + " has " + std::to_string(t.size()) +
                                    " batch entries, expected batch = " + std::to_string(batch)));
  for (int b = 0; b < batch; ++b) {
    const size_t want = static_cast<size_t>(len[b]) * heads * d;
    if (t[b].size() != want)
      throw std::invalid_argument(bad(std::string(name) + "[" + std::to_string(b) + "] has " +
                                      std::to_string(t[b].size()) + " elements, expected " +
                                      len_name + "[" + std::to_string(b) + "] * " + heads_name +
                                      " * " + d_name + " = " + std::to_string(want)));
  }
}

}  // namespace

double effective_scale(const Problem& p) {
  return p.softmax_scale != 0 ? p.softmax_scale
                              : 1.0 / std::sqrt(static_cast<double>(p.head_dim_qk));
}

bool key_visible(const Problem& p, int b, int i, int j) {
  const int sq = p.seqlen_q[b], sk = p.seqlen_k[b];
  if (j < 0 || j >= sk) return false;
  const long diag = static_cast<long>(i) + sk - sq;  // the key aligned with query i
  if (p.causal && j > diag) return false;
  if (p.window_left >= 0 && j < diag - p.window_left) return false;
  if (p.window_right >= 0 && j > diag + p.window_right) return false;
  return true;
}

void validate(const Problem& p, const Inputs& in) {
  auto require = [](bool ok, const std::string& what) {
    if (!ok) throw std::invalid_argument(bad(what));
  };
  require(p.batch >= 1, "batch must be >= 1, got " + std::to_string(p.batch));
  require(p.heads_q >= 1 && p.heads_kv >= 1, "heads_q and heads_kv must be >= 1");
  require(p.heads_q % p.heads_kv == 0, "heads_q (" + std::to_string(p.heads_q) +
                                           ") must be a multiple of heads_kv (" +
                                           std::to_string(p.heads_kv) + ")");
  require(p.head_dim_qk >= 1 && p.head_dim_v >= 1, "head_dim_qk and head_dim_v must be >= 1");
  require(
      static_cast<int>(p.seqlen_q.size()) == p.batch &&
          static_cast<int>(p.seqlen_k.size()) == p.batch,
      "seqlen_q and seqlen_k need one entry per batch element (" + std::to_string(p.batch) + ")");
  for (int b = 0; b < p.batch; ++b)
    require(p.seqlen_q[b] >= 0 && p.seqlen_k[b] >= 0,
            "sequence lengths must be >= 0 (batch " + std::to_string(b) + ")");
  require(p.window_left >= -1 && p.window_right >= -1, "window_left/right must be >= -1");
  require(std::isfinite(p.softmax_scale), "softmax_scale must be finite");
  require(std::isfinite(p.softcap) && p.softcap >= 0, "softcap must be finite and >= 0");
  require(p.sinks.empty() || static_cast<int>(p.sinks.size()) == p.heads_q,
          "sinks must be empty or hold heads_q (" + std::to_string(p.heads_q) + ") logits; got " +
              std::to_string(p.sinks.size()));
  check_tensor(in.q, "q", p.batch, p.seqlen_q, "seqlen_q", p.heads_q, "heads_q", p.head_dim_qk,
               "head_dim_qk");
  check_tensor(in.k, "k", p.batch, p.seqlen_k, "seqlen_k", p.heads_kv, "heads_kv", p.head_dim_qk,
               "head_dim_qk");
  check_tensor(in.v, "v", p.batch, p.seqlen_k, "seqlen_k", p.heads_kv, "heads_kv", p.head_dim_v,
               "head_dim_v");
}

FwdResult forward(const Problem& p, const Inputs& in, int threads) {
  validate(p, in);
  const int hq = p.heads_q, hkv = p.heads_kv, dqk = p.head_dim_qk, dv = p.head_dim_v;
  const int group = hq / hkv;
  const double scale = effective_scale(p);
  FwdResult r;
  r.o.resize(p.batch);
  r.lse.resize(p.batch);
  for (int b = 0; b < p.batch; ++b) {
    r.o[b].assign(at(p.seqlen_q[b], hq, 0, dv), 0.0);
    r.lse[b].assign(static_cast<size_t>(hq) * p.seqlen_q[b], kNegInf);
  }
  run_tasks(make_tasks(hq, p.seqlen_q), threads, [&](const Task& t) {
    const int b = t.b, h = t.h, hk = h / group, sk = p.seqlen_k[b];
    std::vector<double> s(sk);
    std::vector<char> vis(sk);
    const bool sink = !p.sinks.empty();
    for (int i = t.begin; i < t.end; ++i) {
      const float* qi = &in.q[b][at(i, hq, h, dqk)];
      // The sink is one more logit in the sum (no value row), so it joins the max too.
      double m = sink ? p.sinks[h] : kNegInf;
      bool any = false;
      for (int j = 0; j < sk; ++j) {
        vis[j] = key_visible(p, b, i, j);
        if (!vis[j]) continue;
        s[j] = score(qi, &in.k[b][at(j, hkv, hk, dqk)], dqk, scale, p.softcap).s;
        m = std::max(m, s[j]);
        any = true;
      }
      const size_t lse_row = static_cast<size_t>(h) * p.seqlen_q[b] + i;
      if (!any) {  // O row stays 0; LSE stays -inf, or is the sink's alone
        if (sink) r.lse[b][lse_row] = p.sinks[h];
        continue;
      }
      double sum = sink ? std::exp(p.sinks[h] - m) : 0.0;
      for (int j = 0; j < sk; ++j)
        if (vis[j]) sum += std::exp(s[j] - m);
      r.lse[b][lse_row] = m + std::log(sum);
      double* o = &r.o[b][at(i, hq, h, dv)];
      for (int j = 0; j < sk; ++j) {
        if (!vis[j]) continue;
        const double w = std::exp(s[j] - m) / sum;
        const float* vj = &in.v[b][at(j, hkv, hk, dv)];
        for (int x = 0; x < dv; ++x) o[x] += w * vj[x];
      }
    }
  });
  return r;
}

BwdResult backward(const Problem& p, const Inputs& in, const std::vector<std::vector<float>>& dout,
                   int threads, const std::vector<std::vector<float>>* dlse) {
  validate(p, in);
  const int hq = p.heads_q, hkv = p.heads_kv, dqk = p.head_dim_qk, dv = p.head_dim_v;
  check_tensor(dout, "dout", p.batch, p.seqlen_q, "seqlen_q", hq, "heads_q", dv, "head_dim_v");
  const int group = hq / hkv;
  const double scale = effective_scale(p);
  const FwdResult f = forward(p, in, threads);

  // D_i = dO_i . O_i, the softmax-Jacobian correction shared by every key of row i; with LSE's own
  // gradient (dLSE_i / dS_ij = P_ij) D_i - dLSE_i, so that dS_ij = P_ij (dP_ij - D_i + dLSE_i).
  if (dlse != nullptr) {
    if (dlse->size() != static_cast<size_t>(p.batch)) throw std::invalid_argument("dlse: batch entries");
    for (int b = 0; b < p.batch; ++b)
      if ((*dlse)[b].size() != static_cast<size_t>(hq) * p.seqlen_q[b])
        throw std::invalid_argument("dlse: [heads_q][seqlen_q] per batch entry");
  }
  std::vector<std::vector<double>> delta(p.batch);
  for (int b = 0; b < p.batch; ++b) {
    const int sq = p.seqlen_q[b];
    delta[b].assign(static_cast<size_t>(hq) * sq, 0.0);
    for (int i = 0; i < sq; ++i)
      for (int h = 0; h < hq; ++h) {
        double d = 0;
        for (int x = 0; x < dv; ++x)
          d += dout[b][at(i, hq, h, dv) + x] * f.o[b][at(i, hq, h, dv) + x];
        if (dlse != nullptr) d -= (*dlse)[b][static_cast<size_t>(h) * sq + i];
        delta[b][static_cast<size_t>(h) * sq + i] = d;
      }
  }

  // dS_ij w.r.t. the raw score scale * q.k of one visible pair; also returns P_ij through p_out.
  auto grad_score = [&](int b, int h, int i, int j, double* p_out) {
    const int hk = h / group;
    const size_t row = static_cast<size_t>(h) * p.seqlen_q[b] + i;
    const Score sc =
        score(&in.q[b][at(i, hq, h, dqk)], &in.k[b][at(j, hkv, hk, dqk)], dqk, scale, p.softcap);
    const double prob = std::exp(sc.s - f.lse[b][row]);
    const float* doi = &dout[b][at(i, hq, h, dv)];
    const float* vj = &in.v[b][at(j, hkv, hk, dv)];
    double dp = 0;
    for (int x = 0; x < dv; ++x) dp += static_cast<double>(doi[x]) * vj[x];
    *p_out = prob;
    return prob * (dp - delta[b][row]) * sc.dcap;
  };

  BwdResult g;
  // Sinks: dsink_h = sum over rows of P_sink (dP_sink - D) with dP_sink = 0 (no value row).
  if (!p.sinks.empty()) {
    g.dsinks.assign(hq, 0.0);
    g.dsinks_scale.assign(hq, 0.0);
    for (int h = 0; h < hq; ++h) {
      for (int b = 0; b < p.batch; ++b)
        for (int i = 0; i < p.seqlen_q[b]; ++i) {
          const size_t row = static_cast<size_t>(h) * p.seqlen_q[b] + i;
          const double term = std::exp(p.sinks[h] - f.lse[b][row]) * delta[b][row];
          g.dsinks[h] -= term;
          g.dsinks_scale[h] += term * term;
        }
      g.dsinks_scale[h] = std::sqrt(g.dsinks_scale[h]);
    }
  }
  g.dq.resize(p.batch);
  g.dk.resize(p.batch);
  g.dv.resize(p.batch);
  for (int b = 0; b < p.batch; ++b) {
    g.dq[b].assign(in.q[b].size(), 0.0);
    g.dk[b].assign(in.k[b].size(), 0.0);
    g.dv[b].assign(in.v[b].size(), 0.0);
  }

  // dQ: one task owns a block of query rows of one query head.
  run_tasks(make_tasks(hq, p.seqlen_q), threads, [&](const Task& t) {
    const int b = t.b, h = t.h, hk = h / group;
    for (int i = t.begin; i < t.end; ++i) {
      double* dqi = &g.dq[b][at(i, hq, h, dqk)];
      for (int j = 0; j < p.seqlen_k[b]; ++j) {
        if (!key_visible(p, b, i, j)) continue;
        double prob;
        const double ds = grad_score(b, h, i, j, &prob);
        const float* kj = &in.k[b][at(j, hkv, hk, dqk)];
        for (int x = 0; x < dqk; ++x) dqi[x] += scale * ds * kj[x];
      }
    }
  });

  // dK, dV: one task owns a block of key rows of one kv head and sums over its whole query-head
  // group, so GQA needs no atomics and the summation order is fixed.
  run_tasks(make_tasks(hkv, p.seqlen_k), threads, [&](const Task& t) {
    const int b = t.b, hk = t.h;
    for (int j = t.begin; j < t.end; ++j) {
      double* dkj = &g.dk[b][at(j, hkv, hk, dqk)];
      double* dvj = &g.dv[b][at(j, hkv, hk, dv)];
      for (int h = hk * group; h < (hk + 1) * group; ++h)
        for (int i = 0; i < p.seqlen_q[b]; ++i) {
          if (!key_visible(p, b, i, j)) continue;
          double prob;
          const double ds = grad_score(b, h, i, j, &prob);
          const float* doi = &dout[b][at(i, hq, h, dv)];
          const float* qi = &in.q[b][at(i, hq, h, dqk)];
          for (int x = 0; x < dv; ++x) dvj[x] += prob * doi[x];
          for (int x = 0; x < dqk; ++x) dkj[x] += scale * ds * qi[x];
        }
    }
  });
  return g;
}

std::vector<float> gather_paged(const float* pool, int page_size, int heads, int d,
                                const int* page_table_row, int seqlen) {
  if (page_size <= 0 || heads <= 0 || d <= 0 || seqlen < 0)
    throw std::invalid_argument(bad("gather_paged: page_size, heads, d must be > 0, seqlen >= 0"));
  const size_t row = static_cast<size_t>(heads) * d;
  std::vector<float> out(row * seqlen);
  for (int t = 0; t < seqlen; ++t) {
    const size_t page = static_cast<size_t>(page_table_row[t / page_size]);
    const float* src = pool + (page * page_size + t % page_size) * row;
    std::copy(src, src + row, out.begin() + static_cast<std::ptrdiff_t>(row * t));
  }
  return out;
}

}  // namespace fa3::ref
