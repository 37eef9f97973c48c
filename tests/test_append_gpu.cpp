// The KV-cache append with rotary (fa3_fwd_params: cache_seqlens, k_new / v_new, rotary_cos /
// rotary_sin, rotary_seqlens) and left-padded caches (leftpad_k) through the public forward: the
// cache afterwards bit for bit (the new keys rotated on the host with the kernel's arithmetic,
// every other element untouched), and the attention against the double-precision reference on the
// appended cache's keys from the left padding on, with the rotated queries. Contiguous and paged
// caches, both rotary layouts, partial rotary dims, no rotary, one and several new tokens, empty
// caches, GQA, causal and not, split-KV decodes, sinks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "reference/rounding.h"
#include "tests/gpu_util.h"

namespace fa3::test {
namespace {

struct AppendCase {
  fa3_dtype dtype = FA3_DTYPE_BF16;
  int heads_q = 8, heads_kv = 2, head_dim = 128;
  int seqlen_new = 1, seqlen_q = 1;
  int capacity = 300;  // cache rows per sequence (paged: pages x page_size)
  int page_size = 0;   // > 0: a paged cache with shuffled pages
  int rotary_dim = 64;  // 0: no rotary
  bool interleaved = false, causal = false, sinks = false;
  bool append = true;  // false: no new keys (cache_seqlens, and rotary of Q alone if rotary_dim)
  int num_splits = 0;  // with a workspace: the decode path's automatic (0) or explicit splits
  std::vector<int> cache_seqlens = {0, 17, 250};
  // Packed rows (empty: dense): each sequence's queries (cu_seqlens_q) and new keys (cu_seqlens_new).
  std::vector<int> q_lens, new_lens;
  std::vector<int> leftpad;        // leftpad_k: each sequence's first key row (empty: none)
  std::vector<int> rotary_starts;  // rotary_seqlens (empty: the rotary positions start at cache_seqlens)
  int extra_rows = 0;              // cache rows per sequence past seqlen_k (a longer batch stride)
  bool by_seqused = false;         // the keys per sequence as seqused_k, not cache_seqlens (nothing appended)
  std::string name() const {
    return std::string(dtype == FA3_DTYPE_BF16 ? "bf16" : "fp16") + " h" + std::to_string(heads_q) + "/" +
           std::to_string(heads_kv) + " d" + std::to_string(head_dim) + " new" + std::to_string(seqlen_new) + " sq" +
           std::to_string(seqlen_q) + (page_size ? " paged" + std::to_string(page_size) : "") + " rotary" +
           std::to_string(rotary_dim) + (interleaved ? " interleaved" : "") + (causal ? " causal" : "") +
           " splits" + std::to_string(num_splits) + (sinks ? " sinks" : "") + (append ? "" : " no-append") +
           (q_lens.empty() ? "" : " packed-q") + (new_lens.empty() ? "" : " packed-new") +
           (leftpad.empty() ? "" : " leftpad") + (rotary_starts.empty() ? "" : " rotary-seqlens") +
           (extra_rows ? " extra-rows" : "") + (by_seqused ? " seqused" : "");
  }
};

uint16_t to_bits(float x, fa3_dtype t) { return t == FA3_DTYPE_BF16 ? ref::to_bf16_bits(x) : ref::to_fp16_bits(x); }
float from_bits(uint16_t b, fa3_dtype t) { return t == FA3_DTYPE_BF16 ? ref::from_bf16_bits(b) : ref::from_fp16_bits(b); }

// Random values rounded to the dtype: their bits, and the floats they are.
struct Values {
  std::vector<uint16_t> bits;
  std::vector<float> f;
};
Values random_values(size_t n, fa3_dtype t, std::mt19937& g, float lo = -1.f, float hi = 1.f, bool normal = true) {
  Values v;
  std::normal_distribution<float> nd;
  std::uniform_real_distribution<float> ud(lo, hi);
  for (size_t i = 0; i < n; ++i) {
    v.bits.push_back(to_bits(normal ? nd(g) : ud(g), t));
    v.f.push_back(from_bits(v.bits.back(), t));
  }
  return v;
}

// The kernel's rotation (append_kv.cu): fp32 products and sums, each rounded, then one rounding to
// the dtype. In place on a row of `dim` floats (already dtype values).
void rotate(std::vector<float>& row, const AppendCase& c, const Values& cos, const Values& sin, int pos) {
  const int half = c.rotary_dim / 2;
  std::vector<float> out = row;
  for (int i = 0; i < half; ++i) {
    const int c1 = c.interleaved ? 2 * i : i, c2 = c.interleaved ? 2 * i + 1 : i + half;
    const float x1 = row[c1], x2 = row[c2], co = cos.f[size_t(pos) * half + i], si = sin.f[size_t(pos) * half + i];
    const float a = x1 * co, b = x2 * si, e = x1 * si, f = x2 * co;
    out[c1] = from_bits(to_bits(a - b, c.dtype), c.dtype);
    out[c2] = from_bits(to_bits(e + f, c.dtype), c.dtype);
  }
  row = out;
}

// The call's workspace (fa3::workspace_size's bytes, poisoned) attached to a; the kernel the call
// takes must be the Hopper one.
DeviceBuffer attach_workspace(FwdArgs& a, size_t* bytes) {
  EXPECT_TRUE(fa3::workspace_size(a, bytes).ok());
  DeviceBuffer ws(std::max<size_t>(*bytes, 16));
  ws.fill_bytes(0xFF);
  a.workspace = ws.get();
  a.workspace_bytes = *bytes;
  const char* kernel = nullptr;
  EXPECT_TRUE(fa3::kernel_name(a, &kernel).ok());
  EXPECT_STREQ(kernel, "hopper");
  return ws;
}

// A call's O (relative Frobenius error) and LSE (largest error; -inf rows must match) against the
// reference: got_o(b, e) is element e of sequence b's output rows in the reference's order,
// got_lse(b, h, i) the LSE of its query i at head h; qn: each sequence's queries.
struct OutputErrors {
  double o_rel, lse;
};
template <class GotO, class GotLse>
OutputErrors output_errors(const ref::FwdResult& want, const std::vector<int>& qn, int hq, GotO got_o, GotLse got_lse) {
  double num = 0, den = 0, lse_err = 0;
  for (size_t b = 0; b < want.o.size(); ++b) {
    for (size_t e = 0; e < want.o[b].size(); ++e) {
      const double x = got_o(int(b), e) - want.o[b][e];
      num += x * x;
      den += want.o[b][e] * want.o[b][e];
    }
    for (int h = 0; h < hq; ++h)
      for (int i = 0; i < qn[b]; ++i) {
        const double w = want.lse[b][size_t(h) * qn[b] + i], gl = got_lse(int(b), h, i);
        lse_err = worse(lse_err, std::isinf(w) ? (gl == w ? 0.0 : INFINITY) : std::fabs(gl - w));
      }
  }
  return {std::sqrt(num / den), lse_err};
}

void run_append_case(const AppendCase& c) {
  SCOPED_TRACE(c.name());
  std::mt19937 g(rng()());
  const int B = int(c.cache_seqlens.size()), d = c.head_dim, hkv = c.heads_kv, hq = c.heads_q;
  const bool packed_q = !c.q_lens.empty(), packed_new = !c.new_lens.empty();
  // Per sequence: queries, keys appended, and the first row of each in the (packed or dense) rows.
  std::vector<int> qn(B), nn(B), q_row0(B + 1, 0), new_row0(B + 1, 0);
  for (int b = 0; b < B; ++b) {
    qn[b] = packed_q ? c.q_lens[b] : c.seqlen_q;
    const int stored = packed_new ? c.new_lens[b] : c.seqlen_new;  // rows of k_new for b
    nn[b] = c.append ? stored : 0;
    q_row0[b + 1] = q_row0[b] + qn[b];
    new_row0[b + 1] = new_row0[b] + stored;
  }
  const int total_q = q_row0[B], total_new = new_row0[B];
  const int max_q = *std::max_element(qn.begin(), qn.end());
  const bool paged = c.page_size > 0;
  const int pages_per_seq = paged ? c.capacity / c.page_size : 0, num_pages = B * pages_per_seq;
  // The cache as the kernels see it: [batch][rows] rows (seqlen_k = capacity of them used), or
  // [num_pages][page_size] rows.
  const int rows = c.capacity + c.extra_rows;
  const size_t row = size_t(hkv) * d, cache_elems = size_t(B) * rows * row;
  Values k = random_values(cache_elems, c.dtype, g), v = random_values(cache_elems, c.dtype, g);
  std::vector<int> table(num_pages);
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), g);
  auto at = [&](int b, int pos, int h) -> size_t {  // element offset of (b, pos, h, 0)
    if (!paged) return (size_t(b) * rows + pos) * row + size_t(h) * d;
    const int page = table[size_t(b) * pages_per_seq + pos / c.page_size];
    return (size_t(page) * c.page_size + pos % c.page_size) * row + size_t(h) * d;
  };
  Values k_new = random_values(size_t(total_new) * row, c.dtype, g);
  Values v_new = random_values(size_t(total_new) * row, c.dtype, g);
  Values q = random_values(size_t(total_q) * hq * d, c.dtype, g);
  const int half = c.rotary_dim / 2;
  Values cos = random_values(size_t(c.capacity) * std::max(half, 1), c.dtype, g, -1.f, 1.f, false);
  Values sin = random_values(size_t(c.capacity) * std::max(half, 1), c.dtype, g, -1.f, 1.f, false);

