#include "tests/gpu_util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <numeric>
#include <sstream>
#include <stdexcept>

#include "reference/rounding.h"

namespace fa3::test {

std::string gpu_skip_reason() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    cudaGetLastError();
    return "no CUDA device: GPU tests skipped";
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) return "cudaGetDeviceProperties failed";
  if (prop.major != 9 || prop.minor != 0)
    return "device is sm_" + std::to_string(prop.major * 10 + prop.minor) + ", fa3 needs sm_90: GPU tests skipped";
  return "";
}

static void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes > 0) check(cudaMalloc(&ptr_, bytes), "cudaMalloc");
}
DeviceBuffer::~DeviceBuffer() {
  if (ptr_) cudaFree(ptr_);
}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (ptr_) cudaFree(ptr_);
    ptr_ = o.ptr_;
    bytes_ = o.bytes_;
    o.ptr_ = nullptr;
  }
  return *this;
}
void DeviceBuffer::upload(const void* host, size_t bytes) { check(cudaMemcpy(ptr_, host, bytes, cudaMemcpyHostToDevice), "upload"); }
void DeviceBuffer::download(void* host, size_t bytes) const {
  check(cudaMemcpy(host, ptr_, bytes, cudaMemcpyDeviceToHost), "download");
}
void DeviceBuffer::fill_bytes(int value) { check(cudaMemset(ptr_, value, bytes_), "cudaMemset"); }

std::vector<int> random_lengths(int n, int lo, int hi, std::mt19937& g) {
  std::uniform_int_distribution<int> len(lo, hi);
  std::vector<int> v(n);
  for (auto& x : v) x = len(g);
  return v;
}

bool env_long(const char* name, long long* value) {
  const char* s = std::getenv(name);
  if (s == nullptr || *s == '\0') return false;
  char* end = nullptr;
  const long long v = std::strtoll(s, &end, 10);
  if (end == s || *end != '\0') {
    ADD_FAILURE() << name << "='" << s << "' is not an integer";
    return false;
  }
  *value = v;
  return true;
}

std::mt19937& rng() {
  static std::mt19937 gen = [] {
    long long given = 0;
    const bool seeded = env_long("FA3_TEST_SEED", &given);
    const unsigned seed = seeded ? static_cast<unsigned>(given) : std::random_device{}();
    std::printf("[fa3 tests] random seed %u (FA3_TEST_SEED=%u with the same --gtest_filter draws the same inputs)\n",
                seed, seed);
    return std::mt19937(seed);
  }();
  return gen;
}

namespace {

std::string list(const std::vector<int>& v) {
  std::ostringstream s;
  s << "{";
  for (size_t i = 0; i < v.size(); ++i) s << (i ? ", " : "") << v[i];
  s << "}";
  return s.str();
}

const char* layout_name(Layout l) {
  switch (l) {
    case Layout::kBSHDPadded: return "Layout::kBSHDPadded";
    case Layout::kBHSD: return "Layout::kBHSD";
    default: return "Layout::kBSHD";
  }
}

const char* dtype_enum(fa3_dtype t) {
  switch (t) {
    case FA3_DTYPE_FP16: return "FA3_DTYPE_FP16";
    case FA3_DTYPE_E4M3: return "FA3_DTYPE_E4M3";
    case FA3_DTYPE_FP32: return "FA3_DTYPE_FP32";
    default: return "FA3_DTYPE_BF16";
  }
}

// A float as a C++ literal: "30.0f", "0.125f", "1e-05f".
std::string float_literal(float x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", x);
  std::string s = buf;
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s + "f";
}

}  // namespace

std::string FwdCase::name() const {
  std::ostringstream s;
  s << fa3::dtype_name(dtype) << " b" << batch;
  if (varlen_q.empty()) s << " sq" << seqlen_q;
  if (varlen_k.empty()) s << " sk" << seqlen_k;
  s << " h" << heads_q << "/" << heads_kv << " d" << head_dim;
  if (head_dim_v && head_dim_v != head_dim) s << "/" << head_dim_v;
  if (causal) s << " causal";
  if (window_left >= 0 || window_right >= 0) s << " window(" << window_left << "," << window_right << ")";
  if (softcap > 0) s << " softcap" << softcap;
  if (softmax_scale != 0) s << " scale" << softmax_scale;
  if (layout == Layout::kBSHDPadded) s << " padded-rows";
  if (layout == Layout::kBHSD) s << " bhsd";
  const bool short_lists = batch <= 8;
  if (!varlen_q.empty() && !varlen_k.empty() && page_size == 0) s << " varlen";
  else if (!varlen_q.empty()) s << " varlen-q";
  else if (!varlen_k.empty() && page_size == 0) s << " varlen-k";
  if (!varlen_q.empty() && short_lists) s << " q" << list(varlen_q);
  if (!varlen_k.empty() && short_lists) s << " k" << list(varlen_k);
  if (!seqused_q.empty()) s << " seqused_q" << (short_lists ? list(seqused_q) : "");
  if (!seqused_k.empty()) s << " seqused_k" << (short_lists ? list(seqused_k) : "");
  if (guard_rows) s << " guard" << guard_rows;
  if (page_size) s << " paged" << page_size;
  if (key_growth > 0) s << " key-growth" << key_growth;
  if (workspace) s << " workspace splits" << num_splits;
  if (q_block || kv_block) s << " block-descales(" << q_block << "," << kv_block << ")";
  if (wide_v_factors) s << " wide-v-factors";
  if (sinks) s << " sinks";
  if (!with_lse) s << " no-lse";
  return s.str();
}

