// The reference GPU backward: simple and obviously correct, fp32 throughout, every backward feature
// of the API (masks, softcap, GQA/MQA, varlen, head_dim_v != head_dim_qk, strides, the sinks' gradient). It is the
// backward of every problem the Hopper backward does not cover and the oracle its large tests
// compare against; it is not fast. Deterministic by construction: every output element is summed
// by one warp in a fixed order, no atomics.
//  1. dq kernel, one warp per query row: D = dO . O (written to the workspace for step 2), then
//     over the row's visible keys dS = P (dP - D) dscore and dQ = scale * sum dS K.
//  2. dk/dv kernel, one warp per key row: over the query heads of its kv head and their queries
//     that see the key, dV = sum P dO and dK = scale * sum dS Q.
// Lanes split the head dim; a warp-wide sum gives each dot product.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>

#include "src/api/dispatch.h"
#include "src/attention/sink_grad.h"
#include "src/oracle/oracle_common.cuh"

namespace fa3::detail {
namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kMaxDimPerLane = 8;  // head dims up to 256 = 32 lanes x 8

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) x += __shfl_xor_sync(0xffffffff, x, off);
  return x;
}

struct OracleBwdArgs {
  fa3_bwd_params b;
  float scale;
  int window_left, window_right;
  float* delta;  // workspace: D per query row, laid out like LSE
};

// Element offsets of row i (query side: Q, O, dO, dQ) or row j (key side: K, V, dK, dV).
__device__ int64_t q_off(const fa3_fwd_params& a, const fa3_tensor& t, const SeqInfo& s, int b, int i, int h) {
  return (a.cu_seqlens_q ? 0 : int64_t(b) * t.batch_stride) + (s.q_row0 + i) * t.row_stride + int64_t(h) * t.head_stride;
}
__device__ int64_t k_off(const fa3_fwd_params& a, const fa3_tensor& t, const SeqInfo& s, int b, int j, int h) {
  return (a.cu_seqlens_k ? 0 : int64_t(b) * t.batch_stride) + (s.k_row0 + j) * t.row_stride + int64_t(h) * t.head_stride;
}
__device__ int64_t lse_off(const fa3_fwd_params& a, const SeqInfo& s, int b, int h, int i) {
  return a.cu_seqlens_q ? int64_t(h) * a.total_q + s.q_row0 + i : (int64_t(b) * a.heads_q + h) * a.seqlen_q + i;
}

// The score of one pair as the softmax sees it, and d(score)/d(scale * q.k).
__device__ __forceinline__ float score_of(float dot, const OracleBwdArgs& args, float* dscore) {
  const float raw = dot * args.scale, cap = args.b.fwd.softcap;
  if (cap > 0.f) {
    const float t = tanhf(raw / cap);
    *dscore = 1.f - t * t;
    return cap * t;
  }
  *dscore = 1.f;
  return raw;
}

template <class T>
__device__ __forceinline__ void load_row(float (&r)[kMaxDimPerLane], const T* p, int d, int lane) {
#pragma unroll
  for (int c = 0; c < kMaxDimPerLane; ++c) {
    const int x = lane + 32 * c;
    r[c] = x < d ? load_f(p + x) : 0.f;
  }
}

template <class T>
__device__ __forceinline__ float dot_row(const float (&r)[kMaxDimPerLane], const T* p, int d, int lane) {
  float part = 0.f;
#pragma unroll
  for (int c = 0; c < kMaxDimPerLane; ++c) {
    const int x = lane + 32 * c;
    if (x < d) part += r[c] * load_f(p + x);
  }
  return warp_sum(part);
}

