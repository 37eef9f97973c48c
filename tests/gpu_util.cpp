#include "tests/gpu_util.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
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

std::mt19937& rng() {
  static std::mt19937 gen = [] {
    const unsigned seed = std::random_device{}();
    std::printf("[fa3 tests] random seed %u\n", seed);
    return std::mt19937(seed);
  }();
  return gen;
}

std::string FwdCase::name() const {
  std::ostringstream s;
  s << fa3::dtype_name(dtype) << " b" << batch << " sq" << seqlen_q << " sk" << seqlen_k << " h" << heads_q << "/"
    << heads_kv << " d" << head_dim;
  if (head_dim_v && head_dim_v != head_dim) s << "/" << head_dim_v;
  if (causal) s << " causal";
  if (window_left >= 0 || window_right >= 0) s << " window(" << window_left << "," << window_right << ")";
  if (softcap > 0) s << " softcap" << softcap;
  if (layout == Layout::kBSHDPadded) s << " padded-rows";
  if (layout == Layout::kBHSD) s << " bhsd";
  if (!varlen_q.empty()) s << " varlen";
  if (page_size) s << " paged" << page_size;
  if (key_growth > 0) s << " key-growth" << key_growth;
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
float load_elem(const uint8_t* src, fa3_dtype t) {
  uint16_t b;
  std::memcpy(&b, src, 2);
  return t == FA3_DTYPE_BF16 ? ref::from_bf16_bits(b) : ref::from_fp16_bits(b);
}

// Element strides of a [rows][heads][d] tensor in the case's layout; returns the element count.
struct Strides {
  int64_t batch, row, head;
};
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

// Random standard-normal values rounded to the dtype (fp8: scaled up to use its range).
std::vector<float> random_values(size_t n, fa3_dtype t) {
  std::normal_distribution<float> dist(0.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng()) * (t == FA3_DTYPE_E4M3 ? 8.f : 1.f);
  ref::round_vec(v, t);
  return v;
}

}  // namespace

