// The work before the attention (append_kv.h). The append kernel, a warp per (row, head): the new
// keys and values of batch entry b go to cache positions cache_seqlens[b] + i (contiguous or
// paged), rotated keys first; with rotary each Q row is rotated (and negated for a negative scale)
// into the workspace. That data is a decode step's few rows: bandwidth-bound and small next to the
// attention that follows, so the kernel is plain (lanes on rotation pairs, fp32 math, one rounding
// to the dtype, as the attention's inputs are). Block 0 also writes each sequence's key count and,
// for a left-padded cache, where its keys start as packed rows. A negative scale without rotary
// negates a whole Q, a prefill's too: a kernel of its own, a thread per 16-byte chunk.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "src/api/problem.h"
#include "src/api/validate.h"
#include "src/attention/append_kv.h"
#include "src/hopper/elem.cuh"
#include "src/hopper/launch.h"

namespace fa3::attn {
namespace {

constexpr int kWarps = 8;

size_t align256(size_t x) { return (x + 255) / 256 * 256; }

// x with its sign bit flipped: -x exactly (a NaN stays a NaN), in a 16-bit float or an e4m3 byte.
template <class T>
__device__ T negated(T x) {
  static_assert(sizeof(T) == 2 || sizeof(T) == 1, "fp16 / bf16 elements or e4m3 bytes");
  if constexpr (sizeof(T) == 1) return T(x ^ 0x80u);
  uint16_t b;
  memcpy(&b, &x, sizeof b);
  b ^= 0x8000u;
  memcpy(&x, &b, sizeof b);
  return x;
}

// One row's rotary embedding: its first rotary_dim columns as pairs (x1, x2) -> (x1 cos - x2 sin,
// x1 sin + x2 cos), pair i being columns (2i, 2i + 1) interleaved or (i, i + rotary_dim / 2) not, at
// table row `pos`; the other columns copied; every element negated with `negate`. rotary_dim 0: a
// copy. 16-bit elements, or e4m3 bytes (uint8_t), which are only copied: validation refuses rotary
// with e4m3 (a rotated e4m3 value would need a second rounding and its own descale).
template <class T>
__device__ void rotate_row(const fa3_fwd_params& a, const T* src, T* dst, int dim, int pos, int lane,
                           bool negate = false) {
  auto out = [&](T x) { return negate ? negated(x) : x; };
  int half = 0;
  if constexpr (sizeof(T) == 2) {
    half = a.rotary_cos != nullptr ? a.rotary_dim / 2 : 0;
    const T* cos = half > 0 ? static_cast<const T*>(a.rotary_cos) + int64_t(pos) * a.rotary_row_stride : nullptr;
    const T* sin = half > 0 ? static_cast<const T*>(a.rotary_sin) + int64_t(pos) * a.rotary_row_stride : nullptr;
    for (int i = lane; i < half; i += 32) {
      const int c1 = a.rotary_interleaved ? 2 * i : i, c2 = a.rotary_interleaved ? 2 * i + 1 : i + half;
      const float x1 = hopper::to_f32(src[c1]), x2 = hopper::to_f32(src[c2]);
      const float c = hopper::to_f32(cos[i]), s = hopper::to_f32(sin[i]);
      // Each product and sum rounded on its own (no FMA contraction): the CPU tests repeat it bit for bit.
      dst[c1] = out(hopper::from_f32<T>(__fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s))));
      dst[c2] = out(hopper::from_f32<T>(__fadd_rn(__fmul_rn(x1, s), __fmul_rn(x2, c))));
    }
  }
  for (int x = 2 * half + lane; x < dim; x += 32) dst[x] = out(src[x]);
}

// Q's negated copy without rotary: a thread per 16-byte chunk of a (row, head), consecutive
// threads on consecutive chunks of a head's row, then of the row's next head and of the next rows
// (coalesced reads where Q is contiguous, always coalesced writes: the copy is). Each 32-bit word
// XORed with `sign`, its elements' sign bits. Q's rows and the copy's are 16-byte aligned
// (validation: TMA's alignment and strides); strides here are in 16-byte chunks.
__global__ void __launch_bounds__(256) negate_q_kernel(const uint4* q, uint4* out, int64_t batch_stride,
                                                       int64_t row_stride, int64_t head_stride, int seqlen_q,
                                                       bool packed, int heads, int chunks_per_head, int64_t chunks,
                                                       uint32_t sign) {
  for (int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; c < chunks; c += int64_t(gridDim.x) * blockDim.x) {
    const int64_t unit = c / chunks_per_head;
    const int x = int(c - unit * chunks_per_head), h = int(unit % heads);
    const int64_t r = unit / heads;  // packed: the row; dense: batch entry r / seqlen_q, row r % seqlen_q
    const int64_t row = packed ? r * row_stride : r / seqlen_q * batch_stride + r % seqlen_q * row_stride;
    uint4 v = q[row + h * head_stride + x];
    v.x ^= sign;
    v.y ^= sign;
    v.z ^= sign;
    v.w ^= sign;
    out[c] = v;
  }
}