std::string FwdCase::repro() const {
  std::ostringstream s;
  s << "c.dtype = " << dtype_enum(dtype) << "; c.batch = " << batch << "; c.seqlen_q = " << seqlen_q
    << "; c.seqlen_k = " << seqlen_k << "; c.heads_q = " << heads_q << "; c.heads_kv = " << heads_kv
    << "; c.head_dim = " << head_dim << "; c.head_dim_v = " << head_dim_v << "; c.causal = " << causal
    << "; c.window_left = " << window_left << "; c.window_right = " << window_right
    << "; c.softcap = " << float_literal(softcap) << "; c.softmax_scale = " << float_literal(softmax_scale)
    << "; c.with_lse = " << with_lse << "; c.layout = " << layout_name(layout) << ";";
  if (!varlen_q.empty()) s << " c.varlen_q = " << list(varlen_q) << ";";
  if (!varlen_k.empty()) s << " c.varlen_k = " << list(varlen_k) << ";";
  if (!seqused_q.empty()) s << " c.seqused_q = " << list(seqused_q) << ";";
  if (!seqused_k.empty()) s << " c.seqused_k = " << list(seqused_k) << ";";
  if (guard_rows) s << " c.guard_rows = " << guard_rows << ";";
  if (page_size) s << " c.page_size = " << page_size << ";";
  if (key_growth != 0) s << " c.key_growth = " << float_literal(key_growth) << ";";
  if (workspace) s << " c.workspace = true; c.num_splits = " << num_splits << ";";
  if (q_block) s << " c.q_block = " << q_block << ";";
  if (kv_block) s << " c.kv_block = " << kv_block << ";";
  if (wide_v_factors) s << " c.wide_v_factors = true;";
  if (sinks) s << " c.sinks = true;";
  return s.str();
}

namespace {

int elem_bytes(fa3_dtype t) { return t == FA3_DTYPE_E4M3 ? 1 : 2; }

// Encodes one value in the device dtype.
void store_elem(uint8_t* dst, fa3_dtype t, float x) {
  if (t == FA3_DTYPE_E4M3) {
    *dst = ref::to_e4m3_bits(x);
  } else {
    const uint16_t b = t == FA3_DTYPE_BF16 ? ref::to_bf16_bits(x) : ref::to_fp16_bits(x);
    std::memcpy(dst, &b, 2);
  }
}
float from_bits16(uint16_t b, fa3_dtype t) { return t == FA3_DTYPE_BF16 ? ref::from_bf16_bits(b) : ref::from_fp16_bits(b); }
float load_elem(const uint8_t* src, fa3_dtype t) {
  uint16_t b;
  std::memcpy(&b, src, 2);
  return from_bits16(b, t);
}

// Element strides of a [rows][heads][d] tensor in the case's layout (rows: per batch entry, or the
// packed rows; guard rows included).
using Strides = FwdPlan::Strides;
Strides layout_strides(Layout l, int rows, int heads, int d) {
  switch (l) {
    case Layout::kBSHDPadded: {
      const int64_t row = int64_t(heads) * d + 64;  // 64 extra elements per row: nothing is contiguous
      return {row * rows + 128, row, d};
    }
    case Layout::kBHSD: return {int64_t(heads) * rows * d, d, int64_t(rows) * d};
    default: return {int64_t(rows) * heads * d, int64_t(heads) * d, d};
  }
}

// Standard-normal values rounded to the dtype (fp8: scaled up to use its range), encoded: a pool
// drawn once per dtype from a fixed seed. Tensors are filled by sampling it at random indices
// (from rng()), which is about ten times faster than drawing normals and leaves the fill a function
// of rng()'s state alone.
const std::vector<uint8_t>& normal_pool(fa3_dtype t) {
  constexpr size_t kPool = size_t(1) << 20;
  static std::mutex mutex;
  static std::map<int, std::vector<uint8_t>> pools;
  std::lock_guard<std::mutex> lock(mutex);
  std::vector<uint8_t>& pool = pools[static_cast<int>(t)];
  if (pool.empty()) {
    std::mt19937 gen(0x5eed0000u + static_cast<unsigned>(t));
    std::normal_distribution<float> dist(0.f, 1.f);
    const int eb = elem_bytes(t);
    pool.resize(kPool * eb);
    for (size_t i = 0; i < kPool; ++i) store_elem(pool.data() + i * eb, t, dist(gen) * (t == FA3_DTYPE_E4M3 ? 8.f : 1.f));
  }
  return pool;
}

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Fills a host image (every element, padding included) with pool values.
void fill_random(std::vector<uint8_t>& img, fa3_dtype t) {
  const std::vector<uint8_t>& pool = normal_pool(t);
  const int eb = elem_bytes(t);
  const size_t n = img.size() / eb, mask = pool.size() / eb - 1;  // pool size: a power of 2
  uint64_t state = (uint64_t(rng()()) << 32) | rng()();
  for (size_t i = 0; i < n; i += 3) {
    const uint64_t z = splitmix64(state);  // three 20-bit indices
    for (size_t k = 0; k < 3 && i + k < n; ++k)
      std::memcpy(img.data() + (i + k) * eb, pool.data() + ((z >> (20 * k)) & mask) * eb, eb);
  }
}

std::vector<int> per_batch(const std::vector<int>& given, int batch, int fallback, const char* what) {
  if (given.empty()) return std::vector<int>(batch, fallback);
  if (static_cast<int>(given.size()) != batch)
    throw std::invalid_argument(std::string("FwdCase.") + what + " has " + std::to_string(given.size()) +
                                " entries for batch " + std::to_string(batch));
  for (int x : given)
    if (x < 0) throw std::invalid_argument(std::string("FwdCase.") + what + " has a negative entry");
  return given;
}

// Greedy decomposition of an element offset by the strides, largest first (exact for layouts
// without overlap; coordinates past an extent mean padding).
std::vector<int64_t> decompose(int64_t off, std::vector<int64_t> strides) {
  std::vector<size_t> order(strides.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return strides[a] > strides[b]; });
  std::vector<int64_t> coord(strides.size() + 1, 0);
  for (size_t i : order)
    if (strides[i] > 0) {
      coord[i] = off / strides[i];
      off -= coord[i] * strides[i];
    }
  coord.back() = off;
  return coord;
}

}  // namespace

