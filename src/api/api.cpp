// The public calls: validate, check the device, pick an implementation, launch.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <cstring>
#include <initializer_list>
#include <string>

#include "src/api/bindings.h"
#include "src/api/dispatch.h"
#include "src/api/problem.h"
#include "src/api/status.h"
#include "src/api/validate.h"
#include "src/attention/append_kv.h"
#include "src/attention/combine.h"
#include "src/fp8/quantize_fp8.h"

namespace fa3 {
namespace detail {
namespace {

// The device this thread's last call ran on (check_device), -1 before its first call.
int& checked_device() {
  thread_local int device = -1;
  return device;
}

// fa3 is built for sm_90a only: any other device would fail at launch with a less helpful message.
Status check_device() {
  int dev = 0;
  FA3_CUDA_TRY(cudaGetDevice(&dev));
  // Once per thread and device (a device's compute capability never changes): the Hopper check,
  // and cudaSetDevice, because a host thread that has made no CUDA runtime call has no current
  // context and the driver's cuTensorMapEncodeTiled then fails (CUDA_ERROR_INVALID_CONTEXT). The
  // context stays current until the thread picks another device, which makes that one's current.
  if (checked_device() == dev) return ok();
  int major = 0, minor = 0;
  FA3_CUDA_TRY(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
  FA3_CUDA_TRY(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
  if (major != 9 || minor != 0)
    return not_supported("fa3 runs on Hopper GPUs (compute capability 9.0); the current device " + std::to_string(dev) +
                         " is " + std::to_string(major) + "." + std::to_string(minor));
  FA3_CUDA_TRY(cudaSetDevice(dev));
  checked_device() = dev;
  return ok();
}

// A host pointer passed as a device tensor would fault inside the kernel: say so up front. Each
// thread remembers the last pointers it found in device memory (a call mostly repeats the previous
// call's tensors; cudaPointerGetAttributes was ~0.3 us per pointer of the host path): CUDA keeps
// its device address ranges reserved, so such an address does not become host memory later. The
// memory is searched whole (a slot per address bit pattern made allocations aligned alike — CUDA's
// and PyTorch's are at 512 B to 2 MB boundaries — evict each other at every call). The pointers are
// those of one device (the thread's current one): a kernel cannot read another GPU's memory without
// peer access, so memory of another device is refused, and a change of device empties the cache.
struct KnownPointers {
  static constexpr int kSize = 32;
  const void* ptr[kSize] = {};
  int next = 0;
  int device = -1;
};
KnownPointers& known_pointers() {
  thread_local KnownPointers known;
  return known;
}

// After check_device(): the current device is checked_device().
Status check_device_pointer(const void* ptr, const char* name) {
  if (ptr == nullptr) return ok();
  KnownPointers& known = known_pointers();
  if (known.device != checked_device()) known = KnownPointers{{}, 0, checked_device()};
  for (const void* k : known.ptr)
    if (k == ptr) return ok();
  cudaPointerAttributes attr{};
  FA3_CUDA_TRY(cudaPointerGetAttributes(&attr, ptr));
  if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged)
    return invalid(std::string(name) + " must point to device memory (got a host or unregistered pointer)");
  if (attr.type == cudaMemoryTypeDevice && attr.device != known.device)
    return invalid(std::string(name) + " points to memory of device " + std::to_string(attr.device) +
                   ", but the current device is " + std::to_string(known.device) +
                   " (fa3 runs on the current device: cudaSetDevice first)");
  known.ptr[known.next] = ptr;
  known.next = (known.next + 1) % KnownPointers::kSize;
  return ok();
}

Status check_fwd_pointers(const fa3_fwd_params& p) {
  const std::pair<const void*, const char*> ptrs[] = {
      {p.q.data, "q.data"},         {p.k.data, "k.data"},           {p.v.data, "v.data"},
      {p.out.data, "out.data"},     {p.lse, "lse"},                 {p.cu_seqlens_q, "cu_seqlens_q"},
      {p.cu_seqlens_k, "cu_seqlens_k"}, {p.seqused_q, "seqused_q"}, {p.seqused_k, "seqused_k"},
      {p.page_table, "page_table"}, {p.q_descale, "q_descale"},     {p.k_descale, "k_descale"},
      {p.v_descale, "v_descale"},   {p.workspace, "workspace"},
      {p.q_block_descale.data, "q_block_descale.data"}, {p.k_block_descale.data, "k_block_descale.data"},
      {p.v_block_descale.data, "v_block_descale.data"}, {p.sinks, "sinks"},
      {p.cache_seqlens, "cache_seqlens"}, {p.k_new.data, "k_new.data"}, {p.v_new.data, "v_new.data"},
      {p.rotary_cos, "rotary_cos"}, {p.rotary_sin, "rotary_sin"}, {p.cu_seqlens_new, "cu_seqlens_new"},
      {p.leftpad_k, "leftpad_k"},   {p.rotary_seqlens, "rotary_seqlens"}};
  for (const auto& [ptr, name] : ptrs) FA3_TRY(check_device_pointer(ptr, name));
  return ok();
}

// What the append's share of the workspace holds (append_kv.h), for messages: the key counts (new
// keys, left padding) and / or Q's copy (rotary, a negative scale), one of which every append has.
std::string append_share_holds(const attn::AppendWorkspace& w) {
  std::string what = w.counts ? "the key counts" : "";
  if (w.copies_q())
    what += std::string(w.counts ? " and " : "") + "q's copy" + (w.rotate_q ? " (rotated)" : "") +
            (w.negate_q ? " (negated: a negative softmax_scale)" : "");
  return what;
}

// The workspace a validated call needs: the append's share, then the decode path's (split-KV partials).
Status fwd_workspace_bytes(const fa3_fwd_params& p, size_t* bytes) {
  const attn::AppendWorkspace w = attn::append_workspace(p);
  const fa3_fwd_params a = attn::attention_params(p, w);
  *bytes = 0;
  FA3_TRY(hopper_fwd_workspace_bytes(make_problem(a), bytes));
  *bytes += w.bytes;
  return ok();
}

// check_pointers = false: the caller vouches that every pointer is device memory (bindings.h).
// A KV-cache append runs first (append_kv.h); the attention then reads the parameters it leaves.
Status forward_impl(const fa3_fwd_params* p, cudaStream_t stream, bool check_pointers = true) {
  FA3_TRY(validate_fwd(p));
  FA3_TRY(check_device());
  if (check_pointers) FA3_TRY(check_fwd_pointers(*p));
  const attn::AppendWorkspace w = attn::append_workspace(*p);
  if (attn::has_append(*p)) {
    if (p->workspace_bytes < w.bytes)
      return invalid("workspace_bytes must be at least fa3_fwd_workspace_size() for the work before the attention (" +
                     std::to_string(w.bytes) + " bytes for " + append_share_holds(w) + "); got " +
                     std::to_string(p->workspace_bytes));
    // Explicit splits need their partials beside the append's share: checked before the append
    // writes the cache, so that a call that fails leaves the cache as it was (automatic splits take
    // what the rest holds).
    if (p->num_splits > 1) {
      size_t need = 0;
      FA3_TRY(fwd_workspace_bytes(*p, &need));
      if (p->workspace_bytes < need)
        return invalid("workspace_bytes must be at least fa3_fwd_workspace_size() = " + std::to_string(need) +
                       " for the KV-cache append and num_splits " + std::to_string(p->num_splits) + "; got " +
                       std::to_string(p->workspace_bytes));
    }
    FA3_TRY(attn::launch_append(*p, w, stream));
  }
  const fa3_fwd_params a = attn::attention_params(*p, w);
  const FwdProblem f = make_problem(a);
  if (hopper_fwd_unsupported_reason(f) == nullptr) return hopper_fwd(f, stream);
  return oracle_fwd(f, stream);
}

Status kernel_name_impl(const fa3_fwd_params* p, const char** name) {
  if (name == nullptr) return invalid("name must not be NULL");
  FA3_TRY(validate_fwd(p));
  const fa3_fwd_params a = attn::attention_params(*p, attn::append_workspace(*p));
  *name = hopper_fwd_unsupported_reason(make_problem(a)) == nullptr ? "hopper" : "reference-gpu";
  return ok();
}

// The public query: validation, then fwd_workspace_bytes.
Status fwd_workspace_impl(const fa3_fwd_params* p, size_t* bytes) {
  if (bytes == nullptr) return invalid("bytes must not be NULL");
  FA3_TRY(validate_fwd(p));
  return fwd_workspace_bytes(*p, bytes);
}

Status quantize_impl(const fa3_quantize_params* p, cudaStream_t stream) {
  FA3_TRY(validate_quantize(p));
  FA3_TRY(check_device());
  const std::pair<const void*, const char*> ptrs[] = {
      {p->in.data, "in.data"}, {p->out.data, "out.data"}, {p->descale, "descale"}, {p->cu_seqlens, "cu_seqlens"}};
  for (const auto& [ptr, name] : ptrs) FA3_TRY(check_device_pointer(ptr, name));
  return fp8::launch_quantize(*p, stream);
}

bool bwd_on_hopper(const FwdProblem& f) { return hopper_bwd_unsupported_reason(f) == nullptr; }

// A validated backward as the Hopper kernels run it. A negative softmax scale runs as |scale| on a
// negated copy of Q, first in the workspace (append_kv.h: the step the forward takes before its
// attention, launched here too); the backward's own scratch follows, and dQ takes its sign back
// (FwdProblem::q_negated).
// Otherwise the call as it is. The reference kernels take the call as it is either way.
struct BwdPlan {
  fa3_fwd_params before;     // the forward's parameters with the backward's workspace (the copy's input)
  attn::AppendWorkspace w;   // the copy's share (w.bytes = 0 without one)
  fa3_bwd_params b;          // what the kernels read: b.fwd after the copy, b.workspace past its share
};
BwdPlan bwd_plan(const fa3_bwd_params& p) {
  BwdPlan plan{p.fwd, {}, p};
  plan.before.workspace = p.workspace;
  plan.before.workspace_bytes = p.workspace_bytes;
  // (validated: no new keys, rotary or left padding, so the copy is the only work before it)
  plan.w = attn::append_workspace(plan.before);
  if (plan.w.bytes == 0) return plan;
  plan.b.fwd = attn::attention_params(plan.before, plan.w);
  plan.b.workspace = plan.b.fwd.workspace;
  plan.b.workspace_bytes = plan.b.fwd.workspace_bytes;
  return plan;
}
FwdProblem bwd_problem(const BwdPlan& plan) {
  FwdProblem f = make_problem(plan.b.fwd);
  f.q_negated = plan.w.negate_q;
  return f;
}

size_t bwd_workspace_bytes(const BwdPlan& plan) {
  const FwdProblem f = bwd_problem(plan);
  return bwd_on_hopper(f) ? plan.w.bytes + hopper_bwd_workspace_bytes(f)
                          : oracle_bwd_workspace_bytes(make_problem(plan.before));
}

Status backward_impl(const fa3_bwd_params* p, cudaStream_t stream, bool check_pointers = true) {
  FA3_TRY(validate_bwd(p));
  FA3_TRY(check_device());
  if (check_pointers) {
    FA3_TRY(check_fwd_pointers(p->fwd));
    const std::pair<const void*, const char*> ptrs[] = {{p->dout.data, "dout.data"}, {p->dq.data, "dq.data"},
                                                        {p->dk.data, "dk.data"},     {p->dv.data, "dv.data"},
                                                        {p->workspace, "workspace"},
                                                        {p->dsinks, "dsinks"},       {p->dlse, "dlse"}};
    for (const auto& [ptr, name] : ptrs) FA3_TRY(check_device_pointer(ptr, name));
  }
  const BwdPlan plan = bwd_plan(*p);
  const FwdProblem f = bwd_problem(plan);
  const size_t need = bwd_workspace_bytes(plan);
  if (p->workspace_bytes < need)
    return invalid("workspace_bytes must be at least fa3_bwd_workspace_size() = " + std::to_string(need) + "; got " +
                   std::to_string(p->workspace_bytes));
  if (!bwd_on_hopper(f)) return oracle_bwd(*p, make_problem(p->fwd), stream);
  if (plan.w.bytes > 0) FA3_TRY(attn::launch_append(plan.before, plan.w, stream));
  return hopper_bwd(plan.b, f, stream);
}

Status bwd_workspace_impl(const fa3_bwd_params* p, size_t* bytes) {
  if (bytes == nullptr) return invalid("bytes must not be NULL");
  FA3_TRY(validate_bwd(p));
  *bytes = bwd_workspace_bytes(bwd_plan(*p));
  return ok();
}

Status bwd_kernel_name_impl(const fa3_bwd_params* p, const char** name) {
  if (name == nullptr) return invalid("name must not be NULL");
  FA3_TRY(validate_bwd(p));
  *name = bwd_on_hopper(bwd_problem(bwd_plan(*p))) ? "hopper" : "reference-gpu";
  return ok();
}

Status combine_impl(const fa3_combine_params* p, cudaStream_t stream, bool check_pointers = true) {
  FA3_TRY(validate_combine(p));
  FA3_TRY(check_device());
  const std::pair<const void*, const char*> ptrs[] = {{p->out_partial, "out_partial"}, {p->lse_partial, "lse_partial"},
                                                      {p->out.data, "out.data"},       {p->lse, "lse"},
                                                      {p->cu_seqlens, "cu_seqlens"},   {p->seqused, "seqused"},
                                                      {p->sinks, "sinks"}};
  if (check_pointers)
    for (const auto& [ptr, name] : ptrs) FA3_TRY(check_device_pointer(ptr, name));
  return attn::launch_combine(*p, stream);
}

fa3_status remember(const Status& st) {
  set_last_error(st);
  return st.code();
}

}  // namespace

Status forward_device_tensors(const FwdArgs& args, cudaStream_t stream) {
  return forward_impl(&args, stream, /*check_pointers=*/false);
}
Status backward_device_tensors(const BwdArgs& args, cudaStream_t stream) {
  return backward_impl(&args, stream, /*check_pointers=*/false);
}
Status combine_device_tensors(const CombineArgs& args, cudaStream_t stream) {
  return combine_impl(&args, stream, /*check_pointers=*/false);
}

}  // namespace detail

Status forward(const FwdArgs& args, CUstream_st* stream) { return detail::forward_impl(&args, stream); }
Status validate(const FwdArgs& args) { return detail::validate_fwd(&args); }
Status workspace_size(const FwdArgs& args, size_t* bytes) { return detail::fwd_workspace_impl(&args, bytes); }
Status kernel_name(const FwdArgs& args, const char** name) { return detail::kernel_name_impl(&args, name); }
Status backward(const BwdArgs& args, CUstream_st* stream) { return detail::backward_impl(&args, stream); }
Status kernel_name(const BwdArgs& args, const char** name) { return detail::bwd_kernel_name_impl(&args, name); }
Status validate(const BwdArgs& args) { return detail::validate_bwd(&args); }
Status workspace_size(const BwdArgs& args, size_t* bytes) { return detail::bwd_workspace_impl(&args, bytes); }
Status combine(const CombineArgs& args, CUstream_st* stream) { return detail::combine_impl(&args, stream); }
Status quantize_fp8(const QuantizeArgs& args, CUstream_st* stream) { return detail::quantize_impl(&args, stream); }
Status validate(const QuantizeArgs& args) { return detail::validate_quantize(&args); }
Status validate(const CombineArgs& args) { return detail::validate_combine(&args); }

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case FA3_DTYPE_FP16: return "fp16";
    case FA3_DTYPE_BF16: return "bf16";
    case FA3_DTYPE_E4M3: return "e4m3";
    case FA3_DTYPE_FP32: return "fp32";
  }
  return "unknown";
}

}  // namespace fa3

