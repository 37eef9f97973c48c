// The reference GPU forward: simple and obviously correct, fp32 throughout, every feature of the
// API (masks, softcap, GQA, varlen, paged KV, fp8 descales and block descales, head_dim_v != head_dim_qk,
// attention sinks).
// One warp per query row: lanes split the head dim, a warp-wide sum gives each score, and the
// online softmax walks the visible keys one at a time.  It is the first path through the API and
// the oracle that large GPU tests compare the Hopper kernel against; it is not fast.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cmath>
#include <string>

#include "src/api/dispatch.h"
#include "src/api/limits.h"
#include "src/attention/sink.cuh"
#include "src/oracle/oracle_common.cuh"

namespace fa3::detail {
namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kMaxDimPerLane = 8;  // head dims up to 256 = 32 lanes x 8

struct OracleArgs {
  fa3_fwd_params a;
  float scale;
  int window_left, window_right;
};

// Element offset of key/value row j of batch b, head hk (contiguous, varlen or paged).
__device__ int64_t kv_offset(const fa3_fwd_params& a, const fa3_tensor& t, const SeqInfo& s, int b, int j, int hk) {
  if (a.page_table) {
    const int page = a.page_table[int64_t(b) * a.page_table_batch_stride + j / a.page_size];
    return int64_t(page) * t.batch_stride + int64_t(j % a.page_size) * t.row_stride + int64_t(hk) * t.head_stride;
  }
  const int64_t batch_off = a.cu_seqlens_k ? 0 : int64_t(b) * t.batch_stride;
  return batch_off + (s.k_row0 + j) * t.row_stride + int64_t(hk) * t.head_stride;
}

template <class T, class TOut>
__global__ void __launch_bounds__(kWarpsPerBlock * 32) oracle_fwd_kernel(const OracleArgs args) {
  const fa3_fwd_params& a = args.a;
  const int lane = threadIdx.x % 32, b = blockIdx.z, h = blockIdx.y;
  const int i = blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
  const SeqInfo s = seq_info(a, b);
  if (i >= s.sq) return;
  const int hk = h / (a.heads_q / a.heads_kv);
  const int dq = a.head_dim_qk, dv = a.head_dim_v;

  const T* q = static_cast<const T*>(a.q.data) + (a.cu_seqlens_q ? 0 : int64_t(b) * a.q.batch_stride) +
               (s.q_row0 + i) * a.q.row_stride + int64_t(h) * a.q.head_stride;
  const float q_scale = a.q_descale ? a.q_descale[b * a.descale_batch_stride + hk * a.descale_head_stride] : 1.f;
  const float k_scale = a.k_descale ? a.k_descale[b * a.descale_batch_stride + hk * a.descale_head_stride] : 1.f;
  const float v_scale = a.v_descale ? a.v_descale[b * a.descale_batch_stride + hk * a.descale_head_stride] : 1.f;
  // FP8 block descales (fa3_block_scales): a factor per block of positions in the sequence.
  auto block_factor = [&](const fa3_block_scales& f, int head, int pos) {
    return f.data ? f.data[b * f.batch_stride + head * f.head_stride + pos / f.block_size] : 1.f;
  };
  const float q_factor = q_scale * block_factor(a.q_block_descale, h, i);
  float qr[kMaxDimPerLane], acc[kMaxDimPerLane];
#pragma unroll
  for (int c = 0; c < kMaxDimPerLane; ++c) {
    const int d = lane + 32 * c;
    qr[c] = d < dq ? load_f(q + d) * q_factor : 0.f;
    acc[c] = 0.f;
  }

  // Visible keys of row i (bottom-right aligned masks).
  const int offset = s.sk - s.sq;
  int j_lo = 0, j_hi = s.sk - 1;
  if (args.window_left >= 0) j_lo = max(j_lo, i + offset - args.window_left);
  if (args.window_right >= 0) j_hi = min(j_hi, i + offset + args.window_right);

  float m = -INFINITY, l = 0.f;
  for (int j = j_lo; j <= j_hi; ++j) {
    const T* k = static_cast<const T*>(a.k.data) + kv_offset(a, a.k, s, b, j, hk);
    float part = 0.f;
#pragma unroll
    for (int c = 0; c < kMaxDimPerLane; ++c) {
      const int d = lane + 32 * c;
      if (d < dq) part += qr[c] * load_f(k + d);
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) part += __shfl_xor_sync(0xffffffff, part, off);
    float score = part * (k_scale * block_factor(a.k_block_descale, hk, j)) * args.scale;
    if (a.softcap > 0.f) score = a.softcap * tanhf(score / a.softcap);
    const float m_new = fmaxf(m, score);
    const float corr = expf(m - m_new), pj = expf(score - m_new);
    l = l * corr + pj;
    m = m_new;
    const T* v = static_cast<const T*>(a.v.data) + kv_offset(a, a.v, s, b, j, hk);
    const float pv = pj * block_factor(a.v_block_descale, hk, j);
#pragma unroll
    for (int c = 0; c < kMaxDimPerLane; ++c) {
      const int d = lane + 32 * c;
      acc[c] = acc[c] * corr + (d < dv ? pv * load_f(v + d) : 0.f);
    }
  }

  float inv = l > 0.f ? v_scale / l : 0.f;
  float lse = l > 0.f ? m + logf(l) : -INFINITY;
  if (a.sinks != nullptr) attn::join_sink(a.sinks[h], inv, lse);
  TOut* o = static_cast<TOut*>(a.out.data) + (a.cu_seqlens_q ? 0 : int64_t(b) * a.out.batch_stride) +
            (s.q_row0 + i) * a.out.row_stride + int64_t(h) * a.out.head_stride;
#pragma unroll
  for (int c = 0; c < kMaxDimPerLane; ++c) {
    const int d = lane + 32 * c;
    if (d < dv) o[d] = from_f32<TOut>(acc[c] * inv);
  }
  if (a.lse && lane == 0) {
    if (a.cu_seqlens_q) a.lse[int64_t(h) * a.total_q + s.q_row0 + i] = lse;  // [heads, total_q]
    else a.lse[(int64_t(b) * a.heads_q + h) * a.seqlen_q + i] = lse;
  }
}

template <class T, class TOut>
Status launch(const OracleArgs& args, cudaStream_t stream) {
  const dim3 grid((args.a.seqlen_q + kWarpsPerBlock - 1) / kWarpsPerBlock, args.a.heads_q, args.a.batch);
  oracle_fwd_kernel<T, TOut><<<grid, kWarpsPerBlock * 32, 0, stream>>>(args);
  FA3_CUDA_TRY(cudaGetLastError());
  return ok();
}

}  // namespace

Status oracle_fwd(const FwdProblem& f, cudaStream_t stream) {
  // Heads and batch entries are grid dimensions here (the Hopper kernels' grid is one-dimensional).
  if (f.p->heads_q > kMaxGridYz || f.p->batch > kMaxGridYz)
    return invalid("heads_q and batch must be <= " + std::to_string(kMaxGridYz) +
                   " on the reference kernel (kernel_name \"reference-gpu\"); got heads_q " + std::to_string(f.p->heads_q) + ", batch " + std::to_string(f.p->batch));
  const OracleArgs args{*f.p, f.scale, f.window_left, f.window_right};
  switch (f.p->dtype) {
    case FA3_DTYPE_BF16: return launch<__nv_bfloat16, __nv_bfloat16>(args, stream);
    case FA3_DTYPE_FP16: return launch<__half, __half>(args, stream);
    case FA3_DTYPE_E4M3: return launch<__nv_fp8_e4m3, __nv_bfloat16>(args, stream);
    default: return invalid("dtype: unsupported");
  }
}

}  // namespace fa3::detail