// Where key position `pos` of batch entry b, kv head h lies in K or V (t): contiguous rows, or the
// page the page table names.
__device__ int64_t cache_offset(const fa3_fwd_params& a, const fa3_tensor& t, int b, int pos, int h) {
  if (a.page_table != nullptr) {
    const int page = a.page_table[int64_t(b) * a.page_table_batch_stride + pos / a.page_size];
    return int64_t(page) * t.batch_stride + int64_t(pos % a.page_size) * t.row_stride + int64_t(h) * t.head_stride;
  }
  return int64_t(b) * t.batch_stride + int64_t(pos) * t.row_stride + int64_t(h) * t.head_stride;
}

// Row r of a set of rows that is dense ([batch][per_batch]) or packed (cu: int32 [batch + 1]
// cumulative counts): its batch entry and its index within that entry.
struct RowOf {
  int b, i;
};
__device__ RowOf row_of(int64_t r, const int32_t* cu, int batch, int per_batch) {
  if (cu == nullptr) return {int(r / per_batch), int(r % per_batch)};
  int lo = 0, hi = batch - 1;  // the last entry starting at or before r (empty entries before it skipped)
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (cu[mid] <= r) lo = mid;
    else hi = mid - 1;
  }
  return {lo, int(r - cu[lo])};
}
// The offset of row (b, i), row r of the set, head h in t: packed rows by r, dense by (b, i).
__device__ int64_t row_offset(const fa3_tensor& t, bool packed, int64_t r, RowOf row, int h) {
  return (packed ? r * t.row_stride : int64_t(row.b) * t.batch_stride + int64_t(row.i) * t.row_stride) +
         int64_t(h) * t.head_stride;
}

// Work units, a warp each: new key/value rows x heads_kv ([batch][seqlen_new], or total_new packed
// rows), then (q_out: Q's rotated copy) query rows x heads_q ([batch][seqlen_q], or total_q packed
// rows), negated with negate_q. Block 0 also writes the key counts (seqused: with new keys or left
// padding) and, with left padding, the packed rows' starts (cu_k, int32 [batch + 1];
// rows_per_batch and total_rows: append_kv.h).
template <class T>
__global__ void __launch_bounds__(kWarps * 32) append_kernel(const fa3_fwd_params a, int* seqused, int* cu_k,
                                                             int64_t rows_per_batch, int total_rows, T* q_out,
                                                             bool windowed, bool negate_q) {
  const int lane = threadIdx.x % 32;
  const bool packed_new = a.cu_seqlens_new != nullptr, packed_q = a.cu_seqlens_q != nullptr;
  if (blockIdx.x == 0 && seqused != nullptr) {
    for (int b = threadIdx.x; b < a.batch; b += blockDim.x) {  // past seqlen_k nothing is written (the caller's contract)
      const int added = a.k_new.data == nullptr ? 0 : packed_new ? a.cu_seqlens_new[b + 1] - a.cu_seqlens_new[b] : a.seqlen_new;
      // The row after the sequence's last key, counted from the cache's row 0.
      const int end = a.cache_seqlens != nullptr ? a.cache_seqlens[b] + added
                      : a.seqused_k != nullptr  ? a.seqused_k[b]
                                                : a.seqlen_k;
      const int stop = max(0, min(end, a.seqlen_k));
      const int start = cu_k != nullptr ? max(0, min(a.leftpad_k[b], stop)) : 0;
      seqused[b] = stop - start;
      if (cu_k != nullptr) cu_k[b] = int(b * rows_per_batch) + start;
    }
    // (packed rows end at the last entry's rows: nothing past the cache is in the attention's K)
    if (cu_k != nullptr && threadIdx.x == 0) cu_k[a.batch] = total_rows;
  }
  const int64_t new_rows = packed_new ? a.total_new : int64_t(a.batch) * a.seqlen_new;
  const int64_t kv_units = a.k_new.data != nullptr ? new_rows * a.heads_kv : 0;
  const int64_t unit = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  // Positions outside the table (a broken contract) read its first or last row rather than past it.
  auto table_row = [&](int pos) { return max(0, min(pos, a.rotary_rows - 1)); };
  // The rotary position of sequence b's first new key: rotary_seqlens, else where it goes.
  auto rotary_base = [&](int b) {
    return a.rotary_seqlens != nullptr ? a.rotary_seqlens[b] : a.cache_seqlens != nullptr ? a.cache_seqlens[b] : 0;
  };
  if (unit < kv_units) {
    const int h = int(unit % a.heads_kv);
    const int64_t r = unit / a.heads_kv;
    const RowOf row = row_of(r, a.cu_seqlens_new, a.batch, a.seqlen_new);
    const int b = row.b, i = row.i;
    const int pos = (a.cache_seqlens ? a.cache_seqlens[b] : 0) + i;
    if (pos < 0 || pos >= a.seqlen_k) return;  // (outside the cache: a broken contract writes nothing)
    const int64_t src = row_offset(a.k_new, packed_new, r, row, h);
    const int64_t vsrc = row_offset(a.v_new, packed_new, r, row, h);
    rotate_row<T>(a, static_cast<const T*>(a.k_new.data) + src, static_cast<T*>(a.k.data) + cache_offset(a, a.k, b, pos, h),
                  a.head_dim_qk, table_row(rotary_base(b) + i), lane);
    const T* v_src = static_cast<const T*>(a.v_new.data) + vsrc;
    T* v_dst = static_cast<T*>(a.v.data) + cache_offset(a, a.v, b, pos, h);
    for (int x = lane; x < a.head_dim_v; x += 32) v_dst[x] = v_src[x];
    return;
  }
  if (q_out == nullptr) return;
  const int64_t qu = unit - kv_units;
  const int64_t q_rows = packed_q ? a.total_q : int64_t(a.batch) * a.seqlen_q;
  if (qu >= q_rows * a.heads_q) return;
  const int h = int(qu % a.heads_q);
  const int64_t r = qu / a.heads_q;
  const RowOf row = row_of(r, a.cu_seqlens_q, a.batch, a.seqlen_q);
  // FlashAttention-3's rule: a causal or windowed query sits at the cache's end plus its index,
  // others at the cache's end.
  const int pos = rotary_base(row.b) + (windowed ? row.i : 0);
  const T* src = static_cast<const T*>(a.q.data) + row_offset(a.q, packed_q, r, row, h);
  // (the copy's rows in Q's order: dense [batch][seqlen_q] or packed, heads_q x head_dim_qk each)
  rotate_row<T>(a, src, q_out + (r * a.heads_q + h) * a.head_dim_qk, a.head_dim_qk, table_row(pos), lane, negate_q);
}

