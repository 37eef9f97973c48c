// Argument checks of the public calls.  Pure host code with no CUDA call, so that a caller (and the
// tests) can validate on a machine without a GPU.  Every check returns the first failure; its
// message names the field as spelled in fa3_c.h, says what was expected and what was given.
#include "src/api/validate.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <utility>

#include "src/api/limits.h"
#include "src/api/status.h"
#include "src/attention/append_kv.h"
#include "src/attention/combine.h"
#include "src/fp8/quantize_fp8.h"

namespace fa3::detail {

int64_t element_bytes(fa3_dtype d) {
  switch (d) {
    case FA3_DTYPE_E4M3: return 1;
    case FA3_DTYPE_FP32: return 4;
    default: return 2;
  }
}

namespace {

using std::to_string;

// TMA copies need 16-byte-aligned base addresses and 16-byte-multiple strides.
constexpr int64_t kTmaBytes = 16;
constexpr int kMaxHeadDim = 256;

std::string hex(const void* ptr) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(reinterpret_cast<uintptr_t>(ptr)));
  return buf;
}

// %g keeps "nan" / "inf" / "0.5" readable where std::to_string would print "0.500000".
std::string num(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", x);
  return buf;
}

bool aligned(const void* ptr, int64_t bytes) { return reinterpret_cast<uintptr_t>(ptr) % bytes == 0; }


// stride * extent, clamped so that absurd strides cannot wrap around into a passing comparison.
int64_t span(int64_t stride, int64_t extent) {
  const int64_t max = std::numeric_limits<int64_t>::max();
  return stride > max / extent ? max : stride * extent;
}

Status check_struct_size(uint32_t got, size_t want, const char* init) {
  if (got == want) return ok();
  return invalid("struct_size must be " + to_string(want) + " (initialise the struct with " + init + "); got " +
                 to_string(got));
}

// Only the 16-bit types and e4m3 are input types; fp32 exists for accumulators.
Status check_dtypes(const fa3_fwd_params& p) {
  if (p.dtype != FA3_DTYPE_FP16 && p.dtype != FA3_DTYPE_BF16 && p.dtype != FA3_DTYPE_E4M3)
    return invalid("dtype must be FA3_DTYPE_FP16, FA3_DTYPE_BF16 or FA3_DTYPE_E4M3; got " +
                   std::string(dtype_name(p.dtype)) + " (" + to_string(static_cast<int>(p.dtype)) + ")");
  // The FP8 forward writes bf16: an fp8 output would lose most of O's precision.
  const fa3_dtype want = p.dtype == FA3_DTYPE_E4M3 ? FA3_DTYPE_BF16 : p.dtype;
  if (p.out_dtype != want)
    return invalid("out_dtype must be " + std::string(dtype_name(want)) + " for dtype " + dtype_name(p.dtype) +
                   "; got " + dtype_name(p.out_dtype) + " (" + to_string(static_cast<int>(p.out_dtype)) + ")");
  return ok();
}

Status check_positive(const char* name, int64_t value) {
  if (value >= 1) return ok();
  return invalid(std::string(name) + " must be >= 1; got " + to_string(value));
}

Status check_sizes(const fa3_fwd_params& p) {
  FA3_TRY(check_positive("batch", p.batch));
  FA3_TRY(check_positive("seqlen_q", p.seqlen_q));
  FA3_TRY(check_positive("seqlen_k", p.seqlen_k));
  FA3_TRY(check_positive("heads_q", p.heads_q));
  FA3_TRY(check_positive("heads_kv", p.heads_kv));
  // The kernels index key and query positions in 32 bits, window edges included (mask.cuh adds a
  // row, the offset seqlen_k - seqlen_q and a window below seqlen_q; make_problem drops wider ones).
  if (int64_t(p.seqlen_q) + p.seqlen_k > kMaxIndex32)
    return invalid("seqlen_q + seqlen_k must be <= " + to_string(kMaxIndex32) + " (32-bit key positions); got " +
                   to_string(p.seqlen_q) + " + " + to_string(p.seqlen_k));
  // Each key/value head serves a whole group of query heads (GQA; MQA when heads_kv == 1).
  if (p.heads_q % p.heads_kv != 0)
    return invalid("heads_q must be a multiple of heads_kv (GQA/MQA); got heads_q " + to_string(p.heads_q) +
                   ", heads_kv " + to_string(p.heads_kv));
  return ok();
}

// A head-dim row is one TMA box row, so it must span a multiple of 16 bytes.
Status check_head_dim(const char* name, int32_t d, fa3_dtype dtype) {
  const int64_t multiple = kTmaBytes / element_bytes(dtype);
  if (d >= 8 && d <= kMaxHeadDim && d % multiple == 0) return ok();
  return invalid(std::string(name) + " must be a multiple of " + to_string(multiple) + " in [8, " +
                 to_string(kMaxHeadDim) + "] for dtype " + dtype_name(dtype) + "; got " + to_string(d));
}

// ---------------------------------------------------------------- tensors ----

// One 4-D tensor argument as the checks see it: logical shape [batch, seqlen, heads, head_dim].
struct TensorSpec {
  const char* name;  // "q", "dk", ...: prefixes every field name in messages
  fa3_dtype dtype;
  bool packed;  // varlen rows (cu_seqlens set): batch_stride is ignored
  int64_t batch, seqlen, heads, head_dim;
  const char* seqlen_name;  // extent names for the overlap message: "seqlen_q", "heads_kv", ...
  const char* heads_name;
  const char* head_dim_name;
};