FwdData make_fwd_data(const FwdCase& c) {
  FwdData d;
  d.c = c;
  const int dqk = c.head_dim, dv = c.head_dim_v ? c.head_dim_v : c.head_dim;
  const bool varlen = !c.varlen_q.empty();
  auto& p = d.prob;
  p.batch = c.batch;
  p.heads_q = c.heads_q;
  p.heads_kv = c.heads_kv;
  p.head_dim_qk = dqk;
  p.head_dim_v = dv;
  p.causal = c.causal;
  p.window_left = c.window_left;
  p.window_right = c.window_right;
  p.softcap = c.softcap;
  for (int b = 0; b < c.batch; ++b) {
    p.seqlen_q.push_back(varlen ? c.varlen_q[b] : c.seqlen_q);
    p.seqlen_k.push_back(varlen ? c.varlen_k[b] : c.seqlen_k);
  }
  const int max_sq = *std::max_element(p.seqlen_q.begin(), p.seqlen_q.end());
  const int max_sk = *std::max_element(p.seqlen_k.begin(), p.seqlen_k.end());
  const float descale[3] = {0.5f, 0.25f, 0.75f};  // fp8: q, k, v

  auto& a = d.args;
  a.dtype = c.dtype;
  a.out_dtype = c.dtype == FA3_DTYPE_E4M3 ? FA3_DTYPE_BF16 : c.dtype;
  a.batch = c.batch;
  a.seqlen_q = max_sq;
  a.seqlen_k = max_sk;
  a.heads_q = c.heads_q;
  a.heads_kv = c.heads_kv;
  a.head_dim_qk = dqk;
  a.head_dim_v = dv;
  a.causal = c.causal;
  a.window_left = c.window_left;
  a.window_right = c.window_right;
  a.softcap = c.softcap;
  const int eb = elem_bytes(c.dtype);

  // Q and O: [batch][max_sq] rows, or packed [total_q] rows for varlen.
  std::vector<int> q_row0(c.batch, 0), k_row0(c.batch, 0);
  int total_q = 0, total_k = 0;
  for (int b = 0; b < c.batch; ++b) {
    q_row0[b] = total_q;
    k_row0[b] = total_k;
    total_q += p.seqlen_q[b];
    total_k += p.seqlen_k[b];
  }
  d.total_q = total_q;
  const int q_rows = varlen ? total_q : max_sq, q_batches = varlen ? 1 : c.batch;
  const Strides qs = layout_strides(c.layout, q_rows, c.heads_q, dqk);
  const Strides os = layout_strides(c.layout, q_rows, c.heads_q, dv);
  auto q_index = [&](int b, int i, int h, int x, const Strides& s) {
    return varlen ? int64_t(q_row0[b] + i) * s.row + int64_t(h) * s.head + x
                  : int64_t(b) * s.batch + int64_t(i) * s.row + int64_t(h) * s.head + x;
  };
  const size_t q_elems = size_t(qs.batch) * q_batches + 64, o_elems = size_t(os.batch) * q_batches + 64;

  // K and V: fixed [batch][max_sk], packed varlen [total_k], or a shuffled page pool.
  const bool paged = c.page_size > 0;
  int pages_per_seq = paged ? (max_sk + c.page_size - 1) / c.page_size : 0, num_pages = pages_per_seq * c.batch;
  std::vector<int> page_table(size_t(c.batch) * std::max(pages_per_seq, 1));
  if (paged) {
    std::vector<int> perm(num_pages);
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng());
    for (int i = 0; i < num_pages; ++i) page_table[i] = perm[i];
  }
  const int k_rows = paged ? c.page_size : varlen ? total_k : max_sk;
  const int k_batches = paged ? num_pages : varlen ? 1 : c.batch;
  const Strides ks = layout_strides(paged ? Layout::kBSHD : c.layout, k_rows, c.heads_kv, dqk);
  const Strides vs = layout_strides(paged ? Layout::kBSHD : c.layout, k_rows, c.heads_kv, dv);
  auto k_index = [&](int b, int j, int h, int x, const Strides& s) {
    if (paged) {
      const int page = page_table[size_t(b) * pages_per_seq + j / c.page_size];
      return int64_t(page) * s.batch + int64_t(j % c.page_size) * s.row + int64_t(h) * s.head + x;
    }
    return varlen ? int64_t(k_row0[b] + j) * s.row + int64_t(h) * s.head + x
                  : int64_t(b) * s.batch + int64_t(j) * s.row + int64_t(h) * s.head + x;
  };
  const size_t k_elems = size_t(ks.batch) * k_batches + 64, v_elems = size_t(vs.batch) * k_batches + 64;

  // Fill host images (unused padding gets random values too) and the logical reference inputs.
  std::vector<uint8_t> hq(q_elems * eb), hk(k_elems * eb), hv(v_elems * eb);
  for (auto* img : {&hq, &hk, &hv}) {
    const auto vals = random_values(img->size() / eb, c.dtype);
    for (size_t i = 0; i < vals.size(); ++i) store_elem(img->data() + i * eb, c.dtype, vals[i]);
  }
  if (c.key_growth > 0 && c.dtype != FA3_DTYPE_E4M3)
    for (int b = 0; b < c.batch; ++b)
      for (int j = 0; j < p.seqlen_k[b]; ++j)
        for (int h = 0; h < c.heads_kv; ++h)
          for (int x = 0; x < dqk; ++x) {
            uint8_t* e = hk.data() + k_index(b, j, h, x, ks) * eb;
            const float f = 1.f + c.key_growth * float(p.seqlen_k[b] - 1 - j) / float(p.seqlen_k[b]);
            store_elem(e, c.dtype, load_elem(e, c.dtype) * f);
          }
  auto value = [&](const std::vector<uint8_t>& img, int64_t idx, float scale) {
    if (c.dtype == FA3_DTYPE_E4M3) return ref::from_e4m3_bits(img[idx]) * scale;
    return load_elem(img.data() + idx * eb, c.dtype);
  };
  d.in.q.resize(c.batch);
  d.in.k.resize(c.batch);
  d.in.v.resize(c.batch);
  for (int b = 0; b < c.batch; ++b) {
    auto& q = d.in.q[b];
    for (int i = 0; i < p.seqlen_q[b]; ++i)
      for (int h = 0; h < c.heads_q; ++h)
        for (int x = 0; x < dqk; ++x) q.push_back(value(hq, q_index(b, i, h, x, qs), descale[0]));
    for (int j = 0; j < p.seqlen_k[b]; ++j)
      for (int h = 0; h < c.heads_kv; ++h) {
        for (int x = 0; x < dqk; ++x) d.in.k[b].push_back(value(hk, k_index(b, j, h, x, ks), descale[1]));
        for (int x = 0; x < dv; ++x) d.in.v[b].push_back(value(hv, k_index(b, j, h, x, vs), descale[2]));
      }
  }

  d.q = DeviceBuffer(hq.size());
  d.q.upload(hq.data(), hq.size());
  d.k = DeviceBuffer(hk.size());
  d.k.upload(hk.data(), hk.size());
  d.v = DeviceBuffer(hv.size());
  d.v.upload(hv.data(), hv.size());
  d.out = DeviceBuffer(o_elems * 2);
  d.lse = DeviceBuffer(size_t(c.batch) * c.heads_q * std::max(max_sq, total_q) * sizeof(float));
  a.q = {d.q.get(), qs.batch, qs.row, qs.head};
  a.k = {d.k.get(), ks.batch, ks.row, ks.head};
  a.v = {d.v.get(), vs.batch, vs.row, vs.head};
  a.out = {d.out.get(), os.batch, os.row, os.head};
  a.lse = c.with_lse ? static_cast<float*>(d.lse.get()) : nullptr;
  if (varlen) {
    std::vector<int> cq(c.batch + 1), ck(c.batch + 1);
    for (int b = 0; b <= c.batch; ++b) {
      cq[b] = b < c.batch ? q_row0[b] : total_q;
      ck[b] = b < c.batch ? k_row0[b] : total_k;
    }
    d.cu_q = DeviceBuffer(cq.size() * 4);
    d.cu_q.upload(cq.data(), cq.size() * 4);
    a.cu_seqlens_q = static_cast<const int32_t*>(d.cu_q.get());
    if (!paged) {
      d.cu_k = DeviceBuffer(ck.size() * 4);
      d.cu_k.upload(ck.data(), ck.size() * 4);
      a.cu_seqlens_k = static_cast<const int32_t*>(d.cu_k.get());
    }
  }
  if (paged) {
    d.page_table = DeviceBuffer(page_table.size() * 4);
    d.page_table.upload(page_table.data(), page_table.size() * 4);
    a.page_table = static_cast<const int32_t*>(d.page_table.get());
    a.page_table_batch_stride = pages_per_seq;
    a.page_size = c.page_size;
    a.num_pages = num_pages;
    d.seqused_k = DeviceBuffer(p.seqlen_k.size() * 4);
    d.seqused_k.upload(p.seqlen_k.data(), p.seqlen_k.size() * 4);
    a.seqused_k = static_cast<const int32_t*>(d.seqused_k.get());
  }
  if (c.dtype == FA3_DTYPE_E4M3) {
    std::vector<float> ds;
    for (int which = 0; which < 3; ++which)
      for (int i = 0; i < c.batch * c.heads_kv; ++i) ds.push_back(descale[which]);
    d.descale = DeviceBuffer(ds.size() * 4);
    d.descale.upload(ds.data(), ds.size() * 4);
    const float* base = static_cast<const float*>(d.descale.get());
    a.q_descale = base;
    a.k_descale = base + c.batch * c.heads_kv;
    a.v_descale = base + 2 * c.batch * c.heads_kv;
    a.descale_batch_stride = c.heads_kv;
    a.descale_head_stride = 1;
  }
  poison_outputs(d);
  return d;
}

