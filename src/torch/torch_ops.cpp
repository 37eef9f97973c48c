// fa3's operators for PyTorch: fa3::fwd, fa3::bwd, fa3::fwd_kvcache, fa3::combine and fa3::quantize_fp8, registered
// with the dispatcher through PyTorch's stable ABI (torch/csrc/stable), so that one build serves
// every torch >= 2.10 and every Python version (the library is loaded with torch.ops.load_library
// and needs no Python headers).
//
// The operators are thin: they read shapes, strides and devices from the tensors, allocate the
// outputs (and the backward's workspace) through PyTorch's caching allocator, which CUDA graphs
// capture, and call fa3 on the current stream through src/api/bindings.h (the C++ API's calls
// without the per-pointer device-memory checks, which CUDA tensors cannot need). fa3 validates
// every value it is given; this file checks what only the tensors know (rank, dtype, device, the
// head-dim stride) and turns a failed fa3 call into a RuntimeError carrying fa3's message. Fake (meta) kernels and
// autograd live in python/fa3/_ops.py.
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>
#include <tuple>

#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>
#include <torch/headeronly/util/Exception.h>

#include "fa3/fa3.h"
#include "src/api/bindings.h"

namespace {

using torch::stable::Tensor;
using torch::headeronly::ScalarType;
using OptTensor = std::optional<Tensor>;

// Errors name the operator's argument, as fa3's own messages do.
#define FA3_TORCH_CHECK(cond, ...) STD_TORCH_CHECK(cond, "fa3: ", __VA_ARGS__)

std::string dtype_str(ScalarType t) { return std::string(torch::headeronly::toString(t)); }

// fa3's sizes and counts are int32: a larger one (a tensor of 2^31 rows or more, a Python int past
// int32) is refused by name, not wrapped into a different, possibly valid, size.
int32_t int32_arg(int64_t x, const char* name) {
  FA3_TORCH_CHECK(x >= std::numeric_limits<int32_t>::min() && x <= std::numeric_limits<int32_t>::max(), name,
                  ": ", x, " does not fit fa3's int32 sizes");
  return static_cast<int32_t>(x);
}

fa3_dtype to_fa3_dtype(const Tensor& t, const char* name) {
  switch (t.scalar_type()) {
    case ScalarType::Half: return FA3_DTYPE_FP16;
    case ScalarType::BFloat16: return FA3_DTYPE_BF16;
    case ScalarType::Float8_e4m3fn: return FA3_DTYPE_E4M3;
    default: break;
  }
  FA3_TORCH_CHECK(false, name, ": expected float16, bfloat16 or float8_e4m3fn, got ",
                  dtype_str(t.scalar_type()));
  return FA3_DTYPE_BF16;
}

void check_cuda(const Tensor& t, const char* name, int32_t device) {
  FA3_TORCH_CHECK(t.is_cuda(), name, ": expected a CUDA tensor");
  FA3_TORCH_CHECK(t.get_device_index() == device, name, ": expected a tensor on cuda:", device,
                  " (the device of q), got cuda:", t.get_device_index());
}

// An attention tensor: rank 4 [b, s, h, d] (or [pages, page_size, h, d]) or, packed, rank 3
// [total, h, d]; fa3 reads it through (batch, row, head) strides with a contiguous last dim.
fa3_tensor view_of(const Tensor& t, const char* name, bool packed, int32_t device) {
  check_cuda(t, name, device);
  const int64_t want = packed ? 3 : 4;
  FA3_TORCH_CHECK(t.dim() == want, name, ": expected ", want, " dims (",
                  packed ? "[total, heads, head_dim], packed by cu_seqlens"
                         : "[batch, seqlen, heads, head_dim]",
                  "), got ", t.dim());
  FA3_TORCH_CHECK(t.size(want - 1) <= 1 || t.stride(want - 1) == 1, name,
                  ": the last (head_dim) dimension must be contiguous (stride 1), got stride ",
                  t.stride(want - 1));
  fa3_tensor v{};
  v.data = t.mutable_data_ptr();
  v.batch_stride = packed ? 0 : t.stride(0);
  v.row_stride = t.stride(want - 3);
  v.head_stride = t.stride(want - 2);
  return v;
}

const int32_t* int32_vector(const OptTensor& t, const char* name, int64_t length, int32_t device) {
  if (!t.has_value()) return nullptr;
  check_cuda(*t, name, device);
  FA3_TORCH_CHECK(t->scalar_type() == ScalarType::Int, name, ": expected int32, got ",
                  dtype_str(t->scalar_type()));
  FA3_TORCH_CHECK(t->dim() == 1 && t->size(0) == length, name, ": expected shape [", length,
                  "], got ", t->dim() == 1 ? std::to_string(t->size(0)) : "rank " + std::to_string(t->dim()));
  FA3_TORCH_CHECK(t->stride(0) == 1 || length <= 1, name, ": expected a contiguous tensor");
  return static_cast<const int32_t*>(t->const_data_ptr());
}

// Attention sinks (and their gradient): float32 [heads_q], contiguous, on q's device.
const float* heads_vector(const OptTensor& t, const char* name, int64_t heads_q, int32_t device) {
  if (!t.has_value()) return nullptr;
  check_cuda(*t, name, device);
  FA3_TORCH_CHECK(t->scalar_type() == ScalarType::Float && t->dim() == 1 && t->size(0) == heads_q &&
                      (heads_q <= 1 || t->stride(0) == 1),
                  name, ": expected a contiguous float32 [heads_q] = [", heads_q, "] tensor, got ",
                  dtype_str(t->scalar_type()), " of rank ", t->dim());
  return static_cast<const float*>(t->const_data_ptr());
}

// A contiguous CUDA tensor from PyTorch's caching allocator. aoti_torch_empty_strided is the stable
// shim's direct entry; torch::stable::empty looks aten::empty up by name and calls it boxed, which
// costs ~1 us more per allocation on the forward's host path (two allocations per call).
Tensor new_cuda_tensor(std::initializer_list<int64_t> sizes, int32_t dtype, int32_t device) {
  int64_t shape[4], strides[4];
  const int64_t ndim = static_cast<int64_t>(sizes.size());
  int64_t i = 0;
  for (int64_t s : sizes) shape[i++] = s;
  int64_t stride = 1;
  for (i = ndim - 1; i >= 0; --i) {
    strides[i] = stride;
    stride *= shape[i] > 0 ? shape[i] : 1;
  }
  AtenTensorHandle handle = nullptr;
  TORCH_ERROR_CODE_CHECK(aoti_torch_empty_strided(ndim, shape, strides, dtype,
                                                  aoti_torch_device_type_cuda(), device, &handle));
  return Tensor(handle);
}

// The scratch fa3 asks for (`bytes`, from fa3::workspace_size) from PyTorch's caching allocator,
// which orders reuse on the current stream: the returned tensor may go once the call is queued.
template <class Args>
std::optional<Tensor> attach_workspace(Args& a, size_t bytes, int32_t device) {
  if (bytes == 0) return std::nullopt;
  Tensor w = new_cuda_tensor({static_cast<int64_t>(bytes)}, aoti_torch_dtype_uint8(), device);
  a.workspace = w.mutable_data_ptr();
  a.workspace_bytes = bytes;
  return w;
}

void* current_stream(int32_t device) {
  void* stream = nullptr;
  TORCH_ERROR_CODE_CHECK(aoti_torch_get_current_cuda_stream(device, &stream));
  return stream;
}

// fa3 launches on the current device: make it q's, but only pay for a guard when it is not.
std::optional<torch::stable::accelerator::DeviceGuard> device_guard(int32_t device) {
  std::optional<torch::stable::accelerator::DeviceGuard> guard;
  if (torch::stable::accelerator::getCurrentDeviceIndex() != device) guard.emplace(device);
  return guard;
}

void throw_if_failed(const fa3::Status& st, const char* op) {
  FA3_TORCH_CHECK(st.ok(), op, ": ", st.message());
}

// The forward's arguments, shared by fwd and bwd (the backward repeats the forward's problem).
struct Problem {
  fa3::FwdArgs args;
  int32_t device = 0;
  bool varlen_q = false;
};

Problem make_problem(const Tensor& q, const Tensor& k, const Tensor& v, const OptTensor& cu_seqlens_q,
                     const OptTensor& cu_seqlens_k, const OptTensor& seqused_q,
                     const OptTensor& seqused_k, int64_t max_seqlen_q, int64_t max_seqlen_k,
                     const OptTensor& page_table, double softmax_scale, bool causal,
                     int64_t window_left, int64_t window_right, double softcap) {
  Problem p;
  fa3::FwdArgs& a = p.args;
  FA3_TORCH_CHECK(q.is_cuda(), "q: expected a CUDA tensor");
  p.device = q.get_device_index();
  p.varlen_q = cu_seqlens_q.has_value();
  const bool varlen_k = cu_seqlens_k.has_value();
  const bool paged = page_table.has_value();
  FA3_TORCH_CHECK(!(paged && varlen_k), "page_table: cannot be combined with cu_seqlens_k (a paged "
                  "cache gives each sequence's keys by seqused_k)");

  a.dtype = to_fa3_dtype(q, "q");
  FA3_TORCH_CHECK(k.scalar_type() == q.scalar_type(), "k: expected the dtype of q (",
                  dtype_str(q.scalar_type()), "), got ", dtype_str(k.scalar_type()));
  FA3_TORCH_CHECK(v.scalar_type() == q.scalar_type(), "v: expected the dtype of q (",
                  dtype_str(q.scalar_type()), "), got ", dtype_str(v.scalar_type()));
  a.out_dtype = a.dtype == FA3_DTYPE_E4M3 ? FA3_DTYPE_BF16 : a.dtype;

  a.q = view_of(q, "q", p.varlen_q, p.device);
  a.k = view_of(k, "k", varlen_k, p.device);
  a.v = view_of(v, "v", varlen_k, p.device);
  const int64_t qd = q.dim(), kd = k.dim();
  FA3_TORCH_CHECK(v.size(kd - 2) == k.size(kd - 2) && v.size(kd - 3) == k.size(kd - 3) &&
                      (varlen_k || v.size(0) == k.size(0)),
                  "v: expected the leading shape of k");
  FA3_TORCH_CHECK(k.size(kd - 1) == q.size(qd - 1), "k: expected head_dim ", q.size(qd - 1),
                  " (that of q), got ", k.size(kd - 1));

  const int64_t batch = p.varlen_q ? cu_seqlens_q->size(0) - 1 : q.size(0);
  FA3_TORCH_CHECK(!p.varlen_q || cu_seqlens_q->dim() == 1, "cu_seqlens_q: expected a 1-D tensor");
  a.batch = int32_arg(batch, "batch");
  a.heads_q = int32_arg(q.size(qd - 2), "q: heads");
  a.heads_kv = int32_arg(k.size(kd - 2), "k: heads");
  a.head_dim_qk = int32_arg(q.size(qd - 1), "q: head_dim");
  a.head_dim_v = int32_arg(v.size(kd - 1), "v: head_dim");
  if (p.varlen_q) {
    a.seqlen_q = int32_arg(max_seqlen_q, "max_seqlen_q");
    a.total_q = int32_arg(q.size(0), "q: rows");
  } else {
    a.seqlen_q = int32_arg(q.size(1), "q: seqlen");
  }
  if (varlen_k) {
    a.seqlen_k = int32_arg(max_seqlen_k, "max_seqlen_k");
    a.total_k = int32_arg(k.size(0), "k: rows");
  } else if (paged) {
    check_cuda(*page_table, "page_table", p.device);
    FA3_TORCH_CHECK(page_table->scalar_type() == ScalarType::Int && page_table->dim() == 2 &&
                        page_table->size(0) == batch,
                    "page_table: expected int32 [batch, max_pages_per_sequence] with batch ", batch);
    FA3_TORCH_CHECK(page_table->size(1) <= 1 || page_table->stride(1) == 1,
                    "page_table: its last dimension must be contiguous");
    a.page_table = static_cast<const int32_t*>(page_table->const_data_ptr());
    a.page_table_batch_stride = page_table->stride(0);
    a.page_size = int32_arg(k.size(1), "k: page_size");
    a.num_pages = int32_arg(k.size(0), "k: pages");
    const int64_t capacity = page_table->size(1) * k.size(1);
    // The kernels read the table entries of the keys they load (seqused_k per sequence, at most
    // seqlen_k): a table too short for them would be read past its rows.
    FA3_TORCH_CHECK(max_seqlen_k <= capacity, "max_seqlen_k: ", max_seqlen_k, " keys exceed page_table's ",
                    page_table->size(1), " pages x page_size ", k.size(1), " = ", capacity);
    a.seqlen_k = int32_arg(max_seqlen_k > 0 ? max_seqlen_k : capacity, "max_seqlen_k");
  } else {
    FA3_TORCH_CHECK(k.size(0) == batch, "k: expected batch ", batch, " (that of q), got ", k.size(0));
    a.seqlen_k = int32_arg(k.size(1), "k: seqlen");
  }
  a.cu_seqlens_q = int32_vector(cu_seqlens_q, "cu_seqlens_q", batch + 1, p.device);
  a.cu_seqlens_k = int32_vector(cu_seqlens_k, "cu_seqlens_k", batch + 1, p.device);
  a.seqused_q = int32_vector(seqused_q, "seqused_q", batch, p.device);
  a.seqused_k = int32_vector(seqused_k, "seqused_k", batch, p.device);

  a.softmax_scale = static_cast<float>(softmax_scale);
  a.causal = causal ? 1 : 0;
  // Python ints past int32 clamped, not wrapped (fa3 reads a window past every key as none).
  auto int32_clamped = [](int64_t x) {
    return static_cast<int32_t>(std::clamp<int64_t>(x, std::numeric_limits<int32_t>::min(),
                                                    std::numeric_limits<int32_t>::max()));
  };
  a.window_left = int32_clamped(window_left);
  a.window_right = int32_clamped(window_right);
  a.softcap = static_cast<float>(softcap);
  return p;
}

// fa3 reads rows through strides in 16-byte units (TMA): a unit head-dim stride, the other strides
// multiples of 16 bytes, a 16-byte aligned start. A tensor that is not so (a transposed view, a
// broadcast, a slice at an odd offset) is copied once here, on the current stream, rather than
// refused: FlashAttention's functions accept such inputs too. The copy lives until the call has been
// enqueued.
Tensor tma_readable(const Tensor& t) {
  const int64_t last = t.dim() - 1;
  if (last < 0) return t;
  const int64_t multiple = 16 / static_cast<int64_t>(t.element_size());
  bool ok = t.size(last) <= 1 || t.stride(last) == 1;
  for (int64_t i = 0; ok && i < last; ++i) ok = t.stride(i) % multiple == 0;
  if (ok && reinterpret_cast<uintptr_t>(t.const_data_ptr()) % 16 == 0) return t;
  Tensor c = torch::stable::contiguous(t);
  // A contiguous tensor at an unaligned address comes back as itself: copy it.
  return reinterpret_cast<uintptr_t>(c.const_data_ptr()) % 16 == 0 ? c : torch::stable::clone(c);
}

// A forward's outputs (O with q's leading shape and head_dim_v, contiguous; LSE [b, h, s] or
// [h, total_q]), its workspace, and the call on the current stream. Every pointer is a CUDA
// tensor's on this device (checked by the callers): fa3's pointer checks are skipped.
std::tuple<Tensor, Tensor> run_forward(Problem& p, const char* op) {
  fa3::FwdArgs& a = p.args;
  const int32_t out_dtype =
      a.out_dtype == FA3_DTYPE_FP16 ? aoti_torch_dtype_float16() : aoti_torch_dtype_bfloat16();
  Tensor out = p.varlen_q
      ? new_cuda_tensor({a.total_q, a.heads_q, a.head_dim_v}, out_dtype, p.device)
      : new_cuda_tensor({a.batch, a.seqlen_q, a.heads_q, a.head_dim_v}, out_dtype, p.device);
  Tensor lse = p.varlen_q
      ? new_cuda_tensor({a.heads_q, a.total_q}, aoti_torch_dtype_float32(), p.device)
      : new_cuda_tensor({a.batch, a.heads_q, a.seqlen_q}, aoti_torch_dtype_float32(), p.device);
  a.out = view_of(out, "out", p.varlen_q, p.device);
  a.lse = static_cast<float*>(lse.mutable_data_ptr());
  size_t bytes = 0;
  throw_if_failed(fa3::workspace_size(a, &bytes), op);
  const std::optional<Tensor> workspace = attach_workspace(a, bytes, p.device);
  throw_if_failed(fa3::detail::forward_device_tensors(a, static_cast<cudaStream_t>(current_stream(p.device))), op);
  return {out, lse};
}

std::tuple<Tensor, Tensor> fwd(Tensor q, Tensor k, Tensor v, OptTensor cu_seqlens_q,
                               OptTensor cu_seqlens_k, OptTensor seqused_q, OptTensor seqused_k,
                               int64_t max_seqlen_q, int64_t max_seqlen_k, OptTensor page_table,
                               OptTensor q_descale, OptTensor k_descale, OptTensor v_descale,
                               double softmax_scale, bool causal, int64_t window_left,
                               int64_t window_right, double softcap, int64_t num_splits,
                               bool /*deterministic: read by the autograd formula's backward*/,
                               OptTensor q_block_descale, OptTensor k_block_descale,
                               OptTensor v_block_descale, int64_t q_block_size, int64_t kv_block_size,
                               OptTensor sinks, int64_t sm_margin) {
  q = tma_readable(q);
  k = tma_readable(k);
  v = tma_readable(v);
  Problem p = make_problem(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q,
                           max_seqlen_k, page_table, softmax_scale, causal, window_left,
                           window_right, softcap);
  fa3::FwdArgs& a = p.args;
  const auto guard = device_guard(p.device);

  // Descales: float32 [batch, heads_kv], one pair of strides for all three (fa3's ABI).
  const OptTensor* descales[3] = {&q_descale, &k_descale, &v_descale};
  const char* names[3] = {"q_descale", "k_descale", "v_descale"};
  const float* ptrs[3] = {nullptr, nullptr, nullptr};
  const Tensor* first = nullptr;
  for (int i = 0; i < 3; ++i) {
    if (!descales[i]->has_value()) continue;
    const Tensor& d = descales[i]->value();
    check_cuda(d, names[i], p.device);
    FA3_TORCH_CHECK(d.scalar_type() == ScalarType::Float && d.dim() == 2 && d.size(0) == a.batch &&
                        d.size(1) == a.heads_kv,
                    names[i], ": expected float32 [batch, heads_kv] = [", a.batch, ", ", a.heads_kv, "]");
    if (!first) {
      first = &d;
      a.descale_batch_stride = d.stride(0);
      a.descale_head_stride = d.stride(1);
    } else {
      FA3_TORCH_CHECK(d.stride(0) == first->stride(0) && d.stride(1) == first->stride(1), names[i],
                      ": expected the strides of the other descale tensors");
    }
    ptrs[i] = static_cast<const float*>(d.const_data_ptr());
  }
  a.q_descale = ptrs[0];
  a.k_descale = ptrs[1];
  a.v_descale = ptrs[2];
  // Block descales: float32 [batch, heads, blocks] (Q's by query head, K's and V's by kv head),
  // blocks contiguous; fa3 checks the block sizes and counts.
  const struct {
    const OptTensor& t;
    const char* name;
    int64_t heads, block_size;
    fa3_block_scales* dst;
  } blocks[3] = {{q_block_descale, "q_block_descale", a.heads_q, q_block_size, &a.q_block_descale},
                 {k_block_descale, "k_block_descale", a.heads_kv, kv_block_size, &a.k_block_descale},
                 {v_block_descale, "v_block_descale", a.heads_kv, kv_block_size, &a.v_block_descale}};
  for (const auto& b : blocks) {
    if (!b.t.has_value()) continue;
    const Tensor& d = b.t.value();
    check_cuda(d, b.name, p.device);
    FA3_TORCH_CHECK(d.scalar_type() == ScalarType::Float && d.dim() == 3 && d.size(0) == a.batch &&
                        d.size(1) == b.heads && (d.size(2) <= 1 || d.stride(2) == 1),
                    b.name, ": expected float32 [batch, heads, blocks] = [", a.batch, ", ", b.heads,
                    ", blocks] with contiguous blocks");
    *b.dst = fa3_block_scales{static_cast<const float*>(d.const_data_ptr()), d.stride(0), d.stride(1),
                              int32_arg(b.block_size, b.name), int32_arg(d.size(2), b.name)};
  }
  a.num_splits = int32_arg(num_splits, "num_splits");
  a.sinks = heads_vector(sinks, "sinks", a.heads_q, p.device);
  a.sm_margin = int32_arg(sm_margin, "sm_margin");

  return run_forward(p, "fwd");
}

// The forward with fa3's KV-cache append and rotary (flash_attn_with_kvcache): k_new / v_new [b,
// s_new, h_kv, d] go into k_cache / v_cache ([b_cache, s_cache, h_kv, d], or pages with page_table) at
// cache_seqlens (int32 [b]), rotated with rotary_cos / rotary_sin ([rows, rotary_dim / 2], q's dtype)
// as q is, in the one fa3 call; the caches are mutated (the schema says so), out and LSE are new.
// cache_leftpad (int32 [b]): sequence b's keys start at that row of its cache rows (fa3_c.h:
// leftpad_k); rotary_seqlens (int32 [b]): the rotary positions of its new keys start there.
std::tuple<Tensor, Tensor> fwd_kvcache(Tensor q, Tensor k_cache, Tensor v_cache, OptTensor k_new, OptTensor v_new,
                                       OptTensor cache_seqlens, OptTensor rotary_cos, OptTensor rotary_sin,
                                       bool rotary_interleaved, OptTensor page_table, int64_t max_seqlen_k,
                                       double softmax_scale, bool causal, int64_t window_left, int64_t window_right,
                                       double softcap, int64_t num_splits, OptTensor sinks, OptTensor cu_seqlens_q,
                                       int64_t max_seqlen_q, OptTensor cu_seqlens_k_new, OptTensor cache_leftpad,
                                       OptTensor rotary_seqlens, int64_t sm_margin) {
  q = tma_readable(q);
  Problem p = make_problem(q, k_cache, v_cache, cu_seqlens_q, std::nullopt, std::nullopt, std::nullopt, max_seqlen_q,
                           max_seqlen_k, page_table, softmax_scale, causal, window_left, window_right, softcap);
  fa3::FwdArgs& a = p.args;
  const auto guard = device_guard(p.device);
  a.cache_seqlens = int32_vector(cache_seqlens, "cache_seqlens", a.batch, p.device);
  FA3_TORCH_CHECK(k_new.has_value() == v_new.has_value(), "k_new, v_new: give both or neither");
  if (k_new.has_value()) {
    FA3_TORCH_CHECK(k_new->scalar_type() == q.scalar_type() && v_new->scalar_type() == q.scalar_type(),
                    "k_new, v_new: expected the dtype of q (", dtype_str(q.scalar_type()), ")");
    const bool packed = cu_seqlens_k_new.has_value();
    if (packed) {  // [total_new, heads_kv, head_dim] rows, sequence b's from cu_seqlens_k_new[b]
      FA3_TORCH_CHECK(k_new->dim() == 3 && v_new->dim() == 3 && v_new->size(0) == k_new->size(0),
                      "k_new, v_new: expected [total_new, heads_kv, head_dim] with cu_seqlens_k_new");
      a.cu_seqlens_new = int32_vector(cu_seqlens_k_new, "cu_seqlens_k_new", a.batch + 1, p.device);
      a.total_new = int32_arg(k_new->size(0), "k_new: rows");
    } else {
      FA3_TORCH_CHECK(k_new->dim() == 4 && v_new->dim() == 4 && k_new->size(0) == a.batch &&
                          v_new->size(0) == a.batch && v_new->size(1) == k_new->size(1),
                      "k_new, v_new: expected [batch, seqlen_new, heads_kv, head_dim] with q's batch ", a.batch);
      a.seqlen_new = int32_arg(k_new->size(1), "k_new: seqlen");
    }
    a.k_new = view_of(*k_new, "k_new", packed, p.device);
    a.v_new = view_of(*v_new, "v_new", packed, p.device);
  } else {
    FA3_TORCH_CHECK(!cu_seqlens_k_new.has_value(), "cu_seqlens_k_new: given without k_new / v_new");
  }
  FA3_TORCH_CHECK(rotary_cos.has_value() == rotary_sin.has_value(), "rotary_cos, rotary_sin: give both or neither");
  if (rotary_cos.has_value()) {
    for (const Tensor* t : {&*rotary_cos, &*rotary_sin}) {
      const char* name = t == &*rotary_cos ? "rotary_cos" : "rotary_sin";
      check_cuda(*t, name, p.device);
      FA3_TORCH_CHECK(t->scalar_type() == q.scalar_type() && t->dim() == 2 && (t->size(1) <= 1 || t->stride(1) == 1),
                      name, ": expected [rows, rotary_dim / 2] in the dtype of q with a contiguous last dim");
    }
    FA3_TORCH_CHECK(rotary_sin->size(0) == rotary_cos->size(0) && rotary_sin->size(1) == rotary_cos->size(1) &&
                        rotary_sin->stride(0) == rotary_cos->stride(0),
                    "rotary_sin: expected the shape and strides of rotary_cos");
    a.rotary_cos = rotary_cos->const_data_ptr();
    a.rotary_sin = rotary_sin->const_data_ptr();
    a.rotary_dim = int32_arg(2 * rotary_cos->size(1), "rotary_cos: rotary_dim / 2");
    a.rotary_rows = int32_arg(rotary_cos->size(0), "rotary_cos: rows");
    a.rotary_row_stride = rotary_cos->stride(0);
    a.rotary_interleaved = rotary_interleaved ? 1 : 0;
  }
  a.leftpad_k = int32_vector(cache_leftpad, "cache_leftpad", a.batch, p.device);
  a.rotary_seqlens = int32_vector(rotary_seqlens, "rotary_seqlens", a.batch, p.device);
  a.num_splits = int32_arg(num_splits, "num_splits");
  a.sinks = heads_vector(sinks, "sinks", a.heads_q, p.device);
  a.sm_margin = int32_arg(sm_margin, "sm_margin");
  return run_forward(p, "fwd_kvcache");
}

// dsinks: float32 [heads_q] with sinks, else an empty [0] tensor (the schema's outputs are fixed).
std::tuple<Tensor, Tensor, Tensor, Tensor> bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out,
                                               Tensor softmax_lse, OptTensor cu_seqlens_q,
                                               OptTensor cu_seqlens_k, OptTensor seqused_q,
                                               OptTensor seqused_k, int64_t max_seqlen_q,
                                               int64_t max_seqlen_k, double softmax_scale, bool causal,
                                               int64_t window_left, int64_t window_right, double softcap,
                                               bool deterministic, OptTensor sinks, OptTensor dlse) {
  Problem p = make_problem(q, k, v, cu_seqlens_q, cu_seqlens_k, seqused_q, seqused_k, max_seqlen_q,
                           max_seqlen_k, std::nullopt, softmax_scale, causal, window_left,
                           window_right, softcap);
  const auto guard = device_guard(p.device);
  fa3::BwdArgs b;
  b.fwd = p.args;
  const fa3::FwdArgs& a = p.args;
  FA3_TORCH_CHECK(a.dtype != FA3_DTYPE_E4M3, "q: the backward takes float16 or bfloat16, got float8_e4m3fn");
  FA3_TORCH_CHECK(out.scalar_type() == q.scalar_type(), "out: expected the dtype of q");
  FA3_TORCH_CHECK(dout.scalar_type() == q.scalar_type(), "dout: expected the dtype of q (",
                  dtype_str(q.scalar_type()), "), got ", dtype_str(dout.scalar_type()));
  const int64_t qd = q.dim();
  for (const Tensor* t : {&out, &dout}) {
    const char* name = t == &out ? "out" : "dout";
    FA3_TORCH_CHECK(t->dim() == qd, name, ": expected ", qd, " dims like q");
    for (int64_t i = 0; i + 1 < qd; ++i)
      FA3_TORCH_CHECK(t->size(i) == q.size(i), name, ": expected the leading shape of q");
    FA3_TORCH_CHECK(t->size(qd - 1) == a.head_dim_v, name, ": expected head_dim_v ", a.head_dim_v);
  }
  b.fwd.out = view_of(out, "out", p.varlen_q, p.device);
  b.dout = view_of(dout, "dout", p.varlen_q, p.device);

  check_cuda(softmax_lse, "softmax_lse", p.device);
  const bool lse_ok = softmax_lse.scalar_type() == ScalarType::Float && softmax_lse.is_contiguous() &&
      (p.varlen_q ? softmax_lse.dim() == 2 && softmax_lse.size(0) == a.heads_q &&
                        softmax_lse.size(1) == q.size(0)
                  : softmax_lse.dim() == 3 && softmax_lse.size(0) == a.batch &&
                        softmax_lse.size(1) == a.heads_q && softmax_lse.size(2) == a.seqlen_q);
  FA3_TORCH_CHECK(lse_ok, "softmax_lse: expected contiguous float32 ",
                  p.varlen_q ? "[heads_q, total_q]" : "[batch, heads_q, seqlen_q]",
                  " as the forward returns it");
  b.fwd.lse = static_cast<float*>(softmax_lse.mutable_data_ptr());
  if (dlse.has_value()) {  // LSE's own gradient (a loss that uses softmax_lse): laid out as softmax_lse
    check_cuda(*dlse, "dlse", p.device);
    FA3_TORCH_CHECK(dlse->scalar_type() == ScalarType::Float && dlse->is_contiguous() &&
                        dlse->dim() == softmax_lse.dim() &&
                        [&] {
                          for (int64_t i = 0; i < softmax_lse.dim(); ++i)
                            if (dlse->size(i) != softmax_lse.size(i)) return false;
                          return true;
                        }(),
                    "dlse: expected contiguous float32 of softmax_lse's shape");
    b.dlse = static_cast<const float*>(dlse->data_ptr());
  }

  Tensor dq = torch::stable::empty_like(q);
  Tensor dk = torch::stable::empty_like(k);
  Tensor dv = torch::stable::empty_like(v);
  const bool varlen_k = cu_seqlens_k.has_value();
  // empty_like keeps q/k/v's strides only when they are dense; fa3 takes any strides, so read them.
  b.dq = view_of(dq, "dq", p.varlen_q, p.device);
  b.dk = view_of(dk, "dk", varlen_k, p.device);
  b.dv = view_of(dv, "dv", varlen_k, p.device);
  b.deterministic = deterministic ? 1 : 0;
  b.fwd.sinks = heads_vector(sinks, "sinks", a.heads_q, p.device);
  Tensor dsinks = new_cuda_tensor({sinks.has_value() ? int64_t(a.heads_q) : 0}, aoti_torch_dtype_float32(), p.device);
  if (sinks.has_value()) b.dsinks = static_cast<float*>(dsinks.mutable_data_ptr());

  size_t bytes = 0;
  throw_if_failed(fa3::workspace_size(b, &bytes), "bwd");
  const std::optional<Tensor> workspace = attach_workspace(b, bytes, p.device);
  throw_if_failed(fa3::detail::backward_device_tensors(b, static_cast<cudaStream_t>(current_stream(p.device))),
                  "bwd");
  return {dq, dk, dv, dsinks};
}