int64_t FwdPlan::kv_index(const Strides& s, int b, int j, int h, int x) const {
  if (paged) {
    const int page = page_table[size_t(b) * pages_per_seq + j / page_size];
    return int64_t(page) * s.batch + int64_t(j % page_size) * s.row + int64_t(h) * s.head + x;
  }
  return packed_k ? int64_t(k_row0[b] + j) * s.row + int64_t(h) * s.head + x
                  : int64_t(b) * s.batch + int64_t(j) * s.row + int64_t(h) * s.head + x;
}

std::string FwdPlan::describe_o(int64_t off) const {
  std::ostringstream s;
  s << "O offset " << off << ": ";
  if (off >= int64_t(o_elems) - 64 || off < 0) {
    s << "past the end of the tensor";
    return s.str();
  }
  int64_t b = 0, row, h, x;
  if (packed_q) {
    const auto c = decompose(off, {os.row, os.head});
    row = c[0], h = c[1], x = c[2];
  } else {
    const auto c = decompose(off, {os.batch, os.row, os.head});
    b = c[0], row = c[1], h = c[2], x = c[3];
  }
  const bool padding = h >= heads_q || x >= dv;
  if (packed_q) {
    s << "packed row " << row;
    int seq = -1;
    for (int i = 0; i < batch; ++i)
      if (row >= q_row0[i] && row < q_row0[i] + rows_q[i]) seq = i;
    if (seq >= 0)
      s << " = sequence " << seq << " row " << row - q_row0[seq] << " (seqused " << used_q[seq] << ")";
    else if (row < total_q)
      s << " (after the last sequence, inside total_q " << total_q << ")";
    else
      s << " (past total_q " << total_q << ")";
  } else {
    s << "batch " << b << " row " << row;
    if (row >= rows_alloc_q) s << " (gap between batch entries)";
    else if (row >= seqlen_q) s << " (guard row past seqlen_q " << seqlen_q << ")";
    else if (b < batch && row >= used_q[b]) s << " (past seqused_q " << used_q[b] << ")";
  }
  s << " head " << h << " x " << x << (padding ? " (row padding)" : "");
  return s.str();
}

std::string FwdPlan::describe_lse(int64_t off) const {
  std::ostringstream s;
  s << "LSE entry " << off << ": ";
  if (!with_lse) s << "(lse not passed) ";
  if (packed_q) {
    const int64_t h = off / total_q, r = off % total_q;
    if (h >= heads_q) return s.str() + "past the end";
    s << "head " << h << " packed row " << r;
  } else {
    const int64_t bh = off / seqlen_q, i = off % seqlen_q;
    if (bh >= int64_t(batch) * heads_q) return s.str() + "past the end";
    s << "batch " << bh / heads_q << " head " << bh % heads_q << " row " << i << " (seqused " << used_q[bh / heads_q]
      << ")";
  }
  return s.str();
}

std::vector<VarlenLengths> varlen_length_sets() {
  return {
      {{0, 1, 17, 128, 129, 300}, {5, 0, 1000, 17, 129, 700}},
      {{1000, 0, 64, 1}, {17, 300, 0, 1000}},
      {{255, 257, 191, 193}, {257, 255, 193, 191}},
  };
}
const std::pair<int, int> kVarlenWindows[5] = {{-1, -1}, {100, 0}, {30, 30}, {-1, 20}, {50, -1}};

std::vector<FwdCase> seqused_cases(bool causal) {
  std::vector<FwdCase> cases;
  // Dense rows, seqused_q only: rows past it stay untouched; masks align to the used lengths.
  FwdCase c;
  c.causal = causal;
  c.batch = 3;
  c.seqlen_q = 300;
  c.seqlen_k = 400;
  c.seqused_q = {0, 300, 129};
  cases.push_back(c);
  // Dense, seqused_k only (0: no key, O = 0).
  c = FwdCase();
  c.causal = causal;
  c.batch = 3;
  c.seqlen_q = 300;
  c.seqlen_k = 400;
  c.seqused_k = {1, 400, 0};
  c.heads_q = 8;
  c.heads_kv = 1;
  cases.push_back(c);
  // Dense, both, with guard rows after every batch entry, GQA and a window.
  c.seqused_q = {17, 0, 300};
  c.seqused_k = {400, 129, 255};
  c.guard_rows = 50;
  c.heads_kv = 2;
  c.window_left = causal ? 64 : 100;
  c.window_right = causal ? -1 : 30;
  c.layout = Layout::kBHSD;
  cases.push_back(c);
  // Packed rows plus seqused_q and seqused_k.
  c = FwdCase();
  c.causal = causal;
  c.batch = 3;
  c.varlen_q = {100, 0, 513};
  c.seqused_q = {50, 0, 513};
  c.varlen_k = {300, 17, 600};
  c.seqused_k = {300, 0, 257};
  c.head_dim = 64;
  c.guard_rows = 100;
  cases.push_back(c);
  // cu_seqlens_q with dense K and seqused_k (the decoding-cache layout without pages).
  c = FwdCase();
  c.causal = causal;
  c.batch = 4;
  c.varlen_q = {17, 1000, 0, 256};
  c.seqlen_k = 1200;
  c.seqused_k = {1200, 5, 0, 700};
  c.heads_q = 16;
  c.heads_kv = 2;
  c.guard_rows = 33;
  cases.push_back(c);
  // ... and seqused_q on top, other head dims, padded rows.
  c.seqused_q = {1, 999, 0, 128};
  c.head_dim = 192;
  c.head_dim_v = 128;
  c.layout = Layout::kBSHDPadded;
  cases.push_back(c);
  // cu_seqlens_k with dense queries (and seqused_q).
  c = FwdCase();
  c.causal = causal;
  c.batch = 3;
  c.seqlen_q = 200;
  c.varlen_k = {0, 1000, 129};
  c.seqused_q = {200, 7, 0};
  c.guard_rows = 20;
  cases.push_back(c);
  return cases;
}

