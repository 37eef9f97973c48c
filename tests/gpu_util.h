// Shared helpers of the GPU tests: device detection, random inputs in any supported layout,
// running a forward implementation on them, and comparing against the double-precision reference.
#pragma once
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "fa3/fa3.h"
#include "reference/reference.h"

namespace fa3::test {

// The larger of two errors, where a NaN (an output the kernel never wrote: outputs are poisoned with
// NaN before launch) wins: std::max(err, NaN) returns err, which would let the unwritten element pass.
inline double worse(double err, double x) { return std::isnan(err) || std::isnan(x) ? INFINITY : std::max(err, x); }

// "" when an sm_90 device is present, else why the GPU tests are skipped.
std::string gpu_skip_reason();

#define FA3_REQUIRE_GPU()                                            \
  do {                                                               \
    const std::string fa3_why_ = ::fa3::test::gpu_skip_reason();     \
    if (!fa3_why_.empty()) GTEST_SKIP() << fa3_why_;                 \
  } while (0)

#define FA3_CUDA_CHECK(call) ASSERT_EQ(cudaSuccess, (call)) << #call

// Owns one device allocation.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = nullptr; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  void upload(const void* host, size_t bytes);
  void download(void* host, size_t bytes) const;
  void fill_bytes(int value);

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

std::mt19937& rng();  // seeded once from FA3_TEST_SEED or std::random_device; the seed is printed at start
// n per-sequence lengths in [lo, hi] drawn from g (default rng(): the printed seed reproduces them).
std::vector<int> random_lengths(int n, int lo, int hi, std::mt19937& g = rng());

// An integer from the environment: false when unset or empty (a value that is not an integer is
// a test failure).
bool env_long(const char* name, long long* value);

enum class Layout { kBSHD, kBSHDPadded, kBHSD };

struct FwdCase {
  fa3_dtype dtype = FA3_DTYPE_BF16;
  int batch = 1, seqlen_q = 128, seqlen_k = 128, heads_q = 2, heads_kv = 2, head_dim = 128, head_dim_v = 0;
  bool causal = false;
  int window_left = -1, window_right = -1;
  float softcap = 0.f;
  float softmax_scale = 0.f;  // 0: the default 1/sqrt(head_dim)
  bool with_lse = true;
  Layout layout = Layout::kBSHD;
  // Per-sequence lengths; empty = seqlen_q / seqlen_k for every batch entry (dense rows).
  // varlen_q: Q/O rows packed, cu_seqlens_q (seqlen_q is then ignored: the args get the maximum).
  // varlen_k: K/V rows packed, cu_seqlens_k; with page_size > 0 instead the keys of each sequence
  // in its pages, passed as seqused_k (unless seqused_k below is given).
  std::vector<int> varlen_q, varlen_k;
  // Per-batch seqused_q / seqused_k (empty = not passed): only the first seqused[b] rows of
  // sequence b are used (<= its rows: varlen_* [b], else seqlen_*). The reference sees these
  // lengths, masks align to them, and O/LSE rows past them must stay untouched.
  // cu_seqlens_q with dense K: varlen_q + seqused_k, varlen_k empty.
  std::vector<int> seqused_q, seqused_k;
  // > 0: poisoned rows no sequence owns. Packed Q/O (K/V): total_q = cu_seqlens_q[batch] +
  // guard_rows (rows inside the tensor after the last sequence; Q/K/V there finite) and guard_rows
  // more allocated past total_q (Q/K/V there NaN: never read). Dense: guard_rows NaN rows after
  // every batch entry's seqlen rows (BHSD: after every head's). O there, in rows past seqused_q, in
  // row padding and past the end must keep the 0xFF poison, like LSE entries nobody owns.
  int guard_rows = 0;
  int page_size = 0;  // > 0: paged K/V cache with shuffled pages
  // > 0: key j's row scaled by 1 + key_growth * (seqlen_k - 1 - j) / seqlen_k, so that the kernels'
  // row maxima grow block after block (they walk the keys from the last): running-max rescales.
  float key_growth = 0.f;
  // The decode path (split-KV, pack-GQA): workspace = true attaches the workspace
  // fa3::workspace_size asks for (poisoned with NaN: the combine must not read unwritten slots)
  // and passes num_splits (0 = automatic). Without a workspace num_splits stays 0 and decodes run on
  // the usual kernels.
  bool workspace = false;
  int num_splits = 0;
  // e4m3 only, > 0: block descales (fa3_block_scales) of q_block positions for Q and kv_block
  // for K and V, factors in [0.5, 2] that differ per (sequence, head, block) on top of the
  // per-head descales.
  int q_block = 0, kv_block = 0;
  // With kv_block: V's factors spread over 2^-6 .. 2^6 instead, and V's second block's factor 0
  // (a block of zeros): the softmax's shift by log2 of V's factor (descale.cuh) at its extremes.
  bool wide_v_factors = false;
  // Attention sinks (fa3_fwd_params.sinks): a logit per query head, sink_logit(h), from -4 to 6 (the
  // scores of the harness's N(0, 1) inputs are ~N(0, 1): some sinks barely count, some dominate).
  bool sinks = false;
  std::string name() const;
  // Every field as C++ assignments ("c.batch = 3; ..."): pasted into a test, it rebuilds the case.
  std::string repro() const;
};

// Where every logical element of a case lives in its device buffers: host-only (no CUDA call),
// so the harness itself can be tested without a GPU. make_fwd_data allocates and fills by it.
struct FwdPlan {
  struct Strides {
    int64_t batch = 0, row = 0, head = 0;
  };
  int batch = 0, heads_q = 0, heads_kv = 0, dqk = 0, dv = 0;
  bool packed_q = false, packed_k = false, paged = false, with_lse = true;
  std::vector<int> rows_q, rows_k;    // per sequence: rows in memory (packed length, or seqlen)
  std::vector<int> used_q, used_k;    // per sequence: rows the attention uses (seqused, else rows)
  std::vector<int> q_row0, k_row0;    // first packed row of each sequence (0 when dense)
  int seqlen_q = 0, seqlen_k = 0;     // the args' seqlen_q / seqlen_k
  int total_q = 0, total_k = 0;       // packed: declared rows (>= 1); dense: 0
  int rows_alloc_q = 0, rows_alloc_k = 0;  // rows per layout block (packed: total + guard rows)
  int guard_rows = 0;
  Strides qs, os, ks, vs;
  size_t q_elems = 0, o_elems = 0, k_elems = 0, v_elems = 0, lse_elems = 0;
  int page_size = 0, pages_per_seq = 0, num_pages = 0;
  std::vector<int> page_table;  // [batch][pages_per_seq], shuffled pages