  // Expected cache: the new rows (rotated keys) at cache_seqlens[b] + i; everything else as it was.
  std::vector<uint16_t> want_k = k.bits, want_v = v.bits;
  std::vector<std::vector<float>> kk(B), vv(B), qq(B);  // the reference's logical K, V, Q
  // Sequence b's keys: rows first[b] .. cache_seqlens[b] + its new keys - 1.
  std::vector<int> first(B, 0);
  for (int b = 0; b < B; ++b) {
    const int n = c.cache_seqlens[b];
    if (!c.leftpad.empty()) first[b] = std::min(c.leftpad[b], n + nn[b]);
    const int rot = c.rotary_starts.empty() ? n : c.rotary_starts[b];  // rotary position of the first new key
    for (int i = 0; i < nn[b]; ++i)
      for (int h = 0; h < hkv; ++h) {
        const size_t src = ((size_t(new_row0[b]) + i) * hkv + h) * d;
        std::vector<float> kr(&k_new.f[src], &k_new.f[src] + d);
        if (c.rotary_dim) rotate(kr, c, cos, sin, rot + i);
        for (int x = 0; x < d; ++x) {
          want_k[at(b, n + i, h) + x] = to_bits(kr[x], c.dtype);
          want_v[at(b, n + i, h) + x] = v_new.bits[src + x];
        }
      }
    for (int j = first[b]; j < n + nn[b]; ++j)
      for (int h = 0; h < hkv; ++h)
        for (int x = 0; x < d; ++x) {
          kk[b].push_back(from_bits(want_k[at(b, j, h) + x], c.dtype));
          vv[b].push_back(from_bits(want_v[at(b, j, h) + x], c.dtype));
        }
    const bool windowed = c.causal;  // (no window in these cases)
    for (int i = 0; i < qn[b]; ++i)
      for (int h = 0; h < hq; ++h) {
        const size_t src = ((size_t(q_row0[b]) + i) * hq + h) * d;
        std::vector<float> qr(&q.f[src], &q.f[src] + d);
        if (c.rotary_dim) rotate(qr, c, cos, sin, rot + (windowed ? i : 0));
        qq[b].insert(qq[b].end(), qr.begin(), qr.end());
      }
  }