// The append's rows on the host: new keys ([batch][seqlen_new], or total_new packed) and queries
// ([batch][seqlen_q], or total_q packed), as the kernel counts its work units.
int64_t new_key_rows(const fa3_fwd_params& a) {
  return a.cu_seqlens_new != nullptr ? a.total_new : int64_t(a.batch) * a.seqlen_new;
}
int64_t query_rows(const fa3_fwd_params& a) {
  return a.cu_seqlens_q != nullptr ? a.total_q : int64_t(a.batch) * a.seqlen_q;
}

}  // namespace

AppendWorkspace append_workspace(const fa3_fwd_params& a) {
  AppendWorkspace w;
  if (!has_append(a)) return w;
  w.rotate_q = a.rotary_cos != nullptr;
  w.negate_q = a.softmax_scale < 0.f;
  w.counts = a.k_new.data != nullptr || a.leftpad_k != nullptr;
  w.cu_k = align256(w.counts ? size_t(a.batch) * sizeof(int) : 0);
  w.q = align256(w.cu_k + (a.leftpad_k != nullptr ? size_t(a.batch + 1) * sizeof(int) : 0));
  const size_t q_bytes =
      w.copies_q() ? size_t(query_rows(a)) * a.heads_q * a.head_dim_qk * size_t(detail::element_bytes(a.dtype)) : 0;
  w.bytes = align256(w.q + q_bytes);
  return w;
}

fa3_fwd_params attention_params(const fa3_fwd_params& a, const AppendWorkspace& w) {
  fa3_fwd_params r = a;
  if (a.cache_seqlens == nullptr && !has_append(a)) return r;
  // (validated: seqused_k is NULL with cache_seqlens; rotary alone keeps the caller's seqused_k)
  r.seqused_k = a.cache_seqlens != nullptr ? a.cache_seqlens : a.seqused_k;
  r.cache_seqlens = nullptr;
  if (!has_append(a)) return r;
  // kernel_name and the workspace query read shapes and which pointers are set, not where they
  // point, and their workspace may be smaller than the append's share: the addresses are computed
  // as integers, which cannot overflow into undefined behaviour (validation refuses a workspace
  // range that wraps; fa3_forward checks the share before it launches).
  const uintptr_t base = reinterpret_cast<uintptr_t>(a.workspace);
  auto at = [&](size_t offset) { return base != 0 ? reinterpret_cast<uint8_t*>(base + offset) : nullptr; };
  if (w.counts) r.seqused_k = reinterpret_cast<const int32_t*>(at(w.seqused));
  if (a.leftpad_k != nullptr) {  // packed keys: sequence b's from row b * rows + leftpad_k[b] (validated)
    r.cu_seqlens_k = reinterpret_cast<const int32_t*>(at(w.cu_k));
    r.total_k = int32_t(leftpad_total_rows(a));
    r.leftpad_k = nullptr;
  }
  if (w.copies_q()) {  // (packed rows: the batch stride is not read)
    const int64_t d = a.head_dim_qk, h = a.heads_q;
    r.q = fa3_tensor{at(w.q), int64_t(a.seqlen_q) * h * d, h * d, d};
  }
  if (w.negate_q) r.softmax_scale = -a.softmax_scale;
  r.k_new = r.v_new = fa3_tensor{};
  r.seqlen_new = r.total_new = 0;
  r.cu_seqlens_new = nullptr;
  r.rotary_cos = r.rotary_sin = nullptr;
  r.rotary_seqlens = nullptr;
  r.rotary_dim = r.rotary_rows = 0;
  // The attention's own scratch follows (a workspace of exactly the append's share leaves none).
  r.workspace = a.workspace_bytes <= w.bytes ? nullptr : at(w.bytes);
  r.workspace_bytes = a.workspace_bytes > w.bytes ? a.workspace_bytes - w.bytes : 0;
  return r;
}

