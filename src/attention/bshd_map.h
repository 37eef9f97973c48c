// Host helpers every kernel launch shares: BSHD tensors as 4-D TMA maps, the SM count (the Hopper
// layer's), and the problem's shape, masks and score scales as the kernels read them (FwdKernelParams).
#pragma once
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <string>

#include "fa3/fa3_c.h"
#include "src/api/problem.h"
#include "src/api/status.h"
#include "src/attention/fwd_params.h"
#include "src/hopper/sm_count.h"
#include "src/hopper/tma_map.h"

namespace fa3::attn {

// A [batch][seqlen][heads][d] tensor as a 4-D TMA map; extents of 1 get a harmless stride so that
// the driver's stride checks never see the (irrelevant) stride a caller passed for them.
// A box is box_rows rows of box_heads heads (pack-GQA's Q, tile_rows.cuh), laid out rows fastest,
// and 128 bytes of columns (one swizzle panel: 64 16-bit or 128 one-byte elements).
inline Status make_bshd_map(CUtensorMap* map, const char* name, CUtensorMapDataType dtype, const fa3_tensor& t,
                            int head_dim, int seqlen, int heads, int batch, uint32_t box_rows, uint32_t box_heads = 1,
                            CUtensorMapL2promotion l2_promotion = CU_TENSOR_MAP_L2_PROMOTION_L2_256B) {
  const uint64_t kElem = dtype == CU_TENSOR_MAP_DATA_TYPE_UINT8 ? 1 : 2;
  uint64_t row = uint64_t(t.row_stride) * kElem, head = uint64_t(t.head_stride) * kElem,
           bat = uint64_t(t.batch_stride) * kElem;
  if (seqlen == 1) row = uint64_t(head_dim) * kElem;
  if (heads == 1) head = row * uint64_t(seqlen);
  if (batch == 1) bat = head * uint64_t(heads);
  auto align16 = [](uint64_t x) { return (x + 15) / 16 * 16; };
  hopper::TmaMap4dDesc d{dtype,
                         int(kElem),
                         t.data,
                         {uint64_t(head_dim), uint64_t(seqlen), uint64_t(heads), uint64_t(batch)},
                         {align16(row), align16(head), align16(bat)},
                         {uint32_t(128 / kElem), box_rows, box_heads, 1},
                         l2_promotion};
  const std::string err = hopper::encode_tma_map_4d(map, d);
  if (!err.empty()) return Status(FA3_ERROR_INTERNAL, std::string("TMA map for ") + name + ": " + err);
  return Status();
}

// Row and batch extents of the Q-side (Q, O, dO) and K-side (K, V) maps: packed varlen tensors
// are one batch entry of total rows (each sequence starts at its cu_seqlens row, seqlen_info.cuh).
struct MapExtents {
  int q_rows, q_batch, k_rows, k_batch;
};
inline MapExtents map_extents(const fa3_fwd_params& a, bool varlen) {
  const bool packed_q = varlen && a.cu_seqlens_q != nullptr, packed_k = varlen && a.cu_seqlens_k != nullptr;
  return {packed_q ? a.total_q : a.seqlen_q, packed_q ? 1 : a.batch, packed_k ? a.total_k : a.seqlen_k,
          packed_k ? 1 : a.batch};
}

using hopper::sm_count;

// The CTAs a persistent forward grid may take (one an SM): the SMs less the caller's sm_margin
// (fa3_c.h), at least one.
inline Status persistent_ctas(const fa3_fwd_params& a, int* ctas) {
  FA3_TRY(sm_count(ctas));
  *ctas = *ctas > a.sm_margin ? *ctas - a.sm_margin : 1;
  return Status();
}

// Shape, windows and the exp2 scales: softcap's factor c joins scale_log2 (exp2 of
// c * log2(e) * tanh(scale * s / c), score_mod.cuh), else scale * log2(e).
inline void set_problem_params(FwdKernelParams& p, const detail::FwdProblem& f, bool softcap) {
  const fa3_fwd_params& a = *f.p;
  p.batch = a.batch;
  p.heads_q = a.heads_q;
  p.head_ratio = a.heads_q / a.heads_kv;
  p.seqlen_q = a.seqlen_q;
  p.seqlen_k = a.seqlen_k;
  p.head_dim_qk = a.head_dim_qk;
  p.head_dim_v = a.head_dim_v;
  constexpr float kLog2e = 1.4426950408889634f;
  p.scale_log2 = (softcap ? a.softcap : f.scale) * kLog2e;
  p.softcap_scale = softcap ? f.scale / a.softcap : 0.f;
  p.window_left = f.window_left;
  p.window_right = f.window_right;
}

}  // namespace fa3::attn