  DeviceBuffer dk(cache_elems * 2), dv(cache_elems * 2), dkn(k_new.bits.size() * 2), dvn(v_new.bits.size() * 2),
      dq(q.bits.size() * 2), dcos(cos.bits.size() * 2), dsin(sin.bits.size() * 2), dlens(B * 4),
      dtable(std::max(num_pages, 1) * 4), dout(q.bits.size() * 2), dlse(size_t(total_q) * hq * 4),
      dsinks(hq * 4), dcu_q((B + 1) * 4), dcu_new((B + 1) * 4), dleftpad(B * 4), drot(B * 4);
  if (!c.leftpad.empty()) dleftpad.upload(c.leftpad.data(), B * 4);
  if (!c.rotary_starts.empty()) drot.upload(c.rotary_starts.data(), B * 4);
  dcu_q.upload(q_row0.data(), (B + 1) * 4);
  dcu_new.upload(new_row0.data(), (B + 1) * 4);
  dk.upload(k.bits.data(), cache_elems * 2);
  dv.upload(v.bits.data(), cache_elems * 2);
  dkn.upload(k_new.bits.data(), dkn.bytes());
  dvn.upload(v_new.bits.data(), dvn.bytes());
  dq.upload(q.bits.data(), dq.bytes());
  dcos.upload(cos.bits.data(), dcos.bytes());
  dsin.upload(sin.bits.data(), dsin.bytes());
  dlens.upload(c.cache_seqlens.data(), B * 4);
  if (paged) dtable.upload(table.data(), num_pages * 4);
  dout.fill_bytes(0xFF);
  dlse.fill_bytes(0xFF);
  std::vector<float> sinks(hq);
  for (int h = 0; h < hq; ++h) sinks[h] = sink_logit(h);
  dsinks.upload(sinks.data(), hq * 4);

