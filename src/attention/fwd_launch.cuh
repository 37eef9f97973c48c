// Host side of one forward instantiation: tensor maps, kernel parameters, grid, launch.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "src/api/limits.h"
#include "src/attention/bshd_map.h"
#include "src/attention/combine.h"
#include "src/attention/fwd_kernel.cuh"
#include "src/attention/fwd_launch.h"
#include "src/attention/split_workspace.h"
#include "src/hopper/launch.h"

namespace fa3::attn {

template <int kDtype>
using ElemOf = std::conditional_t<kDtype == FA3_DTYPE_BF16, __nv_bfloat16,
                                  std::conditional_t<kDtype == FA3_DTYPE_E4M3, __nv_fp8_e4m3, __half>>;
// The TMA element type of the operands and of O (bf16 for e4m3 operands).
constexpr CUtensorMapDataType tma_dtype(int dtype) {
  return dtype == FA3_DTYPE_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
         : dtype == FA3_DTYPE_E4M3 ? CU_TENSOR_MAP_DATA_TYPE_UINT8
                                   : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
}

// Declared in fwd_launch.h; instantiated per generated file for the product's tiles (FwdConfig) and
// by the tuning benchmark for other TileConfigs.
template <int kDtype, class Cfg, class Feat>
Status launch_fwd(const detail::FwdProblem& f, cudaStream_t stream) {
  using Elem = ElemOf<kDtype>;
  const fa3_fwd_params& a = *f.p;
  const auto dtype = tma_dtype(kDtype);
  const auto out_dtype = tma_dtype(kDtype == FA3_DTYPE_E4M3 ? FA3_DTYPE_BF16 : kDtype);
  FwdKernelParams p{};
  const int dqk = a.head_dim_qk, dv = a.head_dim_v;
  const MapExtents e = map_extents(a, Feat::kVarlen);
  // Pack-GQA (the decode kernel): a Q box is the tile's queries of its pack_group heads.
  const int pack = Feat::kSplit ? f.pack_group : 1;
  FA3_TRY(make_bshd_map(&p.tma_q, "q", dtype, a.q, dqk, e.q_rows, a.heads_q, e.q_batch, Cfg::kBlockM / pack, pack));
  // The decode kernel reads each K/V byte once, in boxes whose rows are 128 bytes: with the L2
  // filling 256 bytes per request, its L2 saw 1.25x the K/V sectors and HBM ran at 84-88% of peak;
  // with 128-byte fills K/V read at 1.04-1.07x the speed (perf-log step 76). The other kernels,
  // which read K/V from L2 many times, measured the same with either (the 256 kept).
  const auto kv_promotion = Feat::kSplit ? CU_TENSOR_MAP_L2_PROMOTION_L2_128B : CU_TENSOR_MAP_L2_PROMOTION_L2_256B;
  if (f.paged) {
    // [num_pages][page_size][heads_kv][d], boxes of gcd(kBlockN, page_size) rows (mainloop_load.cuh;
    // read where page sizes are multiples of 16, so that a box is >= 16 rows).
    const int box = std::gcd(Cfg::kBlockN, a.page_size);
    FA3_TRY(make_bshd_map(&p.tma_k, "k", dtype, a.k, dqk, a.page_size, a.heads_kv, a.num_pages, box, 1, kv_promotion));
    FA3_TRY(make_bshd_map(&p.tma_v, "v", dtype, a.v, dv, a.page_size, a.heads_kv, a.num_pages, box, 1, kv_promotion));
    p.page_table = a.page_table;
    p.page_table_batch_stride = a.page_table_batch_stride;
    p.page_size = a.page_size;
    p.page_box_rows = box;
    // Pages that are not a multiple of 16 rows are gathered row by row (kv_gather.cuh); the maps
    // above stay valid (the producer prefetches them) but are not read.
    if (a.page_size % 16 != 0) {
      p.page_gather = true;
      p.k_pages = a.k.data;
      p.v_pages = a.v.data;
      p.k_page_stride = a.k.batch_stride, p.k_row_stride = a.k.row_stride, p.k_head_stride = a.k.head_stride;
      p.v_page_stride = a.v.batch_stride, p.v_row_stride = a.v.row_stride, p.v_head_stride = a.v.head_stride;
    }
  } else {
    FA3_TRY(make_bshd_map(&p.tma_k, "k", dtype, a.k, dqk, e.k_rows, a.heads_kv, e.k_batch, Cfg::kBlockN, 1, kv_promotion));
    FA3_TRY(make_bshd_map(&p.tma_v, "v", dtype, a.v, dv, e.k_rows, a.heads_kv, e.k_batch, Cfg::kBlockN, 1, kv_promotion));
  }
  if constexpr (!Feat::kSplit)  // (the decode kernel writes the workspace; the combine kernel O)
    FA3_TRY(make_bshd_map(&p.tma_o, "out", out_dtype, a.out, dv, e.q_rows, a.heads_q, e.q_batch, 64));
  p.o = a.out.data;
  p.o_batch_stride = a.out.batch_stride;
  p.o_row_stride = a.out.row_stride;
  p.o_head_stride = a.out.head_stride;
  p.lse = a.lse;
  set_problem_params(p, f, Feat::kSoftcap);
  p.num_m_blocks = (a.seqlen_q + Cfg::kBlockM - 1) / Cfg::kBlockM;
  int64_t tiles = int64_t(p.num_m_blocks) * a.heads_q * a.batch;
  SplitWorkspace ws{};
  if constexpr (Feat::kSplit) {
    const int queries = Cfg::kBlockM / pack;
    p.num_splits = f.num_splits;
    p.pack_group = pack;
    p.pack_queries_log2 = 0;
    while ((1 << p.pack_queries_log2) < queries) ++p.pack_queries_log2;
    if (f.num_splits > 1) {  // (one split writes O itself: epilogue.cuh)
      ws = split_workspace(a, f.num_splits);
      if (ws.rows > detail::kMaxIndex32)
        return Status(FA3_ERROR_INVALID_ARGUMENT, "num_splits > 1 needs batch * seqlen_q (or total_q) <= " +
                                                      std::to_string(detail::kMaxIndex32) + "; got " + std::to_string(ws.rows));
      p.partial_rows = static_cast<int>(ws.rows);
      p.o_partial = static_cast<float*>(a.workspace);
      p.lse_partial = p.o_partial + ws.o_elems;
    }
    p.num_m_blocks = (a.seqlen_q + queries - 1) / queries;
    tiles = int64_t(p.num_m_blocks) * (a.heads_q / pack) * f.num_splits * a.batch;
  }
  // The persistent scheduler numbers tiles (and batch x heads) in 32 bits, a grid's stride past the
  // last included; the varlen walk counts up to two slots a tile (tile_scheduler.cuh).
  if (tiles * (Feat::kVarlen ? 2 : 1) > detail::kMaxIndex32)
    return Status(FA3_ERROR_INVALID_ARGUMENT,
                  "batch * heads_q * query blocks" + std::string(Feat::kSplit ? " * num_splits" : "") + " = " +
                      std::to_string(tiles) + " tiles exceed " + std::to_string(detail::kMaxIndex32) +
                      " (batch " + std::to_string(a.batch) + ", heads_q " + std::to_string(a.heads_q) +
                      ", seqlen_q " + std::to_string(a.seqlen_q) + ")");
  p.num_tiles = static_cast<int>(tiles);
  p.lpt_order = Feat::kMasked && !Feat::kVarlen;
  p.every_row_sees_a_key = !Feat::kMasked || (f.window_left < 0 && a.seqlen_q <= a.seqlen_k);
  p.cu_seqlens_q = a.cu_seqlens_q;
  p.cu_seqlens_k = a.cu_seqlens_k;
  p.seqused_q = a.seqused_q;
  p.seqused_k = a.seqused_k;
  p.total_q = a.total_q;
  p.sinks = a.sinks;
  if constexpr (kDtype == FA3_DTYPE_E4M3) {
    p.q_descale = a.q_descale;
    p.k_descale = a.k_descale;
    p.v_descale = a.v_descale;
    p.descale_batch_stride = a.descale_batch_stride;
    p.descale_head_stride = a.descale_head_stride;
    p.q_block = a.q_block_descale;
    p.k_block = a.k_block_descale;
    p.v_block = a.v_block_descale;
  }

  int ctas = 0;
  FA3_TRY(persistent_ctas(a, &ctas));
  const int grid = std::min(p.num_tiles, ctas);
  const int num_bh = a.batch * a.heads_q;
  p.pair_rounds = pair_rounds(num_bh, p.num_m_blocks, grid, pair_slack(num_bh, p.num_m_blocks, grid));
  FA3_TRY((hopper::launch<fwd_kernel<Elem, Cfg, Feat>>(grid, FwdLaunchShape<Cfg>::kThreads, FwdSmem<Cfg>::kBytes,
                                                       stream, p)));
  if constexpr (Feat::kSplit)
    if (f.num_splits > 1) return launch_combine(combine_params(a, ws, p.o_partial, p.lse_partial), stream);
  return Status();
}

}  // namespace fa3::attn

// One explicit instantiation per generated file (see CMakeLists.txt); the tile type comes last, as
// variadic arguments, because it contains commas. FEATURES: masked, softcap, varlen, split (FwdFeatures).
#define FA3_INSTANTIATE_FWD(DTYPE, MASKED, SOFTCAP, VARLEN, SPLIT, ...)                                \
  template fa3::Status                                                                                 \
  fa3::attn::launch_fwd<DTYPE, __VA_ARGS__, fa3::attn::FwdFeatures<MASKED, SOFTCAP, VARLEN, SPLIT>>(    \
      const fa3::detail::FwdProblem&, cudaStream_t);