template <class T>
__global__ void __launch_bounds__(kWarpsPerBlock * 32) oracle_dq_kernel(const OracleBwdArgs args) {
  const fa3_fwd_params& a = args.b.fwd;
  const int lane = threadIdx.x % 32, b = blockIdx.z, h = blockIdx.y;
  const int i = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  const SeqInfo s = seq_info(a, b);
  if (i >= s.sq) return;
  const int hk = h / (a.heads_q / a.heads_kv), dq = a.head_dim_qk, dv = a.head_dim_v;
  float qr[kMaxDimPerLane], dor[kMaxDimPerLane], acc[kMaxDimPerLane];
  load_row(qr, static_cast<const T*>(a.q.data) + q_off(a, a.q, s, b, i, h), dq, lane);
  load_row(dor, static_cast<const T*>(args.b.dout.data) + q_off(a, args.b.dout, s, b, i, h), dv, lane);
  // D = rowsum(dO * O), less LSE's own gradient where the caller has one (dS = P (dP - D + dLSE)).
  const float delta = dot_row(dor, static_cast<const T*>(a.out.data) + q_off(a, a.out, s, b, i, h), dv, lane) -
                      (args.b.dlse != nullptr ? args.b.dlse[lse_off(a, s, b, h, i)] : 0.f);
  if (lane == 0) args.delta[lse_off(a, s, b, h, i)] = delta;
  const float lse = a.lse[lse_off(a, s, b, h, i)];
#pragma unroll
  for (int c = 0; c < kMaxDimPerLane; ++c) acc[c] = 0.f;

  const int offset = s.sk - s.sq;
  int j_lo = 0, j_hi = s.sk - 1;
  if (args.window_left >= 0) j_lo = max(j_lo, i + offset - args.window_left);
  if (args.window_right >= 0) j_hi = min(j_hi, i + offset + args.window_right);
  if (lse == -INFINITY) j_hi = -1;  // a row without a visible key: dQ = 0
  for (int j = j_lo; j <= j_hi; ++j) {
    const T* k = static_cast<const T*>(a.k.data) + k_off(a, a.k, s, b, j, hk);
    float dscore;
    const float p = expf(score_of(dot_row(qr, k, dq, lane), args, &dscore) - lse);
    const float dp = dot_row(dor, static_cast<const T*>(a.v.data) + k_off(a, a.v, s, b, j, hk), dv, lane);
    const float ds = p * (dp - delta) * dscore;
#pragma unroll
    for (int c = 0; c < kMaxDimPerLane; ++c) {
      const int x = lane + 32 * c;
      if (x < dq) acc[c] += ds * load_f(k + x);
    }
  }
  T* out = static_cast<T*>(args.b.dq.data) + q_off(a, args.b.dq, s, b, i, h);
#pragma unroll
  for (int c = 0; c < kMaxDimPerLane; ++c) {
    const int x = lane + 32 * c;
    if (x < dq) out[x] = from_f32<T>(acc[c] * args.scale);
  }
}