  FwdArgs a;
  a.dtype = a.out_dtype = c.dtype;
  a.batch = B;
  a.seqlen_q = max_q;
  a.seqlen_k = c.capacity;
  a.heads_q = hq;
  a.heads_kv = hkv;
  a.head_dim_qk = a.head_dim_v = d;
  a.q = bshd(dq.get(), packed_q ? total_q : c.seqlen_q, hq, d);  // (packed: the batch stride is not read)
  a.out = bshd(dout.get(), packed_q ? total_q : c.seqlen_q, hq, d);
  if (packed_q) {
    a.cu_seqlens_q = static_cast<const int32_t*>(dcu_q.get());
    a.total_q = total_q;
  }
  a.k = paged ? bshd(dk.get(), c.page_size, hkv, d) : bshd(dk.get(), rows, hkv, d);
  a.v = paged ? bshd(dv.get(), c.page_size, hkv, d) : bshd(dv.get(), rows, hkv, d);
  if (paged) {
    a.page_table = static_cast<const int32_t*>(dtable.get());
    a.page_table_batch_stride = pages_per_seq;
    a.page_size = c.page_size;
    a.num_pages = num_pages;
  }
  a.lse = static_cast<float*>(dlse.get());
  a.causal = c.causal;
  if (c.by_seqused) a.seqused_k = static_cast<const int32_t*>(dlens.get());
  else a.cache_seqlens = static_cast<const int32_t*>(dlens.get());
  if (!c.leftpad.empty()) a.leftpad_k = static_cast<const int32_t*>(dleftpad.get());
  if (!c.rotary_starts.empty()) a.rotary_seqlens = static_cast<const int32_t*>(drot.get());
  if (c.append) {
    a.k_new = bshd(dkn.get(), packed_new ? total_new : c.seqlen_new, hkv, d);
    a.v_new = bshd(dvn.get(), packed_new ? total_new : c.seqlen_new, hkv, d);
    if (packed_new) {
      a.cu_seqlens_new = static_cast<const int32_t*>(dcu_new.get());
      a.total_new = total_new;
    } else {
      a.seqlen_new = c.seqlen_new;
    }
  }
  if (c.rotary_dim) {
    a.rotary_cos = dcos.get();
    a.rotary_sin = dsin.get();
    a.rotary_dim = c.rotary_dim;
    a.rotary_rows = c.capacity;
    a.rotary_row_stride = half;
    a.rotary_interleaved = c.interleaved;
  }
  if (c.sinks) a.sinks = static_cast<const float*>(dsinks.get());
  a.num_splits = c.num_splits;
  size_t bytes = 0;
  DeviceBuffer ws = attach_workspace(a, &bytes);
  if (c.append) EXPECT_GE(bytes, size_t(B) * 4) << "the key counts live in the workspace";
  if (c.append || c.rotary_dim || !c.leftpad.empty()) {  // no workspace for its share: refused by name, nothing launched
    FwdArgs small = a;
    small.workspace_bytes = 0;
    small.workspace = nullptr;
    EXPECT_NE(fa3::forward(small).message().find("workspace_bytes"), std::string::npos);
  }
  const Status st = fa3::forward(a);
  ASSERT_TRUE(st.ok()) << st.message();
  FA3_CUDA_CHECK(cudaDeviceSynchronize());