std::string field(const TensorSpec& s, const char* f) { return std::string(s.name) + "." + f; }

Status check_data(const fa3_tensor& t, const TensorSpec& s) {
  if (t.data == nullptr) return invalid(field(s, "data") + " must not be NULL");
  if (!aligned(t.data, kTmaBytes))
    return invalid(field(s, "data") + " must be 16-byte aligned (TMA); got " + hex(t.data));
  return ok();
}

Status check_stride(const TensorSpec& s, const char* f, int64_t stride) {
  if (stride < 0) return invalid(field(s, f) + " must be >= 0; got " + to_string(stride));
  const int64_t multiple = kTmaBytes / element_bytes(s.dtype);
  if (stride % multiple != 0)
    return invalid(field(s, f) + " must be a multiple of " + to_string(multiple) + " elements (16 bytes of " +
                   dtype_name(s.dtype) + ", for TMA); got " + to_string(stride));
  // A TMA map's strides are below 2^40 bytes (cuTensorMapEncodeTiled).
  if (stride >= (int64_t(1) << 40) / element_bytes(s.dtype))
    return invalid(field(s, f) + " must span fewer than 2^40 bytes (a TMA limit); got " + to_string(stride) +
                   " elements of " + dtype_name(s.dtype));
  return ok();
}

Status check_strides(const fa3_tensor& t, const TensorSpec& s) {
  FA3_TRY(check_stride(s, "row_stride", t.row_stride));
  FA3_TRY(check_stride(s, "head_stride", t.head_stride));
  if (!s.packed) FA3_TRY(check_stride(s, "batch_stride", t.batch_stride));
  return ok();
}

// Outputs must not alias themselves (inputs may: a broadcast K with head_stride 0 is fine).  Sorted
// by stride, every dimension must step over everything the smaller-stride dimensions span.
Status check_no_overlap(const fa3_tensor& t, const TensorSpec& s) {
  struct Dim {
    const char* stride_name;
    const char* extent_name;
    int64_t stride, extent;
  };
  Dim dims[4];
  int n = 0;
  auto add = [&](const char* stride_name, const char* extent_name, int64_t stride, int64_t extent) {
    if (extent > 1) dims[n++] = Dim{stride_name, extent_name, stride, extent};
  };
  add("head_dim", s.head_dim_name, 1, s.head_dim);
  add("head_stride", s.heads_name, t.head_stride, s.heads);
  add("row_stride", s.seqlen_name, t.row_stride, s.seqlen);
  if (!s.packed) add("batch_stride", "batch", t.batch_stride, s.batch);
  std::stable_sort(dims, dims + n, [](const Dim& a, const Dim& b) { return a.stride < b.stride; });

  int64_t need = 1;  // a dimension of extent > 1 needs a stride of at least 1
  const Dim* below = nullptr;
  for (int i = 0; i < n; ++i) {
    const Dim& d = dims[i];
    if (d.stride < need) {
      const std::string what =
          below == nullptr ? " repeats the same elements across " + std::string(d.extent_name) + " = " +
                                 to_string(d.extent)
                           : ", but the " + std::string(below->extent_name) + " dimension below it spans " +
                                 to_string(need) + " elements";
      return invalid(std::string(s.name) + " strides make elements overlap (" + field(s, d.stride_name) + " = " +
                     to_string(d.stride) + what + ")");
    }
    need = span(d.stride, d.extent);
    below = &d;
  }
  return ok();
}

Status check_tensor(const fa3_tensor& t, const TensorSpec& s, bool is_output) {
  FA3_TRY(check_data(t, s));
  FA3_TRY(check_strides(t, s));
  if (is_output) FA3_TRY(check_no_overlap(t, s));
  return ok();
}

// The shapes of Q, K, V and O (and of dQ, dK, dV and dO, which share them).
// Packed (varlen) tensors have total_q / total_k rows and no batch dimension.
TensorSpec q_spec(const fa3_fwd_params& p, const char* name, int64_t head_dim, const char* head_dim_name,
                  fa3_dtype dtype) {
  const bool packed = p.cu_seqlens_q != nullptr;
  return TensorSpec{name,     dtype,   packed, p.batch, packed ? p.total_q : p.seqlen_q, p.heads_q,
                    head_dim, packed ? "total_q" : "seqlen_q", "heads_q", head_dim_name};
}

TensorSpec k_spec(const fa3_fwd_params& p, const char* name, int64_t head_dim, const char* head_dim_name) {
  const bool packed = p.cu_seqlens_k != nullptr;
  return TensorSpec{name,     p.dtype, packed, p.batch, packed ? p.total_k : p.seqlen_k, p.heads_kv,
                    head_dim, packed ? "total_k" : "seqlen_k", "heads_kv", head_dim_name};
}

Status check_fwd_tensors(const fa3_fwd_params& p) {
  FA3_TRY(check_tensor(p.q, q_spec(p, "q", p.head_dim_qk, "head_dim_qk", p.dtype), false));
  FA3_TRY(check_tensor(p.k, k_spec(p, "k", p.head_dim_qk, "head_dim_qk"), false));
  FA3_TRY(check_tensor(p.v, k_spec(p, "v", p.head_dim_v, "head_dim_v"), false));
  // O's element size follows out_dtype (bf16 for the FP8 forward), not dtype.
  FA3_TRY(check_tensor(p.out, q_spec(p, "out", p.head_dim_v, "head_dim_v", p.out_dtype), true));
  return ok();
}