// ---------------------------------------------------------------- C ABI ----
using fa3::detail::remember;

namespace {
// A caller built against an earlier header passes that header's struct size (fa3_c.h's _V1 / _V2
// sizes): its struct ends before the fields added since, so the call reads a copy with their
// defaults (none of them set).
template <class Params, void (*kInit)(Params*)>
const Params* current_layout(const Params* p, Params& copy, std::initializer_list<size_t> older_sizes) {
  if (p == nullptr) return p;
  for (const size_t size : older_sizes) {
    if (p->struct_size != size) continue;
    kInit(&copy);
    std::memcpy(&copy, p, size);
    copy.struct_size = sizeof(Params);
    return &copy;
  }
  return p;
}
const fa3_fwd_params* current_layout(const fa3_fwd_params* p, fa3_fwd_params& copy) {
  return current_layout<fa3_fwd_params, fa3_fwd_params_init>(
      p, copy,
      {FA3_FWD_PARAMS_SIZE_V1, FA3_FWD_PARAMS_SIZE_V2, FA3_FWD_PARAMS_SIZE_V3, FA3_FWD_PARAMS_SIZE_V4,
       FA3_FWD_PARAMS_SIZE_V5, FA3_FWD_PARAMS_SIZE_V6});
}
const fa3_combine_params* current_layout(const fa3_combine_params* p, fa3_combine_params& copy) {
  return current_layout<fa3_combine_params, fa3_combine_params_init>(p, copy, {FA3_COMBINE_PARAMS_SIZE_V1});
}
}  // namespace