  std::vector<uint16_t> got_k(cache_elems), got_v(cache_elems);
  dk.download(got_k.data(), cache_elems * 2);
  dv.download(got_v.data(), cache_elems * 2);
  long bad_k = 0, bad_v = 0;
  for (size_t i = 0; i < cache_elems; ++i) {
    bad_k += got_k[i] != want_k[i];
    bad_v += got_v[i] != want_v[i];
  }
  EXPECT_EQ(bad_k, 0) << "K cache elements differ from the expected append";
  EXPECT_EQ(bad_v, 0) << "V cache elements differ from the expected append";

  ref::Problem p;
  p.batch = B;
  p.heads_q = hq;
  p.heads_kv = hkv;
  p.head_dim_qk = p.head_dim_v = d;
  p.causal = c.causal;
  for (int b = 0; b < B; ++b) {
    p.seqlen_q.push_back(qn[b]);
    p.seqlen_k.push_back(c.cache_seqlens[b] + nn[b] - first[b]);
  }
  if (c.sinks) p.sinks.assign(sinks.begin(), sinks.end());
  ref::Inputs in;
  in.q = qq;
  in.k = kk;
  in.v = vv;
  const ref::FwdResult want = ref::forward(p, in);
  std::vector<uint16_t> got_o(q.bits.size());
  std::vector<float> got_lse(size_t(total_q) * hq);
  dout.download(got_o.data(), got_o.size() * 2);
  dlse.download(got_lse.data(), got_lse.size() * 4);
  // LSE: dense [batch, heads_q, seqlen_q], packed [heads_q, total_q]
  const OutputErrors err = output_errors(
      want, qn, hq, [&](int b, size_t e) { return from_bits(got_o[size_t(q_row0[b]) * hq * d + e], c.dtype); },
      [&](int b, int h, int i) {
        return got_lse[packed_q ? size_t(h) * total_q + q_row0[b] + i : (size_t(b) * hq + h) * c.seqlen_q + i];
      });
  EXPECT_LE(err.o_rel, 1e-2) << "O relative error";
  EXPECT_LE(err.lse, 1e-3) << "LSE error";
}