// ------------------------------------------------------------ other fields ----

Status check_lse(const fa3_fwd_params& p) {
  if (p.lse != nullptr && !aligned(p.lse, sizeof(float)))
    return invalid("lse must be 4-byte aligned (float32); got " + hex(p.lse));
  return ok();
}

// Sinks are read as float32 [heads_q] (their values are device data: finite is the caller's contract).
Status check_sinks(const float* sinks, const char* name) {
  if (sinks != nullptr && !aligned(sinks, sizeof(float)))
    return invalid(std::string(name) + " must be 4-byte aligned (float32); got " + hex(sinks));
  return ok();
}

Status check_scores(const fa3_fwd_params& p) {
  if (!std::isfinite(p.softmax_scale))
    return invalid("softmax_scale must be finite (0 selects 1/sqrt(head_dim_qk)); got " + num(p.softmax_scale));
  if (!std::isfinite(p.softcap) || p.softcap < 0.f)
    return invalid("softcap must be finite and >= 0 (0 = off); got " + num(p.softcap));
  return ok();
}

Status check_mask(const fa3_fwd_params& p) {
  if (p.window_left < -1)
    return invalid("window_left must be >= -1 (-1 = unbounded); got " + to_string(p.window_left));
  if (p.window_right < -1)
    return invalid("window_right must be >= -1 (-1 = unbounded); got " + to_string(p.window_right));
  if (p.causal != 0 && p.causal != 1) return invalid("causal must be 0 or 1; got " + to_string(p.causal));
  // Causal is the window with window_right = 0: a wider right window contradicts it.
  if (p.causal == 1 && p.window_right > 0)
    return invalid("window_right must be -1 or 0 with causal = 1 (causal means window_right = 0); got " +
                   to_string(p.window_right));
  return ok();
}

// Varlen: what fa3 can check on the host (the arrays' contents are the caller's contract, fa3_c.h).
Status check_varlen(const fa3_fwd_params& p) {
  // Packed queries need to know each sequence's keys: packed too, or counted per batch entry
  // (seqused_k, or the KV-cache append's cache_seqlens).
  // (With left padding the append kernel counts them: leftpad_k.)
  if (p.cu_seqlens_q != nullptr && p.cu_seqlens_k == nullptr && p.seqused_k == nullptr && p.cache_seqlens == nullptr &&
      p.leftpad_k == nullptr)
    return invalid("cu_seqlens_q needs cu_seqlens_k (packed keys) or seqused_k (keys per batch entry); got neither");
  if (p.cu_seqlens_q != nullptr && p.total_q < 1)
    return invalid("total_q must be >= 1 with cu_seqlens_q (the rows of the packed q and out); got " +
                   to_string(p.total_q));
  if (p.cu_seqlens_k != nullptr && p.total_k < 1)
    return invalid("total_k must be >= 1 with cu_seqlens_k (the rows of the packed k and v); got " +
                   to_string(p.total_k));
  const std::pair<const int32_t*, const char*> arrays[] = {{p.cu_seqlens_q, "cu_seqlens_q"},
                                                            {p.cu_seqlens_k, "cu_seqlens_k"},
                                                            {p.seqused_q, "seqused_q"},
                                                            {p.seqused_k, "seqused_k"}};
  for (const auto& [ptr, name] : arrays)
    if (ptr != nullptr && !aligned(ptr, sizeof(int32_t)))
      return invalid(std::string(name) + " must be 4-byte aligned (int32); got " + hex(ptr));
  return ok();
}

Status check_paged(const fa3_fwd_params& p) {
  if (p.page_table == nullptr) return ok();  // page_size / num_pages are ignored then
  // Pages are addressed per batch entry; packed varlen K rows have no batch entry to page.
  if (p.cu_seqlens_k != nullptr)
    return invalid("page_table cannot be combined with cu_seqlens_k; use seqused_k for per-sequence key counts "
                   "with a paged cache");
  if (!aligned(p.page_table, sizeof(int32_t)))
    return invalid("page_table must be 4-byte aligned (int32); got " + hex(p.page_table));
  FA3_TRY(check_positive("page_size", p.page_size));
  FA3_TRY(check_positive("num_pages", p.num_pages));
  const int64_t pages_per_seq = (static_cast<int64_t>(p.seqlen_k) + p.page_size - 1) / p.page_size;
  if (p.page_table_batch_stride < pages_per_seq)
    return invalid("page_table_batch_stride must be >= ceil(seqlen_k / page_size) = " + to_string(pages_per_seq) +
                   " (seqlen_k " + to_string(p.seqlen_k) + ", page_size " + to_string(p.page_size) + "); got " +
                   to_string(p.page_table_batch_stride));
  return ok();
}

Status check_descale(const fa3_fwd_params& p) {
  const std::pair<const float*, const char*> ptrs[] = {
      {p.q_descale, "q_descale"}, {p.k_descale, "k_descale"}, {p.v_descale, "v_descale"}};
  // Descaling undoes FP8 quantisation; for 16-bit inputs it would be silently ignored.
  for (const auto& [ptr, name] : ptrs) {
    if (ptr == nullptr) continue;
    if (p.dtype != FA3_DTYPE_E4M3)
      return invalid(std::string(name) + " is only used with dtype e4m3; got dtype " + dtype_name(p.dtype));
    if (!aligned(ptr, sizeof(float)))
      return invalid(std::string(name) + " must be 4-byte aligned (float32); got " + hex(ptr));
  }
  if (p.descale_batch_stride < 0)
    return invalid("descale_batch_stride must be >= 0; got " + to_string(p.descale_batch_stride));
  if (p.descale_head_stride < 0)
    return invalid("descale_head_stride must be >= 0; got " + to_string(p.descale_head_stride));
  return ok();
}