// Merges split results (fa3::combine): out_partial float32 [splits, batch, seqlen, heads, head_dim]
// with a contiguous head dim, lse_partial float32 [splits, batch, seqlen, heads] (FlashAttention-3's
// layouts, any other strides) -> out [batch, seqlen, heads, head_dim] in out_dtype (fa3_dtype code:
// fp16, bf16 or fp32) and lse [batch, seqlen, heads].
std::tuple<Tensor, Tensor> combine(Tensor out_partial, Tensor lse_partial, int64_t out_dtype) {
  FA3_TORCH_CHECK(out_partial.is_cuda(), "out_partial: expected a CUDA tensor");
  const int32_t device = out_partial.get_device_index();
  check_cuda(lse_partial, "lse_partial", device);
  FA3_TORCH_CHECK(out_partial.scalar_type() == ScalarType::Float && out_partial.dim() == 5,
                  "out_partial: expected float32 [splits, batch, seqlen, heads, head_dim]");
  FA3_TORCH_CHECK(out_partial.stride(4) == 1 || out_partial.size(4) <= 1,
                  "out_partial: the last (head_dim) dimension must be contiguous");
  FA3_TORCH_CHECK(lse_partial.scalar_type() == ScalarType::Float && lse_partial.dim() == 4,
                  "lse_partial: expected float32 [splits, batch, seqlen, heads]");
  for (int64_t i = 0; i < 4; ++i)
    FA3_TORCH_CHECK(lse_partial.size(i) == out_partial.size(i),
                    "lse_partial: expected the leading shape of out_partial [splits, batch, seqlen, heads]");
  FA3_TORCH_CHECK(out_dtype == FA3_DTYPE_FP16 || out_dtype == FA3_DTYPE_BF16 || out_dtype == FA3_DTYPE_FP32,
                  "out_dtype: expected fp16, bf16 or fp32");
  const auto guard = device_guard(device);
  const int64_t b = out_partial.size(1), sq = out_partial.size(2), h = out_partial.size(3), d = out_partial.size(4);
  const int32_t torch_dtype = out_dtype == FA3_DTYPE_FP16   ? aoti_torch_dtype_float16()
                              : out_dtype == FA3_DTYPE_BF16 ? aoti_torch_dtype_bfloat16()
                                                            : aoti_torch_dtype_float32();
  Tensor out = new_cuda_tensor({b, sq, h, d}, torch_dtype, device);
  Tensor lse = new_cuda_tensor({b, sq, h}, aoti_torch_dtype_float32(), device);
  fa3::CombineArgs c;
  c.out_dtype = static_cast<fa3_dtype>(out_dtype);
  c.num_splits = int32_arg(out_partial.size(0), "out_partial: splits");
  c.batch = int32_arg(b, "out_partial: batch");
  c.seqlen = int32_arg(sq, "out_partial: seqlen");
  c.heads = int32_arg(h, "out_partial: heads");
  c.head_dim = int32_arg(d, "out_partial: head_dim");
  c.out_partial = static_cast<const float*>(out_partial.const_data_ptr());
  c.out_partial_split_stride = out_partial.stride(0);
  c.out_partial_batch_stride = out_partial.stride(1);
  c.out_partial_row_stride = out_partial.stride(2);
  c.out_partial_head_stride = out_partial.stride(3);
  c.lse_partial = static_cast<const float*>(lse_partial.const_data_ptr());
  c.lse_partial_split_stride = lse_partial.stride(0);
  c.lse_partial_batch_stride = lse_partial.stride(1);
  c.lse_partial_row_stride = lse_partial.stride(2);
  c.lse_partial_head_stride = lse_partial.stride(3);
  c.out = fa3_tensor{out.mutable_data_ptr(), sq * h * d, h * d, d};
  c.lse = static_cast<float*>(lse.mutable_data_ptr());
  c.lse_batch_stride = sq * h;
  c.lse_row_stride = h;
  c.lse_head_stride = 1;
  throw_if_failed(fa3::detail::combine_device_tensors(c, static_cast<cudaStream_t>(current_stream(device))),
                  "combine");
  return {out, lse};
}