TEST(AppendGpu, AppendAndRotaryAgainstCpu) {
  FA3_REQUIRE_GPU();
  std::vector<AppendCase> cases;
  for (bool paged : {false, true})
    for (int rd : {64, 128, 0})
      for (bool inter : {false, true}) {
        if (rd == 0 && inter) continue;
        AppendCase c;
        c.page_size = paged ? (rd == 128 ? 16 : 64) : 0;
        c.capacity = paged ? 320 : 300;
        c.rotary_dim = rd;
        c.interleaved = inter;
        c.dtype = inter ? FA3_DTYPE_FP16 : FA3_DTYPE_BF16;
        cases.push_back(c);
      }
  {
    AppendCase c;  // speculative decoding: 4 new tokens, causal queries at their positions
    c.seqlen_new = c.seqlen_q = 4;
    c.causal = true;
    c.num_splits = 3;
    c.sinks = true;
    cases.push_back(c);
    c.cache_seqlens = {0, 0, 0};  // empty caches
    c.head_dim = 64;
    c.heads_q = c.heads_kv = 4;  // MHA
    c.num_splits = 1;
    c.page_size = 32;
    c.capacity = 64;
    cases.push_back(c);
    c.seqlen_q = 33;  // a prefill chunk on the usual kernels: 33 queries, 4 new keys
    c.seqlen_new = 4;
    c.causal = false;
    c.page_size = 0;
    c.capacity = 300;
    c.cache_seqlens = {100, 5, 200};
    c.head_dim = 256;
    c.rotary_dim = 32;
    c.interleaved = true;
    cases.push_back(c);
  }
  {
    AppendCase c;  // speculative decoding, packed: 3, 1, 4 draft tokens (queries and new keys)
    c.q_lens = c.new_lens = {3, 1, 4};
    c.causal = true;
    c.sinks = true;
    cases.push_back(c);
    c.page_size = 16;  // paged, dense new keys (2 each) with packed queries (0, 5, 2: an empty one)
    c.capacity = 320;
    c.new_lens.clear();
    c.seqlen_new = 2;
    c.q_lens = {0, 5, 2};
    c.interleaved = true;
    cases.push_back(c);
    c.append = false;  // packed queries rotated alone
    c.page_size = 0;
    c.capacity = 300;
    cases.push_back(c);
    c.append = true;  // pages of one row (SGLang's) and of 5: gathered row by row (kv_gather.cuh)
    c.page_size = 1;
    c.capacity = 300;
    cases.push_back(c);
    c.page_size = 5;
    c.seqlen_new = 3;
    c.q_lens = {3, 1, 4};
    cases.push_back(c);
  }
  {
    AppendCase c;  // no new keys: Q rotated alone, then cache_seqlens alone (seqused_k by another name)
    c.append = false;
    c.causal = true;
    c.seqlen_q = 3;
    cases.push_back(c);
    c.rotary_dim = 0;
    c.page_size = 16;
    c.capacity = 320;
    cases.push_back(c);
  }
  for (const AppendCase& c : cases) run_append_case(c);
}

// Left-padded caches (FlashAttention-3's cache_leftpad) and rotary positions of their own
// (rotary_seqlens): the attention sees each sequence's rows from its padding on, on every path
// (decode with and without splits, speculative and packed queries, a prefill chunk), with the
// keys counted by cache_seqlens (with and without new keys) or seqused_k, and a cache whose batch
// stride is longer than seqlen_k rows.
TEST(AppendGpu, LeftPaddedCachesAndRotaryPositions) {
  FA3_REQUIRE_GPU();
  std::vector<AppendCase> cases;
  AppendCase c;  // a decode: one new token, left padding 0 / 5 / 130 (past a key block)
  c.cache_seqlens = {3, 17, 250};
  c.leftpad = {0, 5, 130};
  cases.push_back(c);
  c.num_splits = 3;  // split-KV, causal speculative decoding, sinks, rotary from its own positions
  c.seqlen_new = c.seqlen_q = 4;
  c.causal = true;
  c.sinks = true;
  c.rotary_starts = {0, 12, 100};
  cases.push_back(c);
  c.rotary_starts.clear();  // packed queries and new keys, a sequence whose old keys are all padding
  c.num_splits = 0;
  c.q_lens = c.new_lens = {3, 1, 4};
  c.leftpad = {3, 0, 200};
  c.interleaved = true;
  c.dtype = FA3_DTYPE_FP16;
  cases.push_back(c);
  c.q_lens.clear();  // a prefill chunk (33 queries) on the prefill kernels, GQA 8:1, extra cache rows
  c.new_lens.clear();
  c.seqlen_q = 33;
  c.seqlen_new = 4;
  c.causal = false;
  c.heads_kv = 1;
  c.extra_rows = 7;
  c.cache_seqlens = {100, 5, 200};
  c.leftpad = {64, 1, 199};
  c.head_dim = 64;
  c.rotary_dim = 32;
  cases.push_back(c);
  AppendCase s;  // no new keys: cache_seqlens alone, then seqused_k, with left padding
  s.append = false;
  s.rotary_dim = 0;
  s.leftpad = {2, 17, 40};
  s.seqlen_q = 3;
  s.causal = true;
  cases.push_back(s);
  s.by_seqused = true;
  s.extra_rows = 16;
  s.head_dim = 256;
  cases.push_back(s);
  AppendCase r;  // rotary_seqlens without left padding, Q rotated alone at them
  r.append = false;
  r.seqlen_q = 2;
  r.causal = true;
  r.rotary_starts = {7, 0, 280};
  cases.push_back(r);
  for (const AppendCase& x : cases) run_append_case(x);
}