// FP8 block descales (fa3_block_scales): K's and V's blocks hold whole key blocks of the kernels
// (128 keys and divisors of it), so a key block has one factor (descale.cuh).
Status check_block_descale(const fa3_fwd_params& p, const fa3_block_scales& b, const char* name, int seqlen,
                           bool keys) {
  if (b.data == nullptr) return ok();
  const std::string n = name;
  if (p.dtype != FA3_DTYPE_E4M3)
    return invalid(n + ".data is only used with dtype e4m3; got dtype " + dtype_name(p.dtype));
  if (!aligned(b.data, 4)) return invalid(n + ".data must be 4-byte aligned (float32)");
  if (keys ? (b.block_size < 128 || b.block_size % 128 != 0) : b.block_size < 1)
    return invalid(n + ".block_size must be " + (keys ? "a positive multiple of 128" : ">= 1") + "; got " +
                   to_string(b.block_size));
  const int64_t need = (static_cast<int64_t>(seqlen) + b.block_size - 1) / b.block_size;
  if (b.num_blocks < need)
    return invalid(n + ".num_blocks must be >= ceil(" + (keys ? "seqlen_k" : "seqlen_q") + " / block_size) = " +
                   to_string(need) + "; got " + to_string(b.num_blocks));
  if (b.batch_stride < 0) return invalid(n + ".batch_stride must be >= 0; got " + to_string(b.batch_stride));
  if (b.head_stride < 0) return invalid(n + ".head_stride must be >= 0; got " + to_string(b.head_stride));
  return ok();
}

Status check_block_descales(const fa3_fwd_params& p) {
  FA3_TRY(check_block_descale(p, p.q_block_descale, "q_block_descale", p.seqlen_q, false));
  FA3_TRY(check_block_descale(p, p.k_block_descale, "k_block_descale", p.seqlen_k, true));
  FA3_TRY(check_block_descale(p, p.v_block_descale, "v_block_descale", p.seqlen_k, true));
  return ok();
}

