// What the forward kernel reads: built once per call on the host, passed as a __grid_constant__.
#pragma once
#include <cuda.h>

#include <cstdint>

namespace fa3::attn {

struct FwdKernelParams {
  CUtensorMap tma_q, tma_k, tma_v, tma_o;  // 4-D maps [batch][heads][seqlen][head_dim], 128B swizzle

  void* o;  // for rows written without TMA (tiles with no visible key): element strides below
  int64_t o_batch_stride, o_row_stride, o_head_stride;
  float* lse;  // optional, [batch][heads_q][seqlen_q]

  int batch, heads_q, head_ratio;  // head_ratio = heads_q / heads_kv (GQA: kv head = head / ratio)
  int seqlen_q, seqlen_k, head_dim;
  float scale_log2;                // softmax scale * log2(e): scores go straight into exp2
  int window_left, window_right;   // -1 = unbounded; causal is window_right = 0
  int num_m_blocks, num_tiles;
  // No mask, or no left window edge and seqlen_q <= seqlen_k: every query row sees key 0 (causal is
  // bottom-right aligned), so the mask may hide scores with a finite value (mask.cuh).
  bool every_row_sees_a_key;
  int pair_rounds;                 // masked problems: rounds of pairs before the tail (tile_scheduler.cuh)
  bool lpt_order;                  // masked problems: the paired + longest-first order (tile_scheduler.cuh)
};

}  // namespace fa3::attn