template <class T>
__global__ void __launch_bounds__(kWarpsPerBlock * 32) oracle_dkdv_kernel(const OracleBwdArgs args) {
  const fa3_fwd_params& a = args.b.fwd;
  const int lane = threadIdx.x % 32, b = blockIdx.z, hk = blockIdx.y;
  const int j = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  const SeqInfo s = seq_info(a, b);
  if (j >= s.sk) return;
  const int group = a.heads_q / a.heads_kv, dq = a.head_dim_qk, dv = a.head_dim_v;
  float kr[kMaxDimPerLane], vr[kMaxDimPerLane], dk[kMaxDimPerLane], dvv[kMaxDimPerLane];
  load_row(kr, static_cast<const T*>(a.k.data) + k_off(a, a.k, s, b, j, hk), dq, lane);
  load_row(vr, static_cast<const T*>(a.v.data) + k_off(a, a.v, s, b, j, hk), dv, lane);
#pragma unroll
  for (int c = 0; c < kMaxDimPerLane; ++c) dk[c] = dvv[c] = 0.f;

  // Queries that see key j: i + offset - left <= j <= i + offset + right.
  const int offset = s.sk - s.sq;
  int i_lo = 0, i_hi = s.sq - 1;
  if (args.window_right >= 0) i_lo = max(i_lo, j - offset - args.window_right);
  if (args.window_left >= 0) i_hi = min(i_hi, j - offset + args.window_left);
  for (int h = hk * group; h < (hk + 1) * group; ++h)
    for (int i = i_lo; i <= i_hi; ++i) {
      const float lse = a.lse[lse_off(a, s, b, h, i)];
      if (lse == -INFINITY) continue;
      const T* q = static_cast<const T*>(a.q.data) + q_off(a, a.q, s, b, i, h);
      const T* dout = static_cast<const T*>(args.b.dout.data) + q_off(a, args.b.dout, s, b, i, h);
      float dscore;
      const float p = expf(score_of(dot_row(kr, q, dq, lane), args, &dscore) - lse);
      const float dp = dot_row(vr, dout, dv, lane);
      const float ds = p * (dp - args.delta[lse_off(a, s, b, h, i)]) * dscore;
#pragma unroll
      for (int c = 0; c < kMaxDimPerLane; ++c) {
        const int x = lane + 32 * c;
        if (x < dq) dk[c] += ds * load_f(q + x);
        if (x < dv) dvv[c] += p * load_f(dout + x);
      }
    }
  T* dk_out = static_cast<T*>(args.b.dk.data) + k_off(a, args.b.dk, s, b, j, hk);
  T* dv_out = static_cast<T*>(args.b.dv.data) + k_off(a, args.b.dv, s, b, j, hk);
#pragma unroll
  for (int c = 0; c < kMaxDimPerLane; ++c) {
    const int x = lane + 32 * c;
    if (x < dq) dk_out[x] = from_f32<T>(dk[c] * args.scale);
    if (x < dv) dv_out[x] = from_f32<T>(dvv[c]);
  }
}

template <class T>
Status launch(const OracleBwdArgs& args, cudaStream_t stream) {
  const fa3_fwd_params& a = args.b.fwd;
  const dim3 grid_q((a.seqlen_q + kWarpsPerBlock - 1) / kWarpsPerBlock, a.heads_q, a.batch);
  oracle_dq_kernel<T><<<grid_q, kWarpsPerBlock * 32, 0, stream>>>(args);
  FA3_CUDA_TRY(cudaGetLastError());
  if (args.b.dsinks != nullptr)  // from the LSE and the D the dq kernel wrote (sink_grad.h)
    FA3_TRY(attn::launch_sink_grad(attn::sink_grad_params(args.b, a.lse, 1.4426950408889634f, args.delta, nullptr),
                                   stream));
  const dim3 grid_k((a.seqlen_k + kWarpsPerBlock - 1) / kWarpsPerBlock, a.heads_kv, a.batch);
  oracle_dkdv_kernel<T><<<grid_k, kWarpsPerBlock * 32, 0, stream>>>(args);
  FA3_CUDA_TRY(cudaGetLastError());
  return ok();
}

}  // namespace

size_t oracle_bwd_workspace_bytes(const FwdProblem& f) {
  const fa3_fwd_params& a = *f.p;
  const int64_t rows = a.cu_seqlens_q ? int64_t(a.total_q) : int64_t(a.batch) * a.seqlen_q;
  return size_t(rows) * a.heads_q * sizeof(float);
}

Status oracle_bwd(const fa3_bwd_params& b, const FwdProblem& f, cudaStream_t stream) {
  const OracleBwdArgs args{b, f.scale, f.window_left, f.window_right, static_cast<float*>(b.workspace)};
  switch (b.fwd.dtype) {
    case FA3_DTYPE_BF16: return launch<__nv_bfloat16>(args, stream);
    case FA3_DTYPE_FP16: return launch<__half>(args, stream);
    default: return invalid("dtype: the backward takes fp16 or bf16");
  }
}

}  // namespace fa3::detail