// The KV-cache append with rotary (fa3_c.h: cache_seqlens, k_new / v_new, rotary_cos / rotary_sin).
Status check_append(const fa3_fwd_params& p) {
  const bool append = p.k_new.data != nullptr || p.v_new.data != nullptr;
  const bool rotary = p.rotary_cos != nullptr || p.rotary_sin != nullptr;
  if (p.cu_seqlens_new != nullptr && !append)
    return invalid("cu_seqlens_new is for packed new keys: k_new and v_new must be given with it");
  if (p.rotary_seqlens != nullptr && !rotary)
    return invalid("rotary_seqlens are the rotary embedding's positions: rotary_cos and rotary_sin must be given with it");
  if (p.cache_seqlens == nullptr && !append && !rotary) return ok();
  const char* what = append ? "k_new / v_new" : rotary ? "rotary_cos / rotary_sin" : "cache_seqlens";
  // e4m3 caches take new keys and values as e4m3 bytes under the cache's descales (copied as
  // given); a rotation would round them a second time (rotate before quantizing instead).
  if (p.dtype == FA3_DTYPE_E4M3 && rotary)
    return not_supported("rotary_cos / rotary_sin with dtype e4m3 (rotate Q and the new keys before quantizing them)");
  if (p.cu_seqlens_k != nullptr)
    return not_supported(std::string(what) + " with cu_seqlens_k (the cache is indexed by batch entry or page table)");
  if (p.cache_seqlens != nullptr) {
    if (p.seqused_k != nullptr)
      return invalid("seqused_k must be NULL with cache_seqlens (the keys used are cache_seqlens + seqlen_new)");
    if (!aligned(p.cache_seqlens, sizeof(int32_t)))
      return invalid("cache_seqlens must be 4-byte aligned (int32); got " + hex(p.cache_seqlens));
  }
  if (append) {
    if (p.cache_seqlens == nullptr)
      return invalid("k_new needs cache_seqlens (where each sequence's new keys go); got NULL");
    if (p.k_new.data == nullptr || p.v_new.data == nullptr)
      return invalid(std::string(p.k_new.data ? "v_new.data" : "k_new.data") +
                     " must not be NULL: new keys and new values go together");
    // Dense [batch, seqlen_new, ...] or packed [total_new, ...] rows (cu_seqlens_new).
    const bool packed = p.cu_seqlens_new != nullptr;
    if (packed) {
      FA3_TRY(check_positive("total_new", p.total_new));
      if (!aligned(p.cu_seqlens_new, sizeof(int32_t)))
        return invalid("cu_seqlens_new must be 4-byte aligned (int32); got " + hex(p.cu_seqlens_new));
    } else {
      FA3_TRY(check_positive("seqlen_new", p.seqlen_new));
    }
    const int64_t rows = packed ? p.total_new : p.seqlen_new;
    const char* rows_name = packed ? "total_new" : "seqlen_new";
    const TensorSpec k_new{"k_new", p.dtype, packed, p.batch, rows, p.heads_kv, p.head_dim_qk,
                           rows_name, "heads_kv", "head_dim_qk"};
    const TensorSpec v_new{"v_new", p.dtype, packed, p.batch, rows, p.heads_kv, p.head_dim_v,
                           rows_name, "heads_kv", "head_dim_v"};
    FA3_TRY(check_tensor(p.k_new, k_new, false));
    FA3_TRY(check_tensor(p.v_new, v_new, false));
    // K and V are written now: no two positions may share an element (a paged cache: pages x rows).
    const bool paged = p.page_table != nullptr;
    const int64_t blocks = paged ? p.num_pages : p.batch, cache_rows = paged ? p.page_size : p.seqlen_k;
    const char* cache_rows_name = paged ? "page_size" : "seqlen_k";
    FA3_TRY(check_no_overlap(p.k, TensorSpec{"k", p.dtype, false, blocks, cache_rows, p.heads_kv, p.head_dim_qk,
                                             cache_rows_name, "heads_kv", "head_dim_qk"}));
    FA3_TRY(check_no_overlap(p.v, TensorSpec{"v", p.dtype, false, blocks, cache_rows, p.heads_kv, p.head_dim_v,
                                             cache_rows_name, "heads_kv", "head_dim_v"}));
  }
  if (rotary) {
    if (p.rotary_seqlens != nullptr && !aligned(p.rotary_seqlens, sizeof(int32_t)))
      return invalid("rotary_seqlens must be 4-byte aligned (int32); got " + hex(p.rotary_seqlens));
    if (p.rotary_cos == nullptr || p.rotary_sin == nullptr)
      return invalid(std::string(p.rotary_cos ? "rotary_sin" : "rotary_cos") +
                     " must not be NULL: the rotary embedding needs both tables");
    if (p.rotary_dim < 2 || p.rotary_dim % 2 != 0 || p.rotary_dim > p.head_dim_qk)
      return invalid("rotary_dim must be even, in [2, head_dim_qk = " + to_string(p.head_dim_qk) + "]; got " +
                     to_string(p.rotary_dim));
    if (p.rotary_rows < p.seqlen_k)
      return invalid("rotary_rows must be >= seqlen_k = " + to_string(p.seqlen_k) +
                     " (a row per key position); got " + to_string(p.rotary_rows));
    if (p.rotary_row_stride < p.rotary_dim / 2)
      return invalid("rotary_row_stride must be >= rotary_dim / 2 = " + to_string(p.rotary_dim / 2) + "; got " +
                     to_string(p.rotary_row_stride));
    if (p.rotary_interleaved != 0 && p.rotary_interleaved != 1)
      return invalid("rotary_interleaved must be 0 or 1; got " + to_string(p.rotary_interleaved));
    if (!aligned(p.rotary_cos, 2) || !aligned(p.rotary_sin, 2))
      return invalid("rotary_cos and rotary_sin must be 2-byte aligned (dtype elements)");
  }
  return ok();
}

// Left padding (fa3_c.h: leftpad_k) becomes packed keys before the attention (append_kv.h): each
// sequence's rows then start at b * (its batch stride in rows) + leftpad_k[b], which needs a
// contiguous cache whose batch stride is a whole number of rows, the same for K and V.
Status check_leftpad(const fa3_fwd_params& p) {
  if (p.leftpad_k == nullptr) return ok();
  if (!aligned(p.leftpad_k, sizeof(int32_t)))
    return invalid("leftpad_k must be 4-byte aligned (int32); got " + hex(p.leftpad_k));
  if (p.page_table != nullptr)
    return not_supported("leftpad_k with page_table (start a sequence's page_table row at its first page instead)");
  if (p.cu_seqlens_k != nullptr)
    return invalid("leftpad_k cannot be combined with cu_seqlens_k (packed keys start where cu_seqlens_k says)");
  if (p.k_block_descale.data != nullptr || p.v_block_descale.data != nullptr)
    return not_supported("leftpad_k with k_block_descale / v_block_descale (their blocks count keys from row 0)");
  if (p.k.row_stride <= 0 || p.v.row_stride <= 0)
    return invalid("leftpad_k needs k.row_stride and v.row_stride > 0; got " + to_string(p.k.row_stride) + ", " +
                   to_string(p.v.row_stride));
  if (p.batch == 1) return ok();  // (one sequence: its rows start at row 0 whatever the batch strides)
  const int64_t rows = attn::leftpad_rows_per_batch(p);
  if (p.k.batch_stride % p.k.row_stride != 0 || rows < p.seqlen_k)
    return invalid("leftpad_k needs k.batch_stride to be a whole number of rows (k.row_stride = " +
                   to_string(p.k.row_stride) + ") of at least seqlen_k = " + to_string(p.seqlen_k) +
                   " rows (a [batch, rows, heads_kv, d] cache); got " + to_string(p.k.batch_stride));
  if (p.v.batch_stride != rows * p.v.row_stride)
    return invalid("leftpad_k needs v.batch_stride = " + to_string(rows) + " * v.row_stride = " +
                   to_string(rows * p.v.row_stride) + " (K's rows per batch entry); got " + to_string(p.v.batch_stride));
  if (attn::leftpad_total_rows(p) > INT32_MAX)
    return invalid("leftpad_k: the cache's rows ((batch - 1) * k.batch_stride / k.row_stride + seqlen_k = " +
                   to_string(attn::leftpad_total_rows(p)) + ") must be < 2^31");
  return ok();
}

