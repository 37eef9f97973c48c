// CPU attention reference in double precision: the ground truth every kernel is tested against.
//
// It follows the mathematical definition directly (no tiling, no online softmax) so that it is
// easy to audit; it is multithreaded only to keep large test shapes fast, and its results do not
// depend on the thread count.
#pragma once

#include <vector>

namespace fa3::ref {

struct Problem {
  int batch = 1, heads_q = 1, heads_kv = 1, head_dim_qk = 0, head_dim_v = 0;
  std::vector<int> seqlen_q, seqlen_k;  // one entry per batch element (varlen = different lengths)
  double softmax_scale = 0;             // 0 selects 1/sqrt(head_dim_qk)
  bool causal = false;  // bottom-right aligned: query i sees key j iff j <= i + sk - sq
  // Sliding window, -1 = unbounded: visible iff j >= i + sk - sq - left and j <= i + sk - sq +
  // right.
  int window_left = -1, window_right = -1;
  double softcap = 0;  // 0 = off, else s -> softcap * tanh(s / softcap), s = scale * q.k
  // Attention sinks: empty = none, else one logit per query head joining every row's softmax sum
  // without a value row (LSE = log(sum_j e^(s_j) + e^sink); a row with no visible key: LSE = sink).
  std::vector<double> sinks;
};

// Logical per-batch tensors, row-major:
//   q[b] [seqlen_q[b]][heads_q][head_dim_qk], k[b] [seqlen_k[b]][heads_kv][head_dim_qk],
//   v[b] [seqlen_k[b]][heads_kv][head_dim_v].
struct Inputs {
  std::vector<std::vector<float>> q, k, v;
};

struct FwdResult {
  std::vector<std::vector<double>> o;    // o[b]: [seqlen_q[b]][heads_q][head_dim_v]
  std::vector<std::vector<double>> lse;  // lse[b]: [heads_q][seqlen_q[b]], natural log;
                                         // rows with no visible key: -inf and an all-zero O row
};

struct BwdResult {
  std::vector<std::vector<double>> dq, dk, dv;  // same layouts as q, k, v
  std::vector<double> dsinks;                   // [heads_q] with sinks, else empty
  // [heads_q] with sinks: sqrt of the sum of dsinks' squared row terms, the size a sum of terms of
  // random sign has (dsinks itself may cancel far below it; tests measure errors against both).
  std::vector<double> dsinks_scale;
};

// The softmax scale actually used (resolves softmax_scale == 0).
double effective_scale(const Problem& p);

// Mask predicate (causal and window combined; j outside [0, seqlen_k[b]) is never visible).
bool key_visible(const Problem& p, int b, int i, int j);

// threads == 0 uses std::thread::hardware_concurrency(). Both call validate() first.
FwdResult forward(const Problem& p, const Inputs& in, int threads = 0);
// dout has the layout of o. Recomputes the forward internally for O and LSE. dlse (optional, the
// layout of FwdResult::lse): the loss's gradient w.r.t. LSE, whose gradient joins the one through O.
BwdResult backward(const Problem& p, const Inputs& in, const std::vector<std::vector<float>>& dout,
                   int threads = 0, const std::vector<std::vector<float>>* dlse = nullptr);

// Gathers the logical [seqlen][heads][d] K (or V) of one sequence from a paged pool laid out as
// [num_pages][page_size][heads][d]; page_table_row lists this sequence's pages in order.
std::vector<float> gather_paged(const float* pool, int page_size, int heads, int d,
                                const int* page_table_row, int seqlen);

// Throws std::invalid_argument naming the first inconsistency between the problem and the inputs.
void validate(const Problem& p, const Inputs& in);

}  // namespace fa3::ref