extern "C" {

void fa3_fwd_params_init(fa3_fwd_params* p) {
  if (p == nullptr) return;
  *p = fa3_fwd_params{};
  p->struct_size = sizeof(fa3_fwd_params);
  p->dtype = FA3_DTYPE_BF16;
  p->out_dtype = FA3_DTYPE_BF16;
  p->window_left = -1;
  p->window_right = -1;
}

void fa3_bwd_params_init(fa3_bwd_params* p) {
  if (p == nullptr) return;
  *p = fa3_bwd_params{};
  p->struct_size = sizeof(fa3_bwd_params);
  fa3_fwd_params_init(&p->fwd);
}

fa3_status fa3_fwd_validate(const fa3_fwd_params* p) {
  fa3_fwd_params copy;
  return remember(fa3::detail::validate_fwd(current_layout(p, copy)));
}
fa3_status fa3_fwd_workspace_size(const fa3_fwd_params* p, size_t* bytes) {
  fa3_fwd_params copy;
  return remember(fa3::detail::fwd_workspace_impl(current_layout(p, copy), bytes));
}
fa3_status fa3_forward(const fa3_fwd_params* p, fa3_stream_t stream) {
  fa3_fwd_params copy;
  return remember(fa3::detail::forward_impl(current_layout(p, copy), stream));
}
fa3_status fa3_fwd_kernel_name(const fa3_fwd_params* p, const char** name) {
  fa3_fwd_params copy;
  return remember(fa3::detail::kernel_name_impl(current_layout(p, copy), name));
}
fa3_status fa3_bwd_validate(const fa3_bwd_params* p) { return remember(fa3::detail::validate_bwd(p)); }
fa3_status fa3_bwd_workspace_size(const fa3_bwd_params* p, size_t* bytes) {
  return remember(fa3::detail::bwd_workspace_impl(p, bytes));
}
fa3_status fa3_backward(const fa3_bwd_params* p, fa3_stream_t stream) {
  return remember(fa3::detail::backward_impl(p, stream));
}
fa3_status fa3_bwd_kernel_name(const fa3_bwd_params* p, const char** name) {
  return remember(fa3::detail::bwd_kernel_name_impl(p, name));
}
void fa3_combine_params_init(fa3_combine_params* p) {
  if (p == nullptr) return;
  *p = fa3_combine_params{};
  p->struct_size = sizeof(fa3_combine_params);
  p->out_dtype = FA3_DTYPE_BF16;
}
fa3_status fa3_combine(const fa3_combine_params* p, fa3_stream_t stream) {
  fa3_combine_params copy;
  return remember(fa3::detail::combine_impl(current_layout(p, copy), stream));
}
void fa3_quantize_params_init(fa3_quantize_params* p) {
  if (p == nullptr) return;
  *p = fa3_quantize_params{};
  p->struct_size = sizeof(fa3_quantize_params);
  p->in_dtype = FA3_DTYPE_BF16;
  p->block_size = 128;
}
fa3_status fa3_quantize_fp8(const fa3_quantize_params* p, fa3_stream_t stream) {
  return remember(fa3::detail::quantize_impl(p, stream));
}
size_t fa3_fwd_params_size(void) { return sizeof(fa3_fwd_params); }
size_t fa3_bwd_params_size(void) { return sizeof(fa3_bwd_params); }

}  // extern "C"
