// Host side of one backward instantiation: workspace carve-up, tensor maps, the three launches
// (preprocess, main kernel, postprocess) on the caller's stream, and with dsinks a fourth (sink_grad.h).
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "src/attention/bshd_map.h"
#include "src/attention/bwd_kernel.cuh"
#include "src/attention/bwd_launch.h"
#include "src/attention/bwd_prepost.cuh"
#include "src/attention/sink_grad.h"
#include "src/hopper/launch.h"

namespace fa3::attn {

template <int kDtype>
using BwdElemOf = std::conditional_t<kDtype == FA3_DTYPE_BF16, __nv_bfloat16, __half>;

template <int kDtype, class Cfg, class Feat>
Status launch_bwd(const fa3_bwd_params& b, const detail::FwdProblem& f, cudaStream_t stream) {
  using Elem = BwdElemOf<kDtype>;
  const fa3_fwd_params& a = b.fwd;
  const auto dtype = kDtype == FA3_DTYPE_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  const BwdWorkspace ws = bwd_workspace_layout(a, Cfg::kBlockM, Cfg::kHeadDim);  // its size: checked by the API
  uint8_t* w = static_cast<uint8_t*>(b.workspace);
  float* lse2 = reinterpret_cast<float*>(w + ws.lse2);
  float* delta = reinterpret_cast<float*>(w + ws.delta);
  float* dq_accum = reinterpret_cast<float*>(w + ws.dq_accum);
  int* sem = reinterpret_cast<int*>(w + ws.dq_semaphore);
  const int m_blocks = ws.seqlen_q_rounded / Cfg::kBlockM;

  BwdPrepostParams pp{};
  pp.o = a.out;
  pp.dout = b.dout;
  pp.dq = b.dq;
  pp.lse = a.lse;
  pp.lse2 = lse2;
  pp.delta = delta;
  pp.dq_accum = dq_accum;
  pp.dq_semaphore = sem;
  pp.heads_q = a.heads_q;
  pp.seqlen_q = a.seqlen_q;
  pp.seqlen_q_rounded = ws.seqlen_q_rounded;
  pp.head_dim_qk = a.head_dim_qk;
  pp.head_dim_v = a.head_dim_v;
  pp.head_dim_padded = Cfg::kHeadDim;
  pp.dq_accum_transposed = Cfg::kQueryRows;
  pp.scale = f.q_negated ? -f.scale : f.scale;  // (the postprocess's dQ factor)
  pp.cu_seqlens_q = a.cu_seqlens_q;
  pp.seqused_q = a.seqused_q;
  pp.total_q = a.total_q;
  pp.ws_rows = ws.rows;
  pp.dlse = b.dlse;
  if (ws.seqlen_q_rounded > 0) {
    FA3_TRY((hopper::launch<bwd_preprocess_kernel<Elem, Cfg::kBlockM>>(dim3(m_blocks, a.heads_q, a.batch),
                                                                        kPrepostThreads, 0, stream, pp)));
  }
  if (b.dsinks != nullptr)  // from the LSE2 and D just written (sink_grad.h)
    FA3_TRY(launch_sink_grad(sink_grad_params(b, lse2, 1.f, delta, &ws.rows), stream));

  BwdKernelParams p{};
  FwdKernelParams& g = p.fwd;
  const int dqk = a.head_dim_qk, dv = a.head_dim_v;
  const MapExtents e = map_extents(a, Feat::kVarlen);
  FA3_TRY(make_bshd_map(&g.tma_q, "q", dtype, a.q, dqk, e.q_rows, a.heads_q, e.q_batch, Cfg::kBlockM));
  FA3_TRY(make_bshd_map(&g.tma_k, "k", dtype, a.k, dqk, e.k_rows, a.heads_kv, e.k_batch, Cfg::kBlockN));
  FA3_TRY(make_bshd_map(&g.tma_v, "v", dtype, a.v, dv, e.k_rows, a.heads_kv, e.k_batch, Cfg::kBlockN));
  FA3_TRY(make_bshd_map(&p.tma_do, "dout", dtype, b.dout, dv, e.q_rows, a.heads_q, e.q_batch, Cfg::kBlockM));
  set_problem_params(g, f, Feat::kSoftcap);
  g.cu_seqlens_q = a.cu_seqlens_q;
  g.cu_seqlens_k = a.cu_seqlens_k;
  g.seqused_q = a.seqused_q;
  g.seqused_k = a.seqused_k;
  g.total_q = a.total_q;
  p.ws_rows = ws.rows;
  p.dk = b.dk;
  p.dv = b.dv;
  p.lse2 = lse2;
  p.delta = delta;
  p.dq_accum = dq_accum;
  p.dq_semaphore = sem;
  p.seqlen_q_rounded = ws.seqlen_q_rounded;
  p.scale = f.scale;
  p.deterministic = b.deterministic != 0;

  const int n_blocks = (a.seqlen_k + Cfg::kBlockN - 1) / Cfg::kBlockN;
  p.num_n_blocks = n_blocks;
  int sms = 0;
  FA3_TRY(sm_count(&sms));
  // Deterministic dQ order (bwd_params.h): masked problems walk their query blocks from the
  // diagonal, so later key blocks reach a query block first; unmasked ones all start at query
  // block 0 unless rotated, which needs every key block of a (head, sequence) resident at once (one
  // CTA per SM). Varlen: rotated per sequence where it has no more key blocks than query blocks,
  // descending elsewhere (BwdSeqOrder); both launch from the last key block.
  const bool rotate = n_blocks <= sms && (Feat::kVarlen || n_blocks <= m_blocks);
  p.dq_order = f.has_mask() ? kDqOrderDecreasing
               : rotate     ? kDqOrderRotating
               : Feat::kVarlen ? kDqOrderDecreasing : kDqOrderIncreasing;
  if (n_blocks > 0) {
    FA3_TRY((hopper::launch<bwd_kernel<Elem, Cfg, Feat>>(dim3(n_blocks, a.heads_kv, a.batch), BwdLaunchShape::kThreads,
                                                        BwdSmem<Cfg>::kBytes, stream, p)));
  }
  // The postprocess takes the accumulator's 64-row blocks (d64's 128-query steps add two).
  static_assert(Cfg::kBlockM % kDqAccumBlockM == 0, "whole accumulator blocks per query block");
  if (m_blocks > 0) {
    FA3_TRY((hopper::launch<bwd_postprocess_kernel<Elem>>(dim3(ws.seqlen_q_rounded / kDqAccumBlockM, a.heads_q, a.batch),
                                                          kPrepostThreads, 0, stream, pp)));
  }
  return Status();
}

}  // namespace fa3::attn

// One explicit instantiation per generated file (see CMakeLists.txt).
#define FA3_INSTANTIATE_BWD(DTYPE, MASKED, SOFTCAP, VARLEN, CONFIG, HEAD_DIM)                             \
  template fa3::Status fa3::attn::launch_bwd<DTYPE, fa3::attn::CONFIG<HEAD_DIM>,                        \
                                             fa3::attn::FwdFeatures<MASKED, SOFTCAP, VARLEN>>(              \
      const fa3_bwd_params&, const fa3::detail::FwdProblem&, cudaStream_t);