FwdCase packed_head_dim_case(int dqk, int dv, Layout layout) {
  FwdCase c;
  c.batch = 5;
  c.varlen_q = {17, 0, 200, 1, 129};
  c.varlen_k = {300, 40, 0, 1, 129};
  c.head_dim = dqk;
  c.head_dim_v = dv;
  c.layout = layout;
  c.heads_q = 4;
  c.heads_kv = 2;
  c.guard_rows = 50;
  return c;
}

std::vector<FwdCase> seqlen_grid_cases() {
  std::vector<FwdCase> cases;
  for (int s : {1, 17, 1000, 4097})
    for (bool causal : {false, true}) {
      FwdCase c;
      c.seqlen_q = c.seqlen_k = s;
      c.heads_q = c.heads_kv = s > 1000 ? 1 : 2;
      c.causal = causal;
      cases.push_back(c);
    }
  return cases;
}

FwdPlan plan_fwd(const FwdCase& c) {
  FwdPlan P;
  P.batch = c.batch;
  P.heads_q = c.heads_q;
  P.heads_kv = c.heads_kv;
  P.dqk = c.head_dim;
  P.dv = c.head_dim_v ? c.head_dim_v : c.head_dim;
  P.paged = c.page_size > 0;
  P.packed_q = !c.varlen_q.empty();
  P.packed_k = !c.varlen_k.empty() && !P.paged;
  P.with_lse = c.with_lse;
  P.guard_rows = c.guard_rows;
  if (c.batch < 1 || c.guard_rows < 0) throw std::invalid_argument("FwdCase: batch < 1 or guard_rows < 0");
  P.rows_q = per_batch(c.varlen_q, c.batch, c.seqlen_q, "varlen_q");
  P.rows_k = per_batch(c.varlen_k, c.batch, c.seqlen_k, "varlen_k");
  P.used_q = per_batch(c.seqused_q, c.batch, 0, "seqused_q");
  P.used_k = per_batch(c.seqused_k, c.batch, 0, "seqused_k");
  for (int b = 0; b < c.batch; ++b) {
    if (c.seqused_q.empty()) P.used_q[b] = P.rows_q[b];
    if (c.seqused_k.empty()) P.used_k[b] = P.rows_k[b];
    if (P.used_q[b] > P.rows_q[b] || P.used_k[b] > P.rows_k[b])
      throw std::invalid_argument("FwdCase: seqused of batch " + std::to_string(b) + " exceeds its rows");
  }
  const int max_rows_q = *std::max_element(P.rows_q.begin(), P.rows_q.end());
  const int max_rows_k = *std::max_element(P.rows_k.begin(), P.rows_k.end());
  P.seqlen_q = P.packed_q ? std::max(1, max_rows_q) : c.seqlen_q;
  P.seqlen_k = !c.varlen_k.empty() ? std::max(1, max_rows_k) : c.seqlen_k;
  const int G = c.guard_rows;

  P.q_row0.assign(c.batch, 0);
  P.k_row0.assign(c.batch, 0);
  int sum_q = 0, sum_k = 0;
  for (int b = 0; b < c.batch; ++b) {
    if (P.packed_q) P.q_row0[b] = sum_q;
    if (P.packed_k) P.k_row0[b] = sum_k;
    sum_q += P.rows_q[b];
    sum_k += P.rows_k[b];
  }
  P.total_q = P.packed_q ? std::max(1, sum_q + G) : 0;
  P.total_k = P.packed_k ? std::max(1, sum_k + G) : 0;
  P.rows_alloc_q = P.packed_q ? P.total_q + G : P.seqlen_q + G;
  P.rows_alloc_k = P.packed_k ? P.total_k + G : P.seqlen_k + G;

  P.qs = layout_strides(c.layout, P.rows_alloc_q, c.heads_q, P.dqk);
  P.os = layout_strides(c.layout, P.rows_alloc_q, c.heads_q, P.dv);
  const int q_batches = P.packed_q ? 1 : c.batch;
  P.q_elems = size_t(P.qs.batch) * q_batches + 64;
  P.o_elems = size_t(P.os.batch) * q_batches + 64;

  if (P.paged) {
    P.page_size = c.page_size;
    P.pages_per_seq = (P.seqlen_k + c.page_size - 1) / c.page_size;
    P.num_pages = P.pages_per_seq * c.batch;
    P.page_table.assign(size_t(c.batch) * std::max(P.pages_per_seq, 1), 0);
    std::vector<int> perm(P.num_pages);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng());
    for (int i = 0; i < P.num_pages; ++i) P.page_table[i] = perm[i];
  }
  const int k_rows = P.paged ? c.page_size : P.rows_alloc_k;
  const int k_batches = P.paged ? P.num_pages : P.packed_k ? 1 : c.batch;
  P.ks = layout_strides(P.paged ? Layout::kBSHD : c.layout, k_rows, c.heads_kv, P.dqk);
  P.vs = layout_strides(P.paged ? Layout::kBSHD : c.layout, k_rows, c.heads_kv, P.dv);
  P.k_elems = size_t(P.ks.batch) * k_batches + 64;
  P.v_elems = size_t(P.vs.batch) * k_batches + 64;
  P.lse_elems = (P.packed_q ? size_t(c.heads_q) * P.total_q : size_t(c.batch) * c.heads_q * P.seqlen_q) + 64 + G;
  return P;
}