// fa3_quantize_fp8: x [b, s, h, d] fp16/bf16 -> (e4m3 [b, s, h, d], float32 descales [b, h, blocks]).
std::tuple<Tensor, Tensor> quantize_fp8(Tensor x, int64_t block_size, bool hadamard, int64_t seed) {
  FA3_TORCH_CHECK(x.scalar_type() == ScalarType::Half || x.scalar_type() == ScalarType::BFloat16,
                  "quantize_fp8: x: expected float16 or bfloat16, got ", dtype_str(x.scalar_type()));
  FA3_TORCH_CHECK(block_size >= 1, "quantize_fp8: block_size: expected >= 1, got ", block_size);
  const int32_t device = x.get_device_index();
  x = tma_readable(x);
  const fa3_tensor in = view_of(x, "x", /*packed=*/false, device);
  const auto guard = device_guard(device);
  const int64_t b = x.size(0), s = x.size(1), h = x.size(2), d = x.size(3);
  const int64_t blocks = (s + block_size - 1) / block_size;
  Tensor out = new_cuda_tensor({b, s, h, d}, aoti_torch_dtype_float8_e4m3fn(), device);
  Tensor descale = new_cuda_tensor({b, h, blocks}, aoti_torch_dtype_float32(), device);
  fa3::QuantizeArgs q;
  q.in_dtype = x.scalar_type() == ScalarType::Half ? FA3_DTYPE_FP16 : FA3_DTYPE_BF16;
  q.batch = int32_arg(b, "x: batch");
  q.seqlen = int32_arg(s, "x: seqlen");
  q.heads = int32_arg(h, "x: heads");
  q.head_dim = int32_arg(d, "x: head_dim");
  q.in = in;
  q.out = view_of(out, "out", /*packed=*/false, device);
  q.descale = static_cast<float*>(descale.mutable_data_ptr());
  q.descale_batch_stride = h * blocks;
  q.descale_head_stride = blocks;
  q.block_size = int32_arg(block_size, "block_size");
  q.hadamard = hadamard ? 1 : 0;
  q.seed = static_cast<uint64_t>(seed);
  throw_if_failed(fa3::quantize_fp8(q, static_cast<cudaStream_t>(current_stream(device))), "quantize_fp8");
  return {out, descale};
}

}  // namespace