// Q's negated copy without rotary (negate_q_kernel) into the workspace at w.q.
Status launch_negate_q(const fa3_fwd_params& a, const AppendWorkspace& w, cudaStream_t stream) {
  const int elem = int(detail::element_bytes(a.dtype));  // (head_dim_qk * elem: whole 16-byte chunks, validated)
  const int chunks_per_head = a.head_dim_qk * elem / 16;
  const int64_t chunks = query_rows(a) * a.heads_q * chunks_per_head;
  if (chunks == 0) return Status();
  const int64_t per_chunk = 16 / elem;  // strides: elements -> chunks (multiples of 16 bytes, validated)
  // Enough CTAs to fill the GPU several times over; each walks the rest by a grid stride.
  const unsigned blocks = unsigned(std::min<int64_t>((chunks + 255) / 256, 65536));
  return hopper::launch<negate_q_kernel>(blocks, 256, 0, stream, static_cast<const uint4*>(a.q.data),
                                         reinterpret_cast<uint4*>(static_cast<uint8_t*>(a.workspace) + w.q),
                                         a.q.batch_stride / per_chunk, a.q.row_stride / per_chunk,
                                         a.q.head_stride / per_chunk, a.seqlen_q, a.cu_seqlens_q != nullptr,
                                         a.heads_q, chunks_per_head, chunks,
                                         elem == 2 ? 0x80008000u : 0x80808080u);
}

Status launch_append(const fa3_fwd_params& a, const AppendWorkspace& w, cudaStream_t stream) {
  if (w.negate_q && !w.rotate_q) FA3_TRY(launch_negate_q(a, w, stream));
  // The append kernel: new keys, rotary, or key counts (a negative scale alone needs none of them).
  if (!w.rotate_q && !w.counts) return Status();
  uint8_t* base = static_cast<uint8_t*>(a.workspace);
  int* seqused = w.counts ? reinterpret_cast<int*>(base + w.seqused) : nullptr;
  int* cu_k = a.leftpad_k != nullptr ? reinterpret_cast<int*>(base + w.cu_k) : nullptr;
  const int64_t rows_per_batch = a.leftpad_k != nullptr ? leftpad_rows_per_batch(a) : 0;
  const int total_rows = a.leftpad_k != nullptr ? int(leftpad_total_rows(a)) : 0;
  const int64_t kv_units = a.k_new.data != nullptr ? new_key_rows(a) * a.heads_kv : 0;
  const int64_t q_units = w.rotate_q ? query_rows(a) * a.heads_q : 0;
  const int64_t blocks = std::max<int64_t>(1, (kv_units + q_units + kWarps - 1) / kWarps);
  if (blocks > 0x7fffffffLL) return Status(FA3_ERROR_INVALID_ARGUMENT, "the KV-cache append: too many rows");
  // Q's rotary positions follow the mask the attention runs (a window reaching every key is none).
  const bool windowed = detail::make_problem(a).has_mask();
  // One kernel per element type: e4m3 as bytes (new keys and values copied as given; no rotary:
  // validated).
  auto run = [&](auto elem) {
    using T = decltype(elem);
    return hopper::launch<append_kernel<T>>(unsigned(blocks), kWarps * 32, 0, stream, a, seqused, cu_k,
                                            rows_per_batch, total_rows,
                                            w.rotate_q ? reinterpret_cast<T*>(base + w.q) : nullptr, windowed,
                                            w.negate_q);
  };
  if (a.dtype == FA3_DTYPE_E4M3) return run(uint8_t{});
  if (a.dtype == FA3_DTYPE_BF16) return run(__nv_bfloat16{});
  return run(__half{});
}

}  // namespace fa3::attn