float sink_logit(int h) {
  static const float logits[8] = {-2.f, 0.5f, 3.f, -0.75f, 1.25f, 6.f, -4.f, 2.25f};
  return logits[h % 8];
}

FwdData make_fwd_data(const FwdCase& c, bool reference_inputs) {
  FwdData d;
  d.c = c;
  d.plan = plan_fwd(c);
  const FwdPlan& P = d.plan;
  const int dqk = P.dqk, dv = P.dv;
  auto& p = d.prob;
  p.batch = c.batch;
  p.heads_q = c.heads_q;
  p.heads_kv = c.heads_kv;
  p.head_dim_qk = dqk;
  p.head_dim_v = dv;
  p.softmax_scale = c.softmax_scale;
  p.causal = c.causal;
  p.window_left = c.window_left;
  p.window_right = c.window_right;
  p.softcap = c.softcap;
  p.seqlen_q = P.used_q;  // what the attention sees; masks align to these lengths
  p.seqlen_k = P.used_k;
  // fp8 descales of q, k, v: a different factor per (batch, kv head), so a kernel that reads the
  // wrong entry shows.
  const float descale[3] = {0.5f, 0.25f, 0.75f};
  auto descale_at = [&](int which, int b, int kv_head) {
    return descale[which] * (1.f + 0.25f * float((3 * b + 5 * kv_head + which) % 4));
  };
  const int group = c.heads_q / c.heads_kv;
  // Block descales (c.q_block, c.kv_block): a factor in [0.5, 2] per (sequence, head, block).
  const int blocks_q = c.q_block > 0 ? (P.seqlen_q + c.q_block - 1) / c.q_block : 0;
  const int blocks_kv = c.kv_block > 0 ? (P.seqlen_k + c.kv_block - 1) / c.kv_block : 0;
  auto block_at = [&](int which, int b, int head, int pos) {
    const int size = which == 0 ? c.q_block : c.kv_block;
    if (size == 0) return 1.f;
    const int k = (7 * b + 3 * head + 5 * (pos / size) + 4 * which) % 13;
    if (which == 2 && c.wide_v_factors) return pos / size == 1 ? 0.f : std::ldexp(1.f, k - 6);
    return 0.5f + 0.125f * float(k);
  };

  auto& a = d.args;
  a.dtype = c.dtype;
  a.out_dtype = c.dtype == FA3_DTYPE_E4M3 ? FA3_DTYPE_BF16 : c.dtype;
  a.batch = c.batch;
  a.seqlen_q = P.seqlen_q;
  a.seqlen_k = P.seqlen_k;
  a.heads_q = c.heads_q;
  a.heads_kv = c.heads_kv;
  a.head_dim_qk = dqk;
  a.head_dim_v = dv;
  a.softmax_scale = c.softmax_scale;
  a.causal = c.causal;
  a.window_left = c.window_left;
  a.window_right = c.window_right;
  a.softcap = c.softcap;
  const int eb = elem_bytes(c.dtype);
  d.total_q = P.total_q;

  // Fill host images (unused padding gets random values too) and the logical reference inputs.
  std::vector<uint8_t> hq(P.q_elems * eb), hk(P.k_elems * eb), hv(P.v_elems * eb);
  for (auto* img : {&hq, &hk, &hv}) fill_random(*img, c.dtype);
  // Guard rows past the tensors' rows hold NaN (all bits set: NaN in fp16, bf16 and e4m3): rows
  // the contract says are never read.
  const int G = c.guard_rows;
  auto nan_rows = [&](std::vector<uint8_t>& img, const Strides& s, bool packed, int rows, int heads, int dim) {
    for (int b = 0; b < (packed ? 1 : c.batch); ++b)
      for (int r = rows; r < rows + G; ++r)
        for (int h = 0; h < heads; ++h)
          std::memset(img.data() + (int64_t(b) * s.batch + int64_t(r) * s.row + int64_t(h) * s.head) * eb, 0xFF,
                      size_t(dim) * eb);
  };
  if (G > 0) {
    nan_rows(hq, P.qs, P.packed_q, P.packed_q ? P.total_q : P.seqlen_q, c.heads_q, dqk);
    if (!P.paged) {
      nan_rows(hk, P.ks, P.packed_k, P.packed_k ? P.total_k : P.seqlen_k, c.heads_kv, dqk);
      nan_rows(hv, P.vs, P.packed_k, P.packed_k ? P.total_k : P.seqlen_k, c.heads_kv, dv);
    }
  }
  // Pages that are not a multiple of 16 rows are gathered row by row (kv_gather.cuh), which reads
  // only the sequences' own keys: every other element of the cache is NaN, so that a gather past a
  // sequence, from a wrong page or without its zero fill shows. (TMA boxes read past a sequence's
  // last key inside its last box: those rows stay finite for the other page sizes.)
  if (P.paged && c.page_size % 16 != 0) {
    auto poison_unused = [&](std::vector<uint8_t>& img, int dim, bool values) {
      std::vector<char> used(img.size() / eb, 0);
      for (int b = 0; b < c.batch; ++b)
        for (int j = 0; j < P.used_k[b]; ++j)
          for (int h = 0; h < c.heads_kv; ++h)
            for (int x = 0; x < dim; ++x) used[values ? P.v_index(b, j, h, x) : P.k_index(b, j, h, x)] = 1;
      for (size_t e = 0; e < used.size(); ++e)
        if (!used[e]) std::memset(img.data() + e * eb, 0xFF, eb);
    };
    poison_unused(hk, dqk, false);
    poison_unused(hv, dv, true);
  }
  if (c.key_growth > 0 && c.dtype != FA3_DTYPE_E4M3)
    for (int b = 0; b < c.batch; ++b)
      for (int j = 0; j < p.seqlen_k[b]; ++j)
        for (int h = 0; h < c.heads_kv; ++h)
          for (int x = 0; x < dqk; ++x) {
            uint8_t* e = hk.data() + P.k_index(b, j, h, x) * eb;
            const float f = 1.f + c.key_growth * float(p.seqlen_k[b] - 1 - j) / float(p.seqlen_k[b]);
            store_elem(e, c.dtype, load_elem(e, c.dtype) * f);
          }
  auto value = [&](const std::vector<uint8_t>& img, int64_t idx, float scale) {
    if (c.dtype == FA3_DTYPE_E4M3) return ref::from_e4m3_bits(img[idx]) * scale;
    return load_elem(img.data() + idx * eb, c.dtype);
  };
  if (reference_inputs) {
    d.in.q.resize(c.batch);
    d.in.k.resize(c.batch);
    d.in.v.resize(c.batch);
    for (int b = 0; b < c.batch; ++b) {
      auto& q = d.in.q[b];
      q.reserve(size_t(p.seqlen_q[b]) * c.heads_q * dqk);
      for (int i = 0; i < p.seqlen_q[b]; ++i)
        for (int h = 0; h < c.heads_q; ++h)
          for (int x = 0; x < dqk; ++x)
            q.push_back(value(hq, P.q_index(b, i, h, x), descale_at(0, b, h / group) * block_at(0, b, h, i)));
      for (int j = 0; j < p.seqlen_k[b]; ++j)
        for (int h = 0; h < c.heads_kv; ++h) {
          const float fk = descale_at(1, b, h) * block_at(1, b, h, j), fv = descale_at(2, b, h) * block_at(2, b, h, j);
          for (int x = 0; x < dqk; ++x) d.in.k[b].push_back(value(hk, P.k_index(b, j, h, x), fk));
          for (int x = 0; x < dv; ++x) d.in.v[b].push_back(value(hv, P.v_index(b, j, h, x), fv));
        }
    }
  }

  d.q = DeviceBuffer(hq.size());
  d.q.upload(hq.data(), hq.size());
  d.k = DeviceBuffer(hk.size());
  d.k.upload(hk.data(), hk.size());
  d.v = DeviceBuffer(hv.size());
  d.v.upload(hv.data(), hv.size());
  d.out = DeviceBuffer(P.o_elems * 2);
  d.lse = DeviceBuffer(P.lse_elems * sizeof(float));
  a.q = {d.q.get(), P.qs.batch, P.qs.row, P.qs.head};
  a.k = {d.k.get(), P.ks.batch, P.ks.row, P.ks.head};
  a.v = {d.v.get(), P.vs.batch, P.vs.row, P.vs.head};
  a.out = {d.out.get(), P.os.batch, P.os.row, P.os.head};
  a.lse = c.with_lse ? static_cast<float*>(d.lse.get()) : nullptr;
  auto upload_ints = [](DeviceBuffer& buf, const std::vector<int>& v) {
    buf = DeviceBuffer(v.size() * 4);
    buf.upload(v.data(), v.size() * 4);
    return static_cast<const int32_t*>(buf.get());
  };
  auto cu = [&](const std::vector<int>& row0, const std::vector<int>& rows) {
    std::vector<int> v(row0);
    v.push_back(row0.back() + rows.back());
    return v;
  };
  if (P.packed_q) {
    a.cu_seqlens_q = upload_ints(d.cu_q, cu(P.q_row0, P.rows_q));
    a.total_q = P.total_q;
  }
  if (P.packed_k) {
    a.cu_seqlens_k = upload_ints(d.cu_k, cu(P.k_row0, P.rows_k));
    a.total_k = P.total_k;
  }
  if (!c.seqused_q.empty()) a.seqused_q = upload_ints(d.seqused_q, P.used_q);
  // Paged: the keys of packed sequences are their pages' (seqused_k); dense lengths need none.
  if (!c.seqused_k.empty() || (P.paged && !c.varlen_k.empty())) a.seqused_k = upload_ints(d.seqused_k, P.used_k);
  if (P.paged) {
    a.page_table = upload_ints(d.page_table, P.page_table);
    a.page_table_batch_stride = P.pages_per_seq;
    a.page_size = c.page_size;
    a.num_pages = P.num_pages;
  }
  if (c.dtype == FA3_DTYPE_E4M3) {
    std::vector<float> ds;
    for (int which = 0; which < 3; ++which)
      for (int b = 0; b < c.batch; ++b)
        for (int h = 0; h < c.heads_kv; ++h) ds.push_back(descale_at(which, b, h));
    d.descale = DeviceBuffer(ds.size() * 4);
    d.descale.upload(ds.data(), ds.size() * 4);
    const float* base = static_cast<const float*>(d.descale.get());
    a.q_descale = base;
    a.k_descale = base + c.batch * c.heads_kv;
    a.v_descale = base + 2 * c.batch * c.heads_kv;
    a.descale_batch_stride = c.heads_kv;
    a.descale_head_stride = 1;
  }
  if (c.q_block > 0 || c.kv_block > 0) {
    // [batch][heads][blocks] per operand: Q's by query head, K's and V's by kv head.
    const size_t nq = size_t(c.batch) * c.heads_q * blocks_q, nkv = size_t(c.batch) * c.heads_kv * blocks_kv;
    std::vector<float> f;
    for (int b = 0; b < c.batch; ++b)
      for (int h = 0; h < c.heads_q; ++h)
        for (int i = 0; i < blocks_q; ++i) f.push_back(block_at(0, b, h, i * c.q_block));
    for (int which = 1; which < 3; ++which)
      for (int b = 0; b < c.batch; ++b)
        for (int h = 0; h < c.heads_kv; ++h)
          for (int j = 0; j < blocks_kv; ++j) f.push_back(block_at(which, b, h, j * c.kv_block));
    d.block_descale = DeviceBuffer(std::max<size_t>(f.size(), 1) * 4);
    if (!f.empty()) d.block_descale.upload(f.data(), f.size() * 4);
    const float* base = static_cast<const float*>(d.block_descale.get());
    if (c.q_block > 0)
      a.q_block_descale = {base, int64_t(c.heads_q) * blocks_q, blocks_q, c.q_block, blocks_q};
    if (c.kv_block > 0) {
      a.k_block_descale = {base + nq, int64_t(c.heads_kv) * blocks_kv, blocks_kv, c.kv_block, blocks_kv};
      a.v_block_descale = {base + nq + nkv, int64_t(c.heads_kv) * blocks_kv, blocks_kv, c.kv_block, blocks_kv};
    }
  }
  if (c.sinks) {
    std::vector<float> logits(c.heads_q);
    for (int h = 0; h < c.heads_q; ++h) logits[h] = sink_logit(h);
    p.sinks.assign(logits.begin(), logits.end());
    d.sinks = DeviceBuffer(logits.size() * 4);
    d.sinks.upload(logits.data(), logits.size() * 4);
    a.sinks = static_cast<const float*>(d.sinks.get());
  }
  if (c.workspace) {
    a.num_splits = c.num_splits;
    size_t bytes = 0;
    const Status st = fa3::workspace_size(a, &bytes);
    if (!st.ok()) throw std::invalid_argument("workspace_size: " + st.message());
    d.workspace = DeviceBuffer(std::max<size_t>(bytes, 16));
    d.workspace.fill_bytes(0xFF);  // NaN partials: an unwritten slot the combine reads shows
    a.workspace = d.workspace.get();
    a.workspace_bytes = bytes;
  }
  poison_outputs(d);
  return d;
}