STABLE_TORCH_LIBRARY(fa3, m) {
  m.def("fwd(Tensor q, Tensor k, Tensor v, Tensor? cu_seqlens_q=None, Tensor? cu_seqlens_k=None, "
        "Tensor? seqused_q=None, Tensor? seqused_k=None, int max_seqlen_q=0, int max_seqlen_k=0, "
        "Tensor? page_table=None, Tensor? q_descale=None, Tensor? k_descale=None, "
        "Tensor? v_descale=None, float softmax_scale=0.0, bool causal=False, int window_left=-1, "
        "int window_right=-1, float softcap=0.0, int num_splits=1, bool deterministic=False, "
        "Tensor? q_block_descale=None, Tensor? k_block_descale=None, Tensor? v_block_descale=None, "
        "int q_block_size=0, int kv_block_size=0, Tensor? sinks=None, int sm_margin=0) "
        "-> (Tensor out, Tensor softmax_lse)");
  m.def("bwd(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor softmax_lse, "
        "Tensor? cu_seqlens_q=None, Tensor? cu_seqlens_k=None, Tensor? seqused_q=None, "
        "Tensor? seqused_k=None, int max_seqlen_q=0, int max_seqlen_k=0, float softmax_scale=0.0, "
        "bool causal=False, int window_left=-1, int window_right=-1, float softcap=0.0, "
        "bool deterministic=False, Tensor? sinks=None, Tensor? dlse=None) "
        "-> (Tensor dq, Tensor dk, Tensor dv, Tensor dsinks)");
  m.def("fwd_kvcache(Tensor q, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor? k_new=None, Tensor? v_new=None, "
        "Tensor? cache_seqlens=None, Tensor? rotary_cos=None, Tensor? rotary_sin=None, bool rotary_interleaved=True, "
        "Tensor? page_table=None, int max_seqlen_k=0, float softmax_scale=0.0, bool causal=False, "
        "int window_left=-1, int window_right=-1, float softcap=0.0, int num_splits=0, Tensor? sinks=None, "
        "Tensor? cu_seqlens_q=None, int max_seqlen_q=0, Tensor? cu_seqlens_k_new=None, "
        "Tensor? cache_leftpad=None, Tensor? rotary_seqlens=None, int sm_margin=0) "
        "-> (Tensor out, Tensor softmax_lse)");
  m.def("combine(Tensor out_partial, Tensor lse_partial, int out_dtype) -> (Tensor out, Tensor lse)");
  m.def("quantize_fp8(Tensor x, int block_size=128, bool hadamard=False, int seed=0) "
        "-> (Tensor out, Tensor descale)");
}

STABLE_TORCH_LIBRARY_IMPL(fa3, CUDA, m) {
  m.impl("fwd", TORCH_BOX(&fwd));
  m.impl("bwd", TORCH_BOX(&bwd));
  m.impl("fwd_kvcache", TORCH_BOX(&fwd_kvcache));
  m.impl("combine", TORCH_BOX(&combine));
  m.impl("quantize_fp8", TORCH_BOX(&quantize_fp8));
}
