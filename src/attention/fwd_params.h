// What the forward kernel reads: built once per call on the host, passed as a __grid_constant__.
#pragma once
#include <cuda.h>

#include <cstdint>

#include "fa3/fa3_c.h"

namespace fa3::attn {

struct FwdKernelParams {
  // 4-D maps [batch][heads][rows][head_dim], 128B swizzle; packed varlen tensors are one batch entry
  // of total_q / total_k rows (seqlen_info.cuh gives each sequence's first row).
  CUtensorMap tma_q, tma_k, tma_v, tma_o;

  void* o;  // for rows written without TMA (zero tiles, varlen): element strides below
  int64_t o_batch_stride, o_row_stride, o_head_stride;
  float* lse;  // optional, [batch][heads_q][seqlen_q] (packed varlen Q: [heads_q][total_q])

  int batch, heads_q, head_ratio;  // head_ratio = heads_q / heads_kv (GQA: kv head = head / ratio)
  int seqlen_q, seqlen_k;          // varlen: the longest sequence (bounds the walk)
  int head_dim_qk, head_dim_v;     // as called; the kernel's (padded) head dims are in its TileConfig
  float scale_log2;                // softmax scale * log2(e) (softcap: softcap * log2(e)): scores go straight into exp2
  float softcap_scale;             // softcap: scores s -> tanh(s * softcap_scale), = softmax scale / softcap
  int window_left, window_right;   // -1 = unbounded; causal is window_right = 0
  int num_m_blocks, num_tiles;     // varlen: of the longest sequence, and an upper bound
  // No mask, or no left window edge and seqlen_q <= seqlen_k: every query row sees key 0 (causal is
  // bottom-right aligned), so the mask may hide scores with a finite value (mask.cuh). Varlen
  // kernels decide it per sequence (seqlen_info.cuh).
  bool every_row_sees_a_key;
  int pair_rounds;                 // masked problems: rounds of pairs before the tail (tile_scheduler.cuh)
  bool lpt_order;                  // masked problems: the paired + longest-first order (tile_scheduler.cuh)

  // Variable-length batches (FwdFeatures::kVarlen): the API's arrays, any of them null.
  const int* cu_seqlens_q;
  const int* cu_seqlens_k;
  const int* seqused_q;
  const int* seqused_k;
  int total_q;                     // rows of packed Q/O (LSE's row count then)

  // Paged KV (page_table set; kept last so that the other parameters' offsets stay put): the K/V
  // maps are [num_pages][page_size] rows with boxes of page_box_rows = gcd(kBlockN, page_size)
  // rows, so a key block is kBlockN / page_box_rows boxes, none straddling a page.
  const int* page_table;           // [batch][page_table_batch_stride] page indices
  int64_t page_table_batch_stride;
  int page_size, page_box_rows;

  // The decode path (FwdFeatures::kSplit): key splits, pack-GQA and the partial results it writes
  // for the combine kernel. Partial rows are the sequences' query rows: packed Q's rows (total_q),
  // else batch * seqlen_q.
  int num_splits;
  int pack_group;         // query heads per tile: head_ratio when packed, else 1 (tile_rows.cuh)
  int pack_queries_log2;  // log2 of the queries per tile, kBlockM / pack_group
  int partial_rows;
  float* o_partial;       // [num_splits][heads_q][partial_rows][head_dim_v]
  float* lse_partial;     // [num_splits][heads_q][partial_rows], natural log; -inf: no visible key

  // FP8 (e4m3 operands): the API's descales, float32 [batch][heads_kv] with these strides, or null
  // (1). Q's and K's join the softmax scale of each (batch, kv head), V's the final 1/sum
  // (descale.cuh).
  const float* q_descale;
  const float* k_descale;
  const float* v_descale;
  int64_t descale_batch_stride, descale_head_stride;
  // And the API's block descales (fa3_block_scales; data null: none): Q's by query head and
  // position (the row's softmax constant), K's and V's by kv head and key block (the block's
  // softmax constant; O's unit between key blocks): descale.cuh.
  fa3_block_scales q_block, k_block, v_block;

  // Learnable attention sinks (fa3_fwd_params.sinks): float32 [heads_q] or null; joined once per
  // row after its last key block (sink.cuh), by the combine kernel when a decode is split.
  const float* sinks;

  // Paged caches whose pages are not a multiple of 16 rows: K/V rows gathered by
  // cp.async from the cache itself (kv_gather.cuh), not through the tensor maps; element pointers
  // and strides as the API's (a page is a batch entry). Kept last, so that the fields above keep
  // their offsets in every kernel.
  bool page_gather;
  const void* k_pages;
  const void* v_pages;
  int64_t k_page_stride, k_row_stride, k_head_stride;
  int64_t v_page_stride, v_row_stride, v_head_stride;
};

}  // namespace fa3::attn