void poison_outputs(FwdData& d) {
  d.out.fill_bytes(0xFF);  // 0xFFFF is a NaN in fp16 and bf16
  d.lse.fill_bytes(0xFF);  // and 0xFFFFFFFF in fp32
}

FwdOutputs download_outputs(const FwdData& d) {
  const auto& a = d.args;
  const bool varlen = a.cu_seqlens_q != nullptr;
  std::vector<uint8_t> ho(d.out.bytes());
  d.out.download(ho.data(), ho.size());
  std::vector<float> hl(d.lse.bytes() / 4);
  d.lse.download(hl.data(), d.lse.bytes());
  FwdOutputs r;
  int row0 = 0;
  for (int b = 0; b < a.batch; ++b) {
    const int sq = d.prob.seqlen_q[b];
    std::vector<double> o, l;
    for (int i = 0; i < sq; ++i)
      for (int h = 0; h < a.heads_q; ++h)
        for (int x = 0; x < a.head_dim_v; ++x) {
          const int64_t idx = (varlen ? int64_t(row0 + i) * a.out.row_stride
                                      : int64_t(b) * a.out.batch_stride + int64_t(i) * a.out.row_stride) +
                              int64_t(h) * a.out.head_stride + x;
          o.push_back(load_elem(ho.data() + idx * 2, a.out_dtype));
        }
    for (int h = 0; h < a.heads_q; ++h)
      for (int i = 0; i < sq; ++i)
        l.push_back(varlen ? hl[size_t(h) * d.total_q + row0 + i] : hl[(size_t(b) * a.heads_q + h) * a.seqlen_q + i]);
    r.o.push_back(std::move(o));
    r.lse.push_back(std::move(l));
    row0 += sq;
  }
  return r;
}

Errors compare(const FwdOutputs& got, const ref::FwdResult& want, bool check_lse) {
  Errors e;
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
      e.lse_max_err = std::max(e.lse_max_err, std::fabs(g - w) / std::max(1.0, std::fabs(w)));
    }
  }
  e.rel_fro = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  return e;
}

std::string Errors::summary() const {
  char buf[256];
  std::snprintf(buf, sizeof buf, "rel_fro %.2e, max_abs %.2e (max|ref| %.2f), lse err %.2e, NaN %ld, lse mismatches %ld",
                rel_fro, max_abs, max_ref, lse_max_err, nan_count, lse_mismatch);
  return buf;
}

void expect_close(const Errors& e, const std::string& what, double rel_tol) {
  EXPECT_EQ(e.nan_count, 0) << what << ": " << e.summary();
  EXPECT_LE(e.rel_fro, rel_tol) << what << ": " << e.summary();
  EXPECT_LE(e.max_abs, 5 * rel_tol * std::max(1.0, e.max_ref)) << what << ": " << e.summary();
  EXPECT_EQ(e.lse_mismatch, 0) << what << ": " << e.summary();
  EXPECT_LE(e.lse_max_err, 1e-3) << what << ": " << e.summary();
}

}  // namespace fa3::test