  int64_t q_index(int b, int i, int h, int x) const { return row_index(packed_q, q_row0, qs, b, i, h, x); }
  int64_t o_index(int b, int i, int h, int x) const { return row_index(packed_q, q_row0, os, b, i, h, x); }
  int64_t k_index(int b, int j, int h, int x) const { return kv_index(ks, b, j, h, x); }
  int64_t v_index(int b, int j, int h, int x) const { return kv_index(vs, b, j, h, x); }
  int64_t lse_index(int b, int h, int i) const {
    return packed_q ? int64_t(h) * total_q + q_row0[b] + i : (int64_t(b) * heads_q + h) * seqlen_q + i;
  }
  // Where an element offset of O / an LSE entry lies ("packed row 12 (past total_q 12) head 0 x 3").
  std::string describe_o(int64_t offset) const;
  std::string describe_lse(int64_t offset) const;

 private:
  static int64_t row_index(bool packed, const std::vector<int>& row0, const Strides& s, int b, int i, int h, int x) {
    return packed ? int64_t(row0[b] + i) * s.row + int64_t(h) * s.head + x
                  : int64_t(b) * s.batch + int64_t(i) * s.row + int64_t(h) * s.head + x;
  }
  int64_t kv_index(const Strides& s, int b, int j, int h, int x) const;
};

// The lengths every kernel is checked at (1, 17, 1000, 4097: one row, a partial tile, several
// tiles, one past a power of two), causal and not; one head beyond 1000 keeps the CPU reference quick.
std::vector<FwdCase> seqlen_grid_cases();
// Per-sequence (query, key) lengths of the packed-varlen tests: 0, 1, 17, tile edges, s_q != s_k
// within a sequence; and the windows (left, right) they cycle through.
struct VarlenLengths {
  std::vector<int> q, k;
};
std::vector<VarlenLengths> varlen_length_sets();
extern const std::pair<int, int> kVarlenWindows[5];
// Five packed sequences (lengths 17, 0, 200, 1, 129 against keys 300, 40, 0, 1, 129), GQA 4:2,
// guard rows: the packed case the head-dim and layout variants of the varlen tests start from.
FwdCase packed_head_dim_case(int dqk, int dv, Layout layout);
// seqused_q / seqused_k in each layout: dense rows (either or both, guard rows, a window), packed
// rows with seqused on top, cu_seqlens_q with dense K (and seqused_q), cu_seqlens_k with dense Q;
// lengths 0 and 1 among them.
std::vector<FwdCase> seqused_cases(bool causal);

// Throws std::invalid_argument when the case is inconsistent (lengths per batch, seqused > rows).
FwdPlan plan_fwd(const FwdCase& c);

// Inputs on host (logical, as the reference wants them) and on device (in the case's layout),
// plus the argument struct that points at them. Outputs are poisoned with NaN.
struct FwdData {
  FwdCase c;
  FwdPlan plan;
  ref::Problem prob;
  ref::Inputs in;  // empty when make_fwd_data was told no reference inputs are needed
  FwdArgs args;
  DeviceBuffer q, k, v, out, lse, cu_q, cu_k, seqused_q, seqused_k, page_table, descale, block_descale, workspace,
      sinks;
  int total_q = 0;  // = plan.total_q
};

// The sink logit of query head h in cases with sinks.
float sink_logit(int h);

// reference_inputs = false skips the logical host copies (d.in) for oracle-only comparisons.
FwdData make_fwd_data(const FwdCase& c, bool reference_inputs = true);
void poison_outputs(FwdData& d);

// Writes outside what the sequences own: O elements (rows past seqused_q, between and after the
// packed sequences, guard rows, row padding, past the end) and LSE entries whose bits are no longer
// the 0xFF.. poison.
struct StrayWrites {
  long o = 0, lse = 0;
  std::string where;  // the first few, located
};
// out: the O buffer's 16-bit words (out_elems of them), lse: the LSE buffer's 32-bit words.
StrayWrites find_stray_writes(const FwdPlan& plan, const uint16_t* out, size_t out_elems, const uint32_t* lse,
                              size_t lse_elems);

struct FwdOutputs {
  std::vector<std::vector<double>> o, lse;  // same layouts as ref::FwdResult
  StrayWrites stray;                        // checked by compare / expect_close
};
FwdOutputs download_outputs(const FwdData& d);

struct Errors {
  double rel_fro = 0, max_abs = 0, max_ref = 0, lse_max_err = 0;
  long nan_count = 0, lse_mismatch = 0;
  long stray_o = 0, stray_lse = 0;  // of "got": writes where no sequence owns the element
  std::string stray_where;
  std::string lse_worst;  // where lse_max_err is (batch, entry of [heads_q][seqlen_q]: got vs want)
  std::string summary() const;
};
Errors compare(const FwdOutputs& got, const ref::FwdResult& want, bool check_lse);

// The tolerance every 16-bit forward is held to (bf16: relative error <= 1e-2 against double), plus
// an element-wise guard (5 x rel_tol of max(1, max |ref|)) against outliers the norm averages away,
// no NaN (an unwritten, poisoned element) and no stray writes.
// is_close says why not in *why (when given); expect_close is its gtest form.
// lse_tol: the largest LSE error (natural log), absolute where |LSE| <= 1, relative beyond.
bool is_close(const Errors& e, double rel_tol = 1e-2, std::string* why = nullptr, double lse_tol = 1e-3);

// e4m3 operands, against a reference that does not round P: the FP8 kernel rounds each probability
// to e4m3 (up to 2^-4 of it). Over many query rows O's relative error stays <= 3e-2 (measured:
// test_fwd_gpu.cpp); a case of at most 16 query rows (all heads), whose O may be one or two keys'
// V, is held to the per-probability bound 2^-4 + 5e-3 instead (one row read 3.5e-2, H200 2026-12-02).
double fp8_tolerance(const FwdCase& c);
// e4m3: the largest LSE error (natural log; absolute where |LSE| <= 1). The e4m3 wgmma accumulates
// QK^T with less than fp32's precision, a rounding per 32-column k-step, so a score's error grows
// with head_dim_qk; a row that sees one key carries its score's error whole (its LSE is that score).
// Measured (H100 2026-12-05, FA3_TEST_SEED=440031451 --gtest_filter='FwdGpu.Fp8*'): such rows
// 8.8e-3 and 1.25e-2 absolute at d256, and 2.37e-2 (block descales: a score of -0.1647 read -0.1410),
// 2.1e-2 absolute at d128 on a score of -6.33 (3.3e-3 relative); rows with many keys <= 3.4e-3. So
// 2e-2 up to d128 (as since 2026-12-01), scaled with the k-steps past it: 4e-2 at d256. A wrong
// factor or a missed key block moves O too (held to fp8_tolerance); -inf / NaN mismatches count apart.
double fp8_lse_tolerance(const FwdCase& c);
void expect_close(const Errors& e, const std::string& what, double rel_tol = 1e-2, double lse_tol = 1e-3);

}  // namespace fa3::test