void poison_outputs(FwdData& d) {
  d.out.fill_bytes(0xFF);  // 0xFFFF is a NaN in fp16 and bf16
  d.lse.fill_bytes(0xFF);  // and 0xFFFFFFFF in fp32
}

StrayWrites find_stray_writes(const FwdPlan& P, const uint16_t* out, size_t out_elems, const uint32_t* lse,
                              size_t lse_elems) {
  StrayWrites r;
  // r.where lists the first 4 stray O elements and the first 2 LSE entries.
  std::vector<char> owned(out_elems, 0);
  for (int b = 0; b < P.batch; ++b)
    for (int i = 0; i < P.used_q[b]; ++i)
      for (int h = 0; h < P.heads_q; ++h) {
        const int64_t base = P.o_index(b, i, h, 0);
        if (base < 0 || base + P.dv > int64_t(out_elems))
          throw std::logic_error("FwdPlan: O row outside the buffer (harness bug)");
        for (int x = 0; x < P.dv; ++x) {
          if (owned[base + x]) throw std::logic_error("FwdPlan: O elements alias (harness bug)");
          owned[base + x] = 1;
        }
      }
  for (size_t i = 0; i < out_elems; ++i)
    if (!owned[i] && out[i] != 0xFFFFu) {
      ++r.o;
      if (r.o <= 4) r.where += (r.where.empty() ? "" : "; ") + P.describe_o(int64_t(i));
    }
  std::vector<char> lse_owned(lse_elems, 0);
  if (P.with_lse)
    for (int b = 0; b < P.batch; ++b)
      for (int h = 0; h < P.heads_q; ++h)
        for (int i = 0; i < P.used_q[b]; ++i) {
          const int64_t idx = P.lse_index(b, h, i);
          if (idx < 0 || idx >= int64_t(lse_elems) || lse_owned[idx])
            throw std::logic_error("FwdPlan: LSE entry outside the buffer or aliased (harness bug)");
          lse_owned[idx] = 1;
        }
  for (size_t i = 0; i < lse_elems; ++i)
    if (!lse_owned[i] && lse[i] != 0xFFFFFFFFu) {
      ++r.lse;
      if (r.lse <= 2) r.where += (r.where.empty() ? "" : "; ") + P.describe_lse(int64_t(i));
    }
  if (r.o > 4 || r.lse > 2) r.where += "; ...";
  return r;
}