Status check_splits(const fa3_fwd_params& p) {
  if (p.num_splits < 0)
    return invalid("num_splits must be >= 0 (0 = automatic, 1 = no split); got " + to_string(p.num_splits));
  if (p.num_splits > attn::kMaxCombineSplits)
    return invalid("num_splits must be <= " + to_string(attn::kMaxCombineSplits) + "; got " + to_string(p.num_splits));
  // Any margin up to the SM count's is meaningful; a larger one leaves the kernels one SM.
  if (p.sm_margin < 0) return invalid("sm_margin must be >= 0 (SMs left free; 0 = none); got " + to_string(p.sm_margin));
  return ok();
}

// The size is checked where the path that needs it is chosen (fa3_forward: a decode problem with a
// smaller workspace takes fewer splits; the backward's kernels need theirs); a size without memory
// is a bug, and the partial results are read as float4 (the combine kernel).
Status check_workspace(const void* workspace, size_t bytes) {
  if (workspace == nullptr && bytes > 0)
    return invalid("workspace must not be NULL when workspace_bytes > 0; got workspace_bytes " + to_string(bytes));
  if (reinterpret_cast<uintptr_t>(workspace) % 16 != 0)
    return invalid("workspace must be 16-byte aligned (as cudaMalloc's are)");
  if (bytes > std::numeric_limits<uintptr_t>::max() - reinterpret_cast<uintptr_t>(workspace))
    return invalid("workspace + workspace_bytes must not wrap around the address space; got workspace " +
                   hex(workspace) + ", workspace_bytes " + to_string(bytes));
  return ok();
}

// ---------------------------------------------------------------- backward ----

Status check_bwd_tensors(const fa3_bwd_params& b) {
  const fa3_fwd_params& p = b.fwd;
  // dO is an input: it may alias itself (e.g. a broadcast gradient), so only the gradients are checked.
  FA3_TRY(check_tensor(b.dout, q_spec(p, "dout", p.head_dim_v, "head_dim_v", p.out_dtype), false));
  FA3_TRY(check_tensor(b.dq, q_spec(p, "dq", p.head_dim_qk, "head_dim_qk", p.dtype), true));
  FA3_TRY(check_tensor(b.dk, k_spec(p, "dk", p.head_dim_qk, "head_dim_qk"), true));
  FA3_TRY(check_tensor(b.dv, k_spec(p, "dv", p.head_dim_v, "head_dim_v"), true));
  return ok();
}

}  // namespace

Status validate_fwd(const fa3_fwd_params* p) {
  if (p == nullptr) return invalid("params must not be NULL");
  FA3_TRY(check_struct_size(p->struct_size, sizeof(fa3_fwd_params), "fa3_fwd_params_init"));
  FA3_TRY(check_dtypes(*p));
  FA3_TRY(check_sizes(*p));
  FA3_TRY(check_head_dim("head_dim_qk", p->head_dim_qk, p->dtype));
  FA3_TRY(check_head_dim("head_dim_v", p->head_dim_v, p->dtype));
  FA3_TRY(check_varlen(*p));
  FA3_TRY(check_fwd_tensors(*p));
  FA3_TRY(check_lse(*p));
  FA3_TRY(check_sinks(p->sinks, "sinks"));
  FA3_TRY(check_scores(*p));
  FA3_TRY(check_mask(*p));
  FA3_TRY(check_paged(*p));
  FA3_TRY(check_descale(*p));
  FA3_TRY(check_block_descales(*p));
  FA3_TRY(check_append(*p));
  FA3_TRY(check_leftpad(*p));
  FA3_TRY(check_splits(*p));
  FA3_TRY(check_workspace(p->workspace, p->workspace_bytes));
  return ok();
}