// e4m3 caches (fa3_c.h: new keys and values are e4m3 bytes under the cache's descales, copied as
// given; rotary is refused with e4m3): the cache afterwards byte for byte, and the attention against
// the double reference of the e4m3 values (the FP8 kernels' bound: P is rounded to e4m3). Contiguous
// and paged caches (pages of 16 rows, and of one row: gathered), dense and packed new keys, a decode
// step and a speculative one (4 causal queries), an empty cache.
void run_e4m3_append_case(int page_size, bool packed_new, int seqlen_q, bool causal) {
  SCOPED_TRACE("e4m3 pages " + std::to_string(page_size) + (packed_new ? " packed-new" : "") + " sq" +
               std::to_string(seqlen_q) + (causal ? " causal" : ""));
  std::mt19937 g(rng()());
  const std::vector<int> cache_seqlens = {0, 17, 250};
  const int B = 3, hq = 8, hkv = 2, d = 128;
  const bool paged = page_size > 0;
  const int capacity = page_size == 16 ? 320 : 300;
  const int pages_per_seq = paged ? capacity / page_size : 0, num_pages = B * pages_per_seq;
  std::vector<int> nn(B, 2), new_row0(B + 1, 0);
  if (packed_new) nn = {3, 1, 4};
  for (int b = 0; b < B; ++b) new_row0[b + 1] = new_row0[b] + nn[b];
  const int total_new = new_row0[B];
  const size_t row = size_t(hkv) * d, cache_elems = size_t(B) * capacity * row;
  std::normal_distribution<float> nd;
  auto bytes = [&](size_t n) {
    std::vector<uint8_t> v(n);
    for (auto& x : v) x = ref::to_e4m3_bits(nd(g));
    return v;
  };
  const std::vector<uint8_t> k = bytes(cache_elems), v = bytes(cache_elems), k_new = bytes(size_t(total_new) * row),
                             v_new = bytes(size_t(total_new) * row), q = bytes(size_t(B) * seqlen_q * hq * d);
  std::vector<int> table(num_pages);
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), g);
  auto at = [&](int b, int pos, int h) -> size_t {
    if (!paged) return (size_t(b) * capacity + pos) * row + size_t(h) * d;
    const int page = table[size_t(b) * pages_per_seq + pos / page_size];
    return (size_t(page) * page_size + pos % page_size) * row + size_t(h) * d;
  };
  std::vector<uint8_t> want_k = k, want_v = v;
  ref::Problem p;
  p.batch = B;
  p.heads_q = hq;
  p.heads_kv = hkv;
  p.head_dim_qk = p.head_dim_v = d;
  p.causal = causal;
  ref::Inputs in;
  in.q.resize(B);
  in.k.resize(B);
  in.v.resize(B);
  for (int b = 0; b < B; ++b) {
    const int n = cache_seqlens[b];
    for (int i = 0; i < nn[b]; ++i)
      for (size_t x = 0; x < row; ++x) {
        want_k[at(b, n + i, 0) + x] = k_new[(size_t(new_row0[b]) + i) * row + x];
        want_v[at(b, n + i, 0) + x] = v_new[(size_t(new_row0[b]) + i) * row + x];
      }
    for (int j = 0; j < n + nn[b]; ++j)
      for (int h = 0; h < hkv; ++h)
        for (int x = 0; x < d; ++x) {
          in.k[b].push_back(ref::from_e4m3_bits(want_k[at(b, j, h) + x]));
          in.v[b].push_back(ref::from_e4m3_bits(want_v[at(b, j, h) + x]));
        }
    for (size_t e = 0; e < size_t(seqlen_q) * hq * d; ++e)
      in.q[b].push_back(ref::from_e4m3_bits(q[size_t(b) * seqlen_q * hq * d + e]));
    p.seqlen_q.push_back(seqlen_q);
    p.seqlen_k.push_back(n + nn[b]);
  }

  DeviceBuffer dk(cache_elems), dv(cache_elems), dkn(k_new.size()), dvn(v_new.size()), dq(q.size()),
      dlens(B * 4), dtable(std::max(num_pages, 1) * 4), dout(q.size() * 2), dlse(size_t(B) * seqlen_q * hq * 4),
      dcu_new((B + 1) * 4);
  dk.upload(k.data(), k.size());
  dv.upload(v.data(), v.size());
  dkn.upload(k_new.data(), k_new.size());
  dvn.upload(v_new.data(), v_new.size());
  dq.upload(q.data(), q.size());
  dlens.upload(cache_seqlens.data(), B * 4);
  dcu_new.upload(new_row0.data(), (B + 1) * 4);
  if (paged) dtable.upload(table.data(), num_pages * 4);
  dout.fill_bytes(0xFF);
  dlse.fill_bytes(0xFF);

  FwdArgs a;
  a.dtype = FA3_DTYPE_E4M3;
  a.out_dtype = FA3_DTYPE_BF16;
  a.batch = B;
  a.seqlen_q = seqlen_q;
  a.seqlen_k = capacity;
  a.heads_q = hq;
  a.heads_kv = hkv;
  a.head_dim_qk = a.head_dim_v = d;
  a.causal = causal;
  a.q = bshd(dq.get(), seqlen_q, hq, d);
  a.out = bshd(dout.get(), seqlen_q, hq, d);
  a.k = paged ? bshd(dk.get(), page_size, hkv, d) : bshd(dk.get(), capacity, hkv, d);
  a.v = paged ? bshd(dv.get(), page_size, hkv, d) : bshd(dv.get(), capacity, hkv, d);
  if (paged) {
    a.page_table = static_cast<const int32_t*>(dtable.get());
    a.page_table_batch_stride = pages_per_seq;
    a.page_size = page_size;
    a.num_pages = num_pages;
  }
  a.lse = static_cast<float*>(dlse.get());
  a.cache_seqlens = static_cast<const int32_t*>(dlens.get());
  a.k_new = bshd(dkn.get(), packed_new ? total_new : 2, hkv, d);
  a.v_new = bshd(dvn.get(), packed_new ? total_new : 2, hkv, d);
  if (packed_new) {
    a.cu_seqlens_new = static_cast<const int32_t*>(dcu_new.get());
    a.total_new = total_new;
  } else {
    a.seqlen_new = 2;
  }
  size_t ws_bytes = 0;
  DeviceBuffer ws = attach_workspace(a, &ws_bytes);
  const Status st = fa3::forward(a);
  ASSERT_TRUE(st.ok()) << st.message();
  FA3_CUDA_CHECK(cudaDeviceSynchronize());

  std::vector<uint8_t> got_k(cache_elems), got_v(cache_elems);
  dk.download(got_k.data(), cache_elems);
  dv.download(got_v.data(), cache_elems);
  EXPECT_TRUE(got_k == want_k) << "K cache bytes differ from the expected append";
  EXPECT_TRUE(got_v == want_v) << "V cache bytes differ from the expected append";

  const ref::FwdResult want = ref::forward(p, in);
  std::vector<uint16_t> got_o(q.size());
  std::vector<float> got_lse(size_t(B) * seqlen_q * hq);
  dout.download(got_o.data(), got_o.size() * 2);
  dlse.download(got_lse.data(), got_lse.size() * 4);
  const OutputErrors err = output_errors(
      want, std::vector<int>(B, seqlen_q), hq,
      [&](int b, size_t e) { return ref::from_bf16_bits(got_o[size_t(b) * seqlen_q * hq * d + e]); },
      [&](int b, int h, int i) { return got_lse[(size_t(b) * hq + h) * seqlen_q + i]; });
  EXPECT_LE(err.o_rel, 3e-2) << "O relative error (e4m3: P rounded to e4m3)";
  EXPECT_LE(err.lse, 2e-2) << "LSE error";
}

TEST(AppendGpu, E4m3CachesTakeNewKeys) {
  FA3_REQUIRE_GPU();
  run_e4m3_append_case(0, false, 1, false);
  run_e4m3_append_case(16, true, 1, false);
  run_e4m3_append_case(1, false, 4, true);
  run_e4m3_append_case(0, true, 4, true);
}

}  // namespace
}  // namespace fa3::test