FwdOutputs download_outputs(const FwdData& d) {
  const FwdPlan& P = d.plan;
  const fa3_dtype out_dtype = d.args.out_dtype;
  std::vector<uint16_t> ho(d.out.bytes() / 2);
  d.out.download(ho.data(), ho.size() * 2);
  std::vector<uint32_t> hl(d.lse.bytes() / 4);
  d.lse.download(hl.data(), hl.size() * 4);
  FwdOutputs r;
  r.stray = find_stray_writes(P, ho.data(), std::min(ho.size(), P.o_elems), hl.data(), std::min(hl.size(), P.lse_elems));
  for (int b = 0; b < P.batch; ++b) {
    const int sq = P.used_q[b];
    std::vector<double> o, l;
    o.reserve(size_t(sq) * P.heads_q * P.dv);
    for (int i = 0; i < sq; ++i)
      for (int h = 0; h < P.heads_q; ++h)
        for (int x = 0; x < P.dv; ++x) o.push_back(from_bits16(ho[P.o_index(b, i, h, x)], out_dtype));
    for (int h = 0; h < P.heads_q; ++h)
      for (int i = 0; i < sq; ++i) {
        float f;
        std::memcpy(&f, &hl[P.lse_index(b, h, i)], 4);
        l.push_back(f);
      }
    r.o.push_back(std::move(o));
    r.lse.push_back(std::move(l));
  }
  return r;
}