// fa3_quantize_fp8: 16-byte loads of 8 columns (head_dim a multiple of 8), a CTA per 128 rows or
// per block (quantize_fp8.cu).
Status validate_quantize(const fa3_quantize_params* p) {
  if (p == nullptr) return invalid("params must not be NULL");
  FA3_TRY(check_struct_size(p->struct_size, sizeof(fa3_quantize_params), "fa3_quantize_params_init"));
  if (p->in_dtype != FA3_DTYPE_FP16 && p->in_dtype != FA3_DTYPE_BF16)
    return invalid("in_dtype must be FA3_DTYPE_FP16 or FA3_DTYPE_BF16; got " + std::string(dtype_name(p->in_dtype)));
  FA3_TRY(check_positive("batch", p->batch));
  FA3_TRY(check_positive("heads", p->heads));
  if (p->seqlen < 0) return invalid("seqlen must be >= 0; got " + to_string(p->seqlen));
  // The kernel walks a sequence's positions in 32 bits, a block (or 128 rows) past the last included.
  if (int64_t(p->seqlen) + std::max(p->block_size, 128) > kMaxIndex32)
    return invalid("seqlen + max(block_size, 128) must be <= " + to_string(kMaxIndex32) + "; got seqlen " +
                   to_string(p->seqlen) + ", block_size " + to_string(p->block_size));
  if (p->head_dim < 8 || p->head_dim > 256 || p->head_dim % 8 != 0)
    return invalid("head_dim must be a multiple of 8 in [8, 256]; got " + to_string(p->head_dim));
  if (p->hadamard != 0 && p->hadamard != 1) return invalid("hadamard must be 0 or 1; got " + to_string(p->hadamard));
  if (p->hadamard && (p->head_dim < 16 || (p->head_dim & (p->head_dim - 1)) != 0))
    return invalid("head_dim must be a power of two >= 16 with hadamard (a Walsh-Hadamard transform); got " +
                   to_string(p->head_dim));
  const int bs = p->block_size;
  if (!(bs == 16 || bs == 32 || bs == 64 || (bs >= 128 && bs % 128 == 0)))
    return invalid("block_size must be 16, 32, 64 or a positive multiple of 128; got " + to_string(bs));
  // The kernel numbers its chunks in 32 bits, with room for a grid's stride past the last.
  const int64_t chunks = fp8::chunk_count(*p);
  if (chunks > (int64_t(1) << 30))
    return invalid("seqlen x heads x batch is too large: ceil(seqlen / max(block_size, 128)) * heads * batch must be "
                   "<= 2^30; got " + to_string(chunks));
  const bool packed = p->cu_seqlens != nullptr;
  if (packed) {
    FA3_TRY(check_positive("total", p->total));
    if (!aligned(p->cu_seqlens, sizeof(int32_t)))
      return invalid("cu_seqlens must be 4-byte aligned (int32); got " + hex(p->cu_seqlens));
  }
  const int64_t rows = packed ? p->total : p->seqlen;
  FA3_TRY(check_tensor(p->in, TensorSpec{"in", p->in_dtype, packed, p->batch, rows, p->heads, p->head_dim,
                                         packed ? "total" : "seqlen", "heads", "head_dim"},
                       false));
  FA3_TRY(check_tensor(p->out, TensorSpec{"out", FA3_DTYPE_E4M3, packed, p->batch, rows, p->heads, p->head_dim,
                                          packed ? "total" : "seqlen", "heads", "head_dim"},
                       true));
  if (p->descale == nullptr) return invalid("descale must not be NULL (the block descales are written there)");
  if (!aligned(p->descale, 4)) return invalid("descale must be 4-byte aligned (float32)");
  if (p->descale_batch_stride < 0)
    return invalid("descale_batch_stride must be >= 0; got " + to_string(p->descale_batch_stride));
  if (p->descale_head_stride < 0)
    return invalid("descale_head_stride must be >= 0; got " + to_string(p->descale_head_stride));
  // An output: no two (sequence, head) pairs may share descale slots.
  const int64_t blocks = (static_cast<int64_t>(p->seqlen) + bs - 1) / bs;
  const int64_t hs = p->descale_head_stride, bst = p->descale_batch_stride;
  const bool heads_apart = p->heads == 1 || hs >= blocks, batches_apart = p->batch == 1 || bst >= blocks;
  const bool nested = p->heads == 1 || p->batch == 1 || bst >= span(hs, p->heads) || hs >= span(bst, p->batch);
  if (blocks > 0 && !(heads_apart && batches_apart && nested))
    return invalid("descale strides make (sequence, head) slots overlap: each holds ceil(seqlen / block_size) = " +
                   to_string(blocks) + " floats; got descale_batch_stride " + to_string(bst) +
                   ", descale_head_stride " + to_string(hs));
  return ok();
}