Errors compare(const FwdOutputs& got, const ref::FwdResult& want, bool check_lse) {
  Errors e;
  e.stray_o = got.stray.o;
  e.stray_lse = got.stray.lse;
  e.stray_where = got.stray.where;
  if (got.o.size() != want.o.size() || got.lse.size() != want.lse.size())
    throw std::logic_error("compare: got and want have different batch counts");
  for (size_t b = 0; b < want.o.size(); ++b)
    if (got.o[b].size() != want.o[b].size() || (check_lse && got.lse[b].size() != want.lse[b].size()))
      throw std::logic_error("compare: got and want differ in shape at batch " + std::to_string(b));
  double num = 0, den = 0;
  for (size_t b = 0; b < want.o.size(); ++b) {
    for (size_t i = 0; i < want.o[b].size(); ++i) {
      const double g = got.o[b][i], w = want.o[b][i];
      if (std::isnan(g)) {
        ++e.nan_count;
        continue;
      }
      num += (g - w) * (g - w);
      den += w * w;
      e.max_abs = std::max(e.max_abs, std::fabs(g - w));
      e.max_ref = std::max(e.max_ref, std::fabs(w));
    }
    if (!check_lse) continue;
    for (size_t i = 0; i < want.lse[b].size(); ++i) {
      const double g = got.lse[b][i], w = want.lse[b][i];
      if (std::isinf(w) || std::isinf(g) || std::isnan(g)) {
        if (!(std::isinf(w) && std::isinf(g) && (w < 0) == (g < 0))) ++e.lse_mismatch;
        continue;
      }
      const double err = std::fabs(g - w) / std::max(1.0, std::fabs(w));
      if (err > e.lse_max_err) {  // where: lse[b] is [heads_q][seqlen_q[b]]
        e.lse_max_err = err;
        e.lse_worst = "batch " + std::to_string(b) + " entry " + std::to_string(i) + " of " +
                      std::to_string(want.lse[b].size()) + ": " + std::to_string(g) + " vs " + std::to_string(w);
      }
    }
  }
  e.rel_fro = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  return e;
}

std::string Errors::summary() const {
  char buf[320];
  std::snprintf(buf, sizeof buf,
                "rel_fro %.2e, max_abs %.2e (max|ref| %.2f), lse err %.2e, NaN %ld, lse mismatches %ld, "
                "stray writes O %ld LSE %ld",
                rel_fro, max_abs, max_ref, lse_max_err, nan_count, lse_mismatch, stray_o, stray_lse);
  return std::string(buf) + (lse_worst.empty() ? "" : " (largest LSE error: " + lse_worst + ")") +
         (stray_where.empty() ? "" : " [" + stray_where + "]");
}

double fp8_tolerance(const FwdCase& c) {
  auto total = [](const std::vector<int>& v) { return std::accumulate(v.begin(), v.end(), 0L); };
  const long rows = !c.seqused_q.empty() ? total(c.seqused_q)
                    : !c.varlen_q.empty() ? total(c.varlen_q)
                                          : long(c.batch) * c.seqlen_q;
  if (rows * c.heads_q <= 16) return 1.0 / 16 + 5e-3;
  // A saturating softcap (c <= 1: P nearly flat) with K/V block descales: each key block's P v(n)
  // is rounded to e4m3 against the row's largest (descale.cuh), so every block carries a rounding
  // bias of its own that a flat P does not average away; 3.6e-2 measured (H100, 2026-12-06, sq17
  // sk300). The factors themselves are checked exactly elsewhere: the same kernel agrees with the
  // per-head softcap kernel on inputs pre-scaled by power-of-two block factors (python/tests,
  // test_fp8_softcap_block_descales_match_per_head).
  if (c.softcap > 0.f && c.softcap <= 1.f && c.kv_block > 0) return 5e-2;
  return 3e-2;
}

double fp8_lse_tolerance(const FwdCase& c) {
  return 2e-2 * std::max(1.0, c.head_dim / 128.0);
}

bool is_close(const Errors& e, double rel_tol, std::string* why, double lse_tol) {
  // Written as !(x <= bound) so that a NaN error fails.
  const bool ok = e.nan_count == 0 && e.rel_fro <= rel_tol && e.max_abs <= 5 * rel_tol * std::max(1.0, e.max_ref) &&
                  e.lse_mismatch == 0 && e.lse_max_err <= lse_tol && e.stray_o == 0 && e.stray_lse == 0;
  if (!ok && why) *why = e.summary();
  return ok;
}

void expect_close(const Errors& e, const std::string& what, double rel_tol, double lse_tol) {
  EXPECT_EQ(e.nan_count, 0) << what << ": " << e.summary();
  EXPECT_LE(e.rel_fro, rel_tol) << what << ": " << e.summary();
  EXPECT_LE(e.max_abs, 5 * rel_tol * std::max(1.0, e.max_ref)) << what << ": " << e.summary();
  EXPECT_EQ(e.lse_mismatch, 0) << what << ": " << e.summary();
  EXPECT_LE(e.lse_max_err, lse_tol) << what << ": " << e.summary();
  EXPECT_EQ(e.stray_o, 0) << what << ": output elements no sequence owns were written: " << e.summary();
  EXPECT_EQ(e.stray_lse, 0) << what << ": LSE entries no sequence owns were written: " << e.summary();
}

}  // namespace fa3::test