// The combine kernel reads partial rows as float4 and writes 4 columns per lane.
Status validate_combine(const fa3_combine_params* p) {
  if (p == nullptr) return invalid("params must not be NULL");
  FA3_TRY(check_struct_size(p->struct_size, sizeof(fa3_combine_params), "fa3_combine_params_init"));
  if (p->out_dtype != FA3_DTYPE_FP16 && p->out_dtype != FA3_DTYPE_BF16 && p->out_dtype != FA3_DTYPE_FP32)
    return invalid("out_dtype must be FA3_DTYPE_FP16, FA3_DTYPE_BF16 or FA3_DTYPE_FP32; got " +
                   std::string(dtype_name(p->out_dtype)));
  if (p->num_splits < 1 || p->num_splits > attn::kMaxCombineSplits)
    return invalid("num_splits must be in [1, " + to_string(attn::kMaxCombineSplits) + "]; got " +
                   to_string(p->num_splits));
  FA3_TRY(check_positive("batch", p->batch));
  FA3_TRY(check_positive("seqlen", p->seqlen));
  FA3_TRY(check_positive("heads", p->heads));
  if (p->head_dim < 4 || p->head_dim > attn::kMaxCombineHeadDim || p->head_dim % 4 != 0)
    return invalid("head_dim must be a multiple of 4 in [4, " + to_string(attn::kMaxCombineHeadDim) + "]; got " +
                   to_string(p->head_dim));
  // The kernel numbers a batch entry's (row, head) pairs in 32 bits (combine.cu).
  if (int64_t(p->seqlen) * p->heads > kMaxIndex32)
    return invalid("seqlen * heads must be <= " + to_string(kMaxIndex32) + "; got " + to_string(p->seqlen) +
                   " * " + to_string(p->heads));
  if (p->out_partial == nullptr) return invalid("out_partial must not be NULL");
  if (p->lse_partial == nullptr) return invalid("lse_partial must not be NULL");
  if (p->out.data == nullptr) return invalid("out.data must not be NULL");
  FA3_TRY(check_sinks(p->sinks, "sinks"));
  if (!aligned(p->out_partial, 16)) return invalid("out_partial must be 16-byte aligned; got " + hex(p->out_partial));
  const std::pair<int64_t, const char*> partial_strides[] = {
      {p->out_partial_split_stride, "out_partial_split_stride"},
      {p->out_partial_batch_stride, "out_partial_batch_stride"},
      {p->out_partial_row_stride, "out_partial_row_stride"},
      {p->out_partial_head_stride, "out_partial_head_stride"}};
  for (const auto& [stride, name] : partial_strides)
    if (stride < 0 || stride % 4 != 0)
      return invalid(std::string(name) + " must be a non-negative multiple of 4 (16-byte rows); got " + to_string(stride));
  const int64_t out_align = p->out_dtype == FA3_DTYPE_FP32 ? 16 : 8;
  if (!aligned(p->out.data, out_align))
    return invalid("out.data must be " + to_string(out_align) + "-byte aligned; got " + hex(p->out.data));
  const std::pair<int64_t, const char*> out_strides[] = {
      {p->out.batch_stride, "out.batch_stride"}, {p->out.row_stride, "out.row_stride"},
      {p->out.head_stride, "out.head_stride"}};
  for (const auto& [stride, name] : out_strides)
    if (stride < 0 || stride % 4 != 0)
      return invalid(std::string(name) + " must be a non-negative multiple of 4; got " + to_string(stride));
  const std::pair<int64_t, const char*> lse_strides[] = {
      {p->lse_partial_split_stride, "lse_partial_split_stride"}, {p->lse_partial_batch_stride, "lse_partial_batch_stride"},
      {p->lse_partial_row_stride, "lse_partial_row_stride"},     {p->lse_partial_head_stride, "lse_partial_head_stride"},
      {p->lse_batch_stride, "lse_batch_stride"},                 {p->lse_row_stride, "lse_row_stride"},
      {p->lse_head_stride, "lse_head_stride"}};
  for (const auto& [stride, name] : lse_strides)
    if (stride < 0) return invalid(std::string(name) + " must be >= 0; got " + to_string(stride));
  const std::pair<const void*, const char*> words[] = {
      {p->lse_partial, "lse_partial"}, {p->lse, "lse"}, {p->cu_seqlens, "cu_seqlens"}, {p->seqused, "seqused"}};
  for (const auto& [ptr, name] : words)
    if (!aligned(ptr, 4)) return invalid(std::string(name) + " must be 4-byte aligned; got " + hex(ptr));
  // An output: no two (row, head) pairs may share elements (packed rows: at least seqlen of them).
  FA3_TRY(check_no_overlap(p->out, TensorSpec{"out", p->out_dtype, p->cu_seqlens != nullptr, p->batch, p->seqlen,
                                              p->heads, p->head_dim, "seqlen", "heads", "head_dim"}));
  return ok();
}

Status validate_bwd(const fa3_bwd_params* p) {
  if (p == nullptr) return invalid("params must not be NULL");
  FA3_TRY(check_struct_size(p->struct_size, sizeof(fa3_bwd_params), "fa3_bwd_params_init"));
  FA3_TRY(validate_fwd(&p->fwd));
  if (p->fwd.dtype == FA3_DTYPE_E4M3) return not_supported("the FP8 backward (dtype e4m3)");
  if (p->fwd.page_table != nullptr) return not_supported("the backward with a paged KV cache (page_table)");
  // The KV-cache append is the forward's alone: its keys per sequence are seqused_k here.
  if (p->fwd.k_new.data != nullptr || p->fwd.v_new.data != nullptr)
    return not_supported("the backward of a KV-cache append (k_new / v_new)");
  if (p->fwd.rotary_cos != nullptr || p->fwd.rotary_sin != nullptr)
    return not_supported("the backward of the rotary embedding (rotary_cos / rotary_sin)");
  if (p->fwd.cache_seqlens != nullptr)
    return invalid("cache_seqlens must be NULL for the backward (pass the keys each sequence used as seqused_k)");
  if (p->fwd.leftpad_k != nullptr)
    return not_supported("the backward with leftpad_k (pass packed keys with cu_seqlens_k and seqused_k)");
  // The backward's kernels take heads and batch entries as grid dimensions.
  if (p->fwd.heads_q > kMaxGridYz || p->fwd.batch > kMaxGridYz)
    return invalid("heads_q and batch must be <= " + to_string(kMaxGridYz) + " for the backward; got heads_q " +
                   to_string(p->fwd.heads_q) + ", batch " + to_string(p->fwd.batch));
  // dS needs P = exp(S - LSE), and recomputing LSE would cost a second forward.
  if (p->fwd.lse == nullptr) return invalid("lse must not be NULL for the backward (pass the forward's LSE)");
  FA3_TRY(check_bwd_tensors(*p));
  if (p->deterministic != 0 && p->deterministic != 1)
    return invalid("deterministic must be 0 or 1; got " + to_string(p->deterministic));
  if (p->dsinks != nullptr && p->fwd.sinks == nullptr)
    return invalid("dsinks needs fwd.sinks (the sinks the forward used); got fwd.sinks NULL");
  FA3_TRY(check_sinks(p->dsinks, "dsinks"));
  if (p->dlse != nullptr && !aligned(p->dlse, sizeof(float)))  // (laid out as lse: no strides of its own)
    return invalid("dlse must be 4-byte aligned (float32, laid out as fwd.lse); got " + hex(p->dlse));
  FA3_TRY(check_workspace(p->workspace, p->workspace_bytes));
  return ok();
}

}  // namespace fa3::detail
