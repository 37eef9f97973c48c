// The persistent tile schedulers on the CPU: every CTA walks tile_at_step() (fixed lengths) or
// VarlenTileWalk as the kernel's producer does; every tile must come up exactly once, and masked
// (causal) problems must stay balanced under the cost model "a tile costs its key blocks + 1.5"
// (the per-tile overhead seen on the H200).
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "src/attention/block_info.cuh"
#include "src/attention/bwd_prepost.cuh"
#include "src/attention/fwd_config.h"
#include "src/attention/fwd_features.h"
#include "src/attention/fwd_smem.cuh"
#include "src/attention/kv_gather.cuh"
#include "src/hopper/wgmma.cuh"
#include "src/attention/split_plan.h"
#include "src/attention/tile_rows.cuh"
#include "src/attention/tile_scheduler.cuh"
#include "src/attention/v_transpose.cuh"

namespace fa3::attn {
namespace {

struct Walk {
  std::vector<int> visits;  // per tile (bh * M + m)
  std::vector<double> load;  // per CTA
};

Walk walk(int m_blocks, int batch, int heads, int grid, bool lpt, int slack = -1) {
  FwdKernelParams p{};
  p.batch = batch;
  p.heads_q = heads;
  p.num_m_blocks = m_blocks;
  p.num_tiles = m_blocks * heads * batch;
  p.lpt_order = lpt;
  const int num_bh = batch * heads;  // slack < 0: the product's rule
  p.pair_rounds = pair_rounds(num_bh, m_blocks, grid, slack < 0 ? pair_slack(num_bh, m_blocks, grid) : slack);
  Walk r{std::vector<int>(p.num_tiles, 0), std::vector<double>(grid, 0.0)};
  for (int cta = 0; cta < grid; ++cta) {
    WorkTile w;
    for (int step = 0; tile_at_step(step, cta, grid, p, w); ++step) {
      EXPECT_LT(step, 4 * p.num_tiles + 8) << "walk does not end";
      if (step >= 4 * p.num_tiles + 8) break;
      EXPECT_TRUE(w.m_block >= 0 && w.m_block < m_blocks);
      EXPECT_TRUE(w.head >= 0 && w.head < heads && w.batch >= 0 && w.batch < batch);
      ++r.visits[(w.batch * heads + w.head) * m_blocks + w.m_block];
      r.load[cta] += (lpt ? w.m_block + 1 : m_blocks) + 1.5;
    }
  }
  return r;
}

TEST(TileScheduler, EveryTileExactlyOnce) {
  for (int order : {0, 1, 2})  // row-major, pairs + tail with slack 1, with slack 0
    for (int m : {1, 2, 3, 7, 8, 9, 33, 64, 128})
      for (int bh : {1, 2, 3, 5, 16, 40, 131, 256, 512})
        for (int grid : {1, 7, 132}) {
          const Walk r = walk(m, bh % 5 == 0 ? 5 : 1, bh % 5 == 0 ? bh / 5 : bh, grid, order > 0, 2 - order);
          for (size_t t = 0; t < r.visits.size(); ++t)
            ASSERT_EQ(r.visits[t], 1) << "tile " << t << " m_blocks " << m << " bh " << bh << " grid " << grid
                                      << " order " << order;
        }
}

// The FlashAttention sweep (16k tokens, hidden 2048) on 132 SMs, with the 128-row tiles of d128
// (16 heads) and d256 (8 heads: fewer than four rounds of pairs, so a short tail) and d64's 192-row
// tiles (odd tile counts: 3 at 512, 11 at 2k): the busiest CTA does at most 3.5% more than the
// average (the longest-first-only order before: 3% at 512-2k).
TEST(TileScheduler, CausalSweepIsBalanced) {
  for (int d : {64, 128, 256})
    for (int seqlen : {512, 1024, 2048, 4096, 8192, 16384}) {
      const int rows = d == 64 ? 192 : 128;
      const Walk r = walk((seqlen + rows - 1) / rows, 16384 / seqlen, 2048 / d, 132, true);
      const double avg = std::accumulate(r.load.begin(), r.load.end(), 0.0) / r.load.size();
      const double worst = *std::max_element(r.load.begin(), r.load.end());
      EXPECT_GT(avg / worst, 0.965) << "seqlen " << seqlen << " d " << d;
    }
}

// The varlen walk (VarlenTileWalk, run by the producer on the GPU) replayed for every CTA: every
// (sequence, head, m-block) tile of random lengths, zero-length sequences included, comes up exactly
// once, none past a sequence's end, and the walk ends.
struct VarlenCase {
  std::vector<int> cu;  // cu_seqlens_q, batch + 1 entries
  int heads;
};

std::vector<int> varlen_visits(const VarlenCase& c, int grid, int block_m, std::vector<double>* load = nullptr) {
  FwdKernelParams p{};
  p.batch = int(c.cu.size()) - 1;
  p.heads_q = c.heads;
  p.cu_seqlens_q = c.cu.data();
  int longest = 0, tiles = 0;
  std::vector<int> first(p.batch + 1, 0);  // first tile index of each sequence
  for (int b = 0; b < p.batch; ++b) {
    const int len = c.cu[b + 1] - c.cu[b];
    longest = std::max(longest, len);
    first[b] = tiles;
    tiles += (len + block_m - 1) / block_m * c.heads;
  }
  first[p.batch] = tiles;
  p.seqlen_q = std::max(longest, 1);
  p.num_m_blocks = (p.seqlen_q + block_m - 1) / block_m;
  std::vector<int> visits(tiles, 0);
  if (load) load->assign(grid, 0.0);
  for (int cta = 0; cta < grid; ++cta) {
    VarlenTileWalk walk;
    WorkTile w;
    int step = 0;
    // (block_m is a template argument of the walk: the two the kernels use here)
    auto next = [&](int s) {
      return block_m == 128 ? walk.tile<128>(s, cta, grid, p, w) : walk.tile<192>(s, cta, grid, p, w);
    };
    for (VarlenTileWalk::Step st; (st = next(step)) != VarlenTileWalk::kEnd; ++step) {
      EXPECT_LE(step, 2 * tiles + 2) << "walk does not end";
      if (step > 2 * tiles + 2) break;
      if (st == VarlenTileWalk::kSkip) continue;
      const int len = c.cu[w.batch + 1] - c.cu[w.batch];
      EXPECT_TRUE(w.batch >= 0 && w.batch < p.batch && w.head >= 0 && w.head < c.heads);
      EXPECT_LT(w.m_block * block_m, len) << "a tile past its sequence";
      if (w.m_block * block_m >= len) continue;
      ++visits[first[w.batch] + w.m_block * c.heads + w.head];
      if (load) (*load)[cta] += w.m_block + 1 + 1.5;  // causal: blocks up to the diagonal + overhead
    }
  }
  return visits;
}

TEST(TileScheduler, VarlenEveryTileExactlyOnce) {
  std::mt19937 gen(1234);
  for (int trial = 0; trial < 60; ++trial) {
    const int batch = 1 + int(gen() % (trial < 30 ? 8 : 256));
    VarlenCase c{{0}, 1 + int(gen() % 16)};
    for (int b = 0; b < batch; ++b) {
      const int r = int(gen() % 10);
      const int len = r == 0 ? 0 : r == 1 ? 1 + int(gen() % 17) : int(gen() % 5001);  // zero lengths too
      c.cu.push_back(c.cu.back() + len);
    }
    for (int grid : {1, 7, 132})
      for (int block_m : {128, 192}) {
        const std::vector<int> v = varlen_visits(c, grid, block_m);
        for (size_t t = 0; t < v.size(); ++t)
          ASSERT_EQ(v[t], 1) << "tile " << t << " trial " << trial << " grid " << grid << " block_m " << block_m;
      }
  }
}

// The varlen benchmark's shape (16 sequences of 256-4096 tokens, 16 heads, causal, 128-row tiles,
// 132 SMs): the pairs keep the busiest CTA within 12% of the average (the model: key blocks + 1.5;
// 0.89-0.95 of it on these lengths, 0.77-0.87 with the m-blocks of a head in plain order).
TEST(TileScheduler, VarlenCausalIsBalanced) {
  std::mt19937 gen(7);
  for (int trial = 0; trial < 10; ++trial) {
    VarlenCase c{{0}, 16};
    for (int b = 0; b < 16; ++b) c.cu.push_back(c.cu.back() + 256 + int(gen() % 3841));
    std::vector<double> load;
    varlen_visits(c, 132, 128, &load);
    const double avg = std::accumulate(load.begin(), load.end(), 0.0) / load.size();
    const double worst = *std::max_element(load.begin(), load.end());
    EXPECT_GT(avg / worst, 0.88) << "trial " << trial;
  }
}

// The block ranges against brute-force visibility (bottom-right aligned, windows): the forward's
// key blocks per query m-block and the backward's query m-blocks per key block must contain every
// block with a visible (row, key) pair and start and end on such blocks; split-KV's splits must
// partition a range.
struct Visibility {
  int sq, sk, left, right;
  bool sees(int i, int j) const {
    const int off = sk - sq;
    return j >= 0 && j < sk && i >= 0 && i < sq && (left < 0 || j >= i + off - left) && (right < 0 || j <= i + off + right);
  }
  // Random lengths in [min_len, min_len + len_range) and windows: unbounded, 0 (right: causal) or
  // below max_window.
  static Visibility random(std::mt19937& gen, int min_len, int len_range, int max_window) {
    return Visibility{min_len + int(gen() % len_range), min_len + int(gen() % len_range),
                      int(gen() % 4) == 0 ? -1 : int(gen() % max_window),
                      int(gen() % 3) == 0 ? -1 : int(gen() % 3) == 1 ? 0 : int(gen() % max_window)};
  }
  FwdKernelParams params() const {
    FwdKernelParams p{};
    p.seqlen_q = sq;
    p.seqlen_k = sk;
    p.window_left = left;
    p.window_right = right;
    return p;
  }
  bool blocks_see(int m, int n, int bm, int bn) const {
    for (int i = m * bm; i < (m + 1) * bm && i < sq; ++i)
      for (int j = n * bn; j < (n + 1) * bn && j < sk; ++j)
        if (sees(i, j)) return true;
    return false;
  }
};

TEST(BlockRange, ForwardAndBackwardRangesAreTight) {
  constexpr int kM = 64, kN = 64;  // small blocks: many partial ones
  std::mt19937 gen(99);
  for (int trial = 0; trial < 300; ++trial) {
    const Visibility v = Visibility::random(gen, 1, 400, 150);
    const FwdKernelParams p = v.params();
    const SeqlenInfo<false> seq(p, 0);
    const int mb = (v.sq + kM - 1) / kM, nb = (v.sk + kN - 1) / kN;
    for (int m = 0; m < mb; ++m) {
      const BlockRange r = block_range<kM, kN>(m, seq, p);
      for (int n = 0; n < nb; ++n)
        if (v.blocks_see(m, n, kM, kN)) EXPECT_TRUE(n >= r.n_min && n < r.n_max) << "forward misses a block";
      if (!r.empty()) {
        EXPECT_TRUE(v.blocks_see(m, r.n_min, kM, kN) && v.blocks_see(m, r.n_max - 1, kM, kN)) << "forward not tight";
      }
    }
    for (int n = 0; n < nb; ++n) {
      const BlockRange r = query_block_range<kM, kN>(n, seq, p);
      for (int m = 0; m < mb; ++m)
        if (v.blocks_see(m, n, kM, kN))
          EXPECT_TRUE(m >= r.n_min && m < r.n_max) << "backward misses m-block " << m << " of key block " << n;
      if (!r.empty()) {
        EXPECT_TRUE(v.blocks_see(r.n_min, n, kM, kN) && v.blocks_see(r.n_max - 1, n, kM, kN))
            << "backward not tight: key block " << n << " sq " << v.sq << " sk " << v.sk << " window " << v.left
            << "," << v.right;
      }
    }
  }
}

// Deterministic mode orders a query block's dQ adds by counting them on its semaphore
// (bwd_dq_adds_before): the count it waits for comes from block_range (the forward's view), the
// adds from the key blocks whose walks visit the block (query_block_range). Both must name the same
// number of key blocks for every query block, or a writer waits forever (too many) or adds out of
// order (too few). Blocks of d128's tile (64 queries, 128 keys) and d64's (128 x 128).
template <int kM, int kN>
void check_adds_per_query_block(std::mt19937& gen) {
  for (int trial = 0; trial < 300; ++trial) {
    const Visibility v = Visibility::random(gen, 0, 600, 200);
    const FwdKernelParams p = v.params();
    const SeqlenInfo<false> seq(p, 0);
    const int mb = (v.sq + kM - 1) / kM, nb = (v.sk + kN - 1) / kN;
    for (int m = 0; m < mb; ++m) {
      int visits = 0;
      for (int n = 0; n < nb; ++n) {
        const BlockRange q = query_block_range<kM, kN>(n, seq, p);
        visits += m >= q.n_min && m < q.n_max;
      }
      const BlockRange r = block_range<kM, kN>(m, seq, p);
      EXPECT_EQ(visits, r.empty() ? 0 : r.n_max - r.n_min)
          << "m-block " << m << " sq " << v.sq << " sk " << v.sk << " window " << v.left << "," << v.right;
    }
  }
}

TEST(BlockRange, AddsPerQueryBlockMatchTheWalks) {
  std::mt19937 gen(7);
  check_adds_per_query_block<64, 128>(gen);
  check_adds_per_query_block<128, 128>(gen);
}

TEST(BlockRange, SplitsPartitionTheRange) {
  for (int n_min : {0, 3})
    for (int blocks : {0, 1, 5, 16, 17, 130})
      for (int splits : {1, 2, 3, 7, 16, 200}) {
        const BlockRange r{n_min, n_min + blocks};
        int next = n_min, largest = 0, smallest = blocks + 1;
        for (int s = 0; s < splits; ++s) {
          const BlockRange part = split_block_range(r, s, splits);
          ASSERT_EQ(part.n_min, next) << "splits must be contiguous";
          ASSERT_GE(part.n_max, part.n_min);
          next = part.n_max;
          largest = std::max(largest, part.n_max - part.n_min);
          smallest = std::min(smallest, part.n_max - part.n_min);
        }
        EXPECT_EQ(next, r.n_max) << "splits must cover the range";
        EXPECT_LE(largest - smallest, 1) << "splits must be balanced";
      }
}

// The decode kernel's walk: every (m_block, tile head, split, batch) once, over any grid.
TEST(TileScheduler, SplitWalkEveryTileExactlyOnce) {
  for (int grid : {1, 7, 132})
    for (int group : {1, 4, 8}) {
      FwdKernelParams p{};
      p.batch = 3;
      p.heads_q = 16;
      p.pack_group = group;
      p.num_m_blocks = 2;
      p.num_splits = 5;
      p.num_tiles = p.batch * (p.heads_q / group) * p.num_m_blocks * p.num_splits;
      std::vector<int> seen(p.num_tiles, 0);
      for (int cta = 0; cta < grid; ++cta) {
        WorkTile w;
        for (int step = 0; split_tile_at_step(step, cta, grid, p, w); ++step) {
          ASSERT_TRUE(w.m_block < p.num_m_blocks && w.head < p.heads_q / group && w.split < p.num_splits &&
                      w.batch < p.batch);
          ++seen[((w.batch * p.num_splits + w.split) * (p.heads_q / group) + w.head) * p.num_m_blocks + w.m_block];
        }
      }
      for (int v : seen) EXPECT_EQ(v, 1) << "grid " << grid << " group " << group;
    }
}

// Pack-GQA rows: each (query, head) of a tile exactly once, query = m * S + r % S.
TEST(TileRows, PackedRowsCoverQueriesTimesHeads) {
  for (int group : {1, 2, 4, 8, 16, 32, 64}) {
    FwdKernelParams p{};
    p.pack_group = p.head_ratio = group;
    const int queries = 64 / group;
    while ((1 << p.pack_queries_log2) < queries) ++p.pack_queries_log2;
    using Rows = TileRows<64, true>;
    ASSERT_EQ(Rows::queries(p), queries);
    std::vector<int> seen(64, 0);
    for (int r = 0; r < 64; ++r) {
      const int q = Rows::query(p, 3, r), h = Rows::head(p, 5, r);
      ASSERT_TRUE(q >= 3 * queries && q < 4 * queries && h >= 5 * group && h < 6 * group) << group << " " << r;
      ++seen[(q - 3 * queries) * group + (h - 5 * group)];
      EXPECT_EQ(Rows::kv_head(p, 5), 5);
    }
    for (int v : seen) EXPECT_EQ(v, 1);
  }
}

// Automatic splits: none where the tiles fill the SMs, never fewer than four key blocks per split
// nor more than 128 splits, and enough CTAs for most SMs otherwise (one wave where it fits: 8 tiles
// x 16 splits on 132 SMs).
TEST(SplitPlan, AutomaticSplits) {
  EXPECT_EQ(auto_num_splits(512, 32, 132), 1);
  EXPECT_EQ(auto_num_splits(120, 1000, 132), 1);
  EXPECT_EQ(auto_num_splits(8, 1024, 132), 16);
  EXPECT_EQ(auto_num_splits(8, 32, 132), 8);
  EXPECT_EQ(auto_num_splits(64, 256, 132), 2);
  EXPECT_EQ(auto_num_splits(33, 1024, 132), 4);
  for (int64_t tiles : {1, 2, 8, 33, 64, 100})
    for (int blocks : {1, 2, 5, 32, 256, 1024}) {
      const int s = auto_num_splits(tiles, blocks, 132);
      EXPECT_GE(s, 1);
      EXPECT_LE(s, std::max(1, std::min(128, blocks / 4)));
      if (blocks >= 1024) EXPECT_GE(tiles * s, 100) << tiles << " tiles " << blocks << " blocks";
    }
}

// Which problems take the decode kernel and how its tiles pack query heads (split_plan.h): pack-GQA
// where the group divides 64, decodes of <= 128 packed rows or an explicit num_splits > 1, never
// softcap (its num_splits is then no split at all), explicit splits capped at the key blocks.
TEST(SplitPlan, DecodePathAndPacking) {
  fa3_fwd_params a{};
  a.batch = 2;
  a.heads_q = 32;
  a.heads_kv = 8;
  a.seqlen_q = 1;
  a.seqlen_k = 4096;
  EXPECT_EQ(pack_group_for(a), 4);
  a.heads_kv = 32;
  EXPECT_EQ(pack_group_for(a), 1);  // MHA
  a.heads_q = 40, a.heads_kv = 8;
  EXPECT_EQ(pack_group_for(a), 1);  // 5 does not divide 64
  a.heads_q = 32, a.heads_kv = 8;
  EXPECT_TRUE(takes_decode_path(a));
  a.seqlen_q = 32;  // 32 queries x 4 heads = 128 rows
  EXPECT_TRUE(takes_decode_path(a));
  a.seqlen_q = 33;
  EXPECT_FALSE(takes_decode_path(a));
  a.num_splits = 2;
  EXPECT_TRUE(takes_decode_path(a));
  a.softcap = 30.f;
  EXPECT_FALSE(takes_decode_path(a));
  EXPECT_EQ(split_plan(a, 128, 132).num_splits, 0);  // not the decode path: no splits
  a.softcap = 0.f;
  a.dtype = FA3_DTYPE_E4M3;  // e4m3: the decode path with per-head descales, not with block descales
  EXPECT_TRUE(takes_decode_path(a));
  static const float kFactor = 1.f;
  a.k_block_descale.data = &kFactor;
  EXPECT_FALSE(takes_decode_path(a));
  a.k_block_descale.data = nullptr;
  a.dtype = FA3_DTYPE_BF16;
  a.num_splits = 100;
  EXPECT_EQ(split_plan(a, 128, 132).num_splits, 4096 / 128);  // capped at the key blocks
  a.num_splits = 0;
  a.seqlen_q = 1;
  const SplitPlan auto_plan = split_plan(a, 128, 132);  // 2 x 8 tiles of 32 key blocks: splits
  EXPECT_EQ(auto_plan.pack_group, 4);
  EXPECT_EQ(auto_plan.num_splits, auto_num_splits(16, 32, 132));
  EXPECT_GT(auto_plan.num_splits, 1);
}

// The backward's dQ accumulator layout: dq_accum_index places element (row, column) of a query
// block where the consumer staged it (register i of thread t at part * 4096 + i * 128 + t, the
// accumulator's own row/column formula), and every slot of a block is used exactly once.
TEST(BwdLayout, DqAccumIndexMatchesTheAccumulator) {
  for (int d : {64, 128}) {
    std::vector<int> seen(64 * d, 0);
    for (int part = 0; part < d / 64; ++part)
      for (int t = 0; t < 128; ++t)
        for (int i = 0; i < 32; ++i) {
          const int row = 16 * (t / 32) + (t % 32) / 4 + hopper::acc_row(i);
          const int col = 64 * part + hopper::acc_col(i) + 2 * (t % 4);
          const int at = dq_accum_index(row, col);
          ASSERT_EQ(at, part * 4096 + i * 128 + t) << "d " << d << " row " << row << " col " << col;
          ++seen[at];
        }
    for (int x : seen) ASSERT_EQ(x, 1);
  }
}

// The postprocess's 16-byte units: element j of unit u is (row, col + j), read from float j / 2 of
// the even (j even) or odd vector; the units cover every slot of a block once, and units 2i and
// 2i + 1 read the two halves of one 32-byte sector.
TEST(BwdLayout, DqAccumOctetsCoverTheBlock) {
  for (int d : {64, 128, 256}) {
    std::vector<int> seen(64 * d, 0);
    for (int u = 0; u < 64 * d / 8; ++u) {
      const DqAccumOctet o(u, d / 8);
      ASSERT_TRUE(o.row >= 0 && o.row < 64 && o.col >= 0 && o.col < d) << "d " << d << " unit " << u;
      for (int j = 0; j < 8; ++j) {
        const int at = 4 * (j % 2 ? o.odd : o.even) + j / 2;
        ASSERT_EQ(at, dq_accum_index(o.row, o.col + j)) << "d " << d << " unit " << u;
        ++seen[at];
      }
      if (u % 2 == 1) {
        const DqAccumOctet first(u - 1, d / 8);
        EXPECT_EQ(o.even, first.even + 1) << "d " << d << " unit " << u;
        EXPECT_EQ(first.even % 2, 0) << "d " << d << " unit " << u;
      }
    }
    for (int x : seen) ASSERT_EQ(x, 1);
  }
}

// The query-rows tile's dQ^T adds (bwd_mma_query_rows.cuh, add_dq): register i of thread t of part
// p's slice, fragment row = column 64 p + acc_row-based, fragment column = query row, lands at
// dq_accum_index_transposed of that element = p * 4096 + (i / 4) * 512 + 4 t + i % 4; every slot
// is used once; and the postprocess's float4 v holds the four elements DqAccumTransposedVec names.
TEST(BwdLayout, DqAccumTransposedMatchesTheAddsAndThePostprocess) {
  std::vector<int> seen(64 * 256, 0);
  for (int part = 0; part < 4; ++part)
    for (int t = 0; t < 128; ++t)
      for (int i = 0; i < 32; ++i) {
        const int col = 64 * part + 16 * (t / 32) + (t % 32) / 4 + hopper::acc_row(i);
        const int row = hopper::acc_col(i) + 2 * (t % 4);
        const int at = dq_accum_index_transposed(row, col);
        ASSERT_EQ(at, part * 4096 + (i / 4) * 512 + 4 * t + i % 4) << "row " << row << " col " << col;
        ++seen[at];
      }
  for (int x : seen) ASSERT_EQ(x, 1);
  for (int v = 0; v < 1024; ++v) {
    const DqAccumTransposedVec e(v);
    for (int j = 0; j < 4; ++j)
      ASSERT_EQ(dq_accum_index_transposed(e.row + j % 2, e.col + 8 * (j / 2)), 4 * v + j) << "vector " << v;
  }
}

// The FP8 kernel's V transposer on the CPU: its ldmatrix.trans / byte permute / stmatrix moves
// replayed on labelled bytes (key, d) for every work item of every warp. Every (d row, key
// position) of the V^T stage is written exactly once, from the key the P fragments hold there
// (MmaE4m3::key_of_position) and its own d; the addresses equal the tiles' swizzled offsets; each
// matrix's 8 rows (one wavefront) touch 8 distinct 16-byte bank groups, loads and stores.
template <class Cfg>
void check_v_transpose() {
  using T = VTranspose<Cfg>;
  const int rows = Cfg::kHeadDimV, keys = Cfg::kBlockN;
  struct Byte {
    int key, d;
  };
  std::vector<int> written(rows * keys, 0);
  auto phases_distinct = [](const uint32_t (&at)[8]) {
    std::vector<int> g;
    for (uint32_t a : at) g.push_back(int(a / 16 % 8));
    std::sort(g.begin(), g.end());
    return std::unique(g.begin(), g.end()) - g.begin() == 8;
  };
  for (int s = 0; s < T::kItems; ++s) {
    const int g = s / T::kItemsPerGroup, u0 = (s % T::kItemsPerGroup) * T::kItemUnits;
    for (int u = u0; u < u0 + T::kItemUnits; ++u) {
      // ldmatrix.x4.trans: matrix m's row x is the 16 bytes lane 8m + x addresses.
      int row_key[4][8], row_col[4][8];
      for (int m = 0; m < 4; ++m) {
        uint32_t at[8];
        for (int x = 0; x < 8; ++x) {
          const int lane = 8 * m + x;
          row_key[m][x] = 16 * g + T::load_key(lane);
          row_col[m][x] = 32 * u + 16 * (m >> 1);
          at[x] = T::load_offset(lane, g, u);
          ASSERT_EQ(at[x], hopper::swizzled_offset<1>(row_key[m][x], row_col[m][x], keys)) << "g " << g << " u " << u;
        }
        EXPECT_TRUE(phases_distinct(at)) << "load bank conflict, g " << g << " u " << u << " m " << m;
      }
      // Thread i = 4c + t receives of matrix m: rows 2t, 2t + 1 at 16-bit column c (bytes 2c, 2c + 1).
      Byte out[32][4][4];
      for (int i = 0; i < 32; ++i) {
        const int c = i / 4, t = i % 4;
        Byte r[4][4];
        for (int m = 0; m < 4; ++m)
          for (int b = 0; b < 4; ++b) {
            const int x = 2 * t + b / 2;
            r[m][b] = {row_key[m][x], row_col[m][x] + 2 * c + b % 2};
          }
        // __byte_perm(lo, hi, sel): result byte k = byte (sel >> 4k) & 7 of {hi, lo}.
        auto perm = [](const Byte (&lo)[4], const Byte (&hi)[4], uint32_t sel, Byte (&o)[4]) {
          for (int k = 0; k < 4; ++k) {
            const int b = (sel >> (4 * k)) & 7;
            o[k] = b < 4 ? lo[b] : hi[b - 4];
          }
        };
        const uint32_t sel_a = T::even_selector(i), sel_b = sel_a ^ 0x1111u;
        perm(r[0], r[1], sel_a, out[i][0]);
        perm(r[0], r[1], sel_b, out[i][1]);
        perm(r[2], r[3], sel_a, out[i][2]);
        perm(r[2], r[3], sel_b, out[i][3]);
      }
      // stmatrix.x4: matrix m's row x (addressed by lane 8m + x) takes thread 4x + t's word at bytes 4t.
      for (int m = 0; m < 4; ++m) {
        uint32_t at[8];
        for (int x = 0; x < 8; ++x) {
          const int lane = 8 * m + x, d = 32 * u + T::store_d(lane);
          at[x] = T::store_offset(lane, g, u);
          ASSERT_LT(d, rows);
          ASSERT_EQ(at[x], hopper::swizzled_offset<1>(d, 16 * g, rows)) << "g " << g << " u " << u;
          for (int t = 0; t < 4; ++t)
            for (int q = 0; q < 4; ++q) {
              const int pos = 16 * g + 4 * t + q;
              const Byte b = out[4 * x + t][m][q];
              ASSERT_LT(pos, keys);
              ++written[d * keys + pos];
              EXPECT_EQ(b.d, d) << "g " << g << " u " << u << " m " << m << " row " << x;
              EXPECT_EQ(b.key, pos / 32 * 32 + hopper::MmaE4m3::key_of_position(pos % 32))
                  << "g " << g << " u " << u << " m " << m << " row " << x;
            }
        }
        EXPECT_TRUE(phases_distinct(at)) << "store bank conflict, g " << g << " u " << u << " m " << m;
      }
    }
  }
  for (int x : written) ASSERT_EQ(x, 1);
}

// Which rings' stages every consumer thread gives back (StageReleasers, fwd_smem.cuh): where the
// threads read a stage themselves — the K stages' factor slots with block descales, the kept K and
// V stages of the varlen tiles that stage O there (kOInKV) — and nowhere else (thread 0's release
// costs one arrival, the fixed-length tiles' code stays as measured).
TEST(FwdSmem, StageReleasersWhereThreadsReadStages) {
  using Fixed = FwdFeatures<false, false, false, false>;
  using Varlen = FwdFeatures<false, false, true, false>;
  using Decode = FwdFeatures<true, false, true, true>;
  auto k = [](auto cfg, auto feat) { return StageReleasers<decltype(cfg), decltype(feat)>::kK; };
  auto pv = [](auto cfg, auto feat) { return StageReleasers<decltype(cfg), decltype(feat)>::kPv; };
  // O in a tile of its own: thread 0 for both rings.
  EXPECT_EQ(k(FwdConfig<128, false>{}, Varlen{}), 1u);
  EXPECT_EQ(pv(FwdConfig<128, false>{}, Varlen{}), 1u);
  EXPECT_EQ(k(FwdSplitConfig<256>{}, Decode{}), 1u);
  // O in the kept K/V stages (d192, d256, e4m3 d256's 128-key tile): every thread with varlen only.
  static_assert(FwdConfig<256, false>::kOInKV && FwdConfig<192, false>::kOInKV && FwdFp8Config<256, false>::kOInKV);
  EXPECT_EQ(k(FwdConfig<256, false>{}, Fixed{}), 1u);
  EXPECT_EQ(pv(FwdConfig<256, false>{}, Fixed{}), 1u);
  EXPECT_EQ(k(FwdConfig<256, false>{}, Varlen{}), 128u);
  EXPECT_EQ(pv(FwdConfig<256, false>{}, Varlen{}), 128u);
  EXPECT_EQ(pv(FwdConfig<192, false>{}, Varlen{}), 128u);
  EXPECT_EQ(pv(FwdFp8Config<256, false>{}, Varlen{}), 128u);
  // Block descales: every thread releases K (its factor slot), V as the tile's O staging says.
  EXPECT_EQ(k(WithBlockDescales<FwdFp8Config<128, false>>{}, Fixed{}), 128u);
  EXPECT_EQ(pv(WithBlockDescales<FwdFp8Config<128, false>>{}, Varlen{}), 1u);
  EXPECT_EQ(k(WithBlockDescales<FwdFp8Config<256, false>>{}, Fixed{}), 128u);
  EXPECT_EQ(pv(WithBlockDescales<FwdFp8Config<256, false>>{}, Fixed{}), 1u);
  EXPECT_EQ(pv(WithBlockDescales<FwdFp8Config<256, false>>{}, Varlen{}), 128u);
}

TEST(VTranspose, LaneMapCoversTheTileWithoutBankConflicts) {
  // Every product tile (fwd_config.h), by name: first tiles, then the second tiles.
  check_v_transpose<FwdFp8Config<64, false>>();
  check_v_transpose<FwdFp8Config<64, true>>();
  check_v_transpose<FwdFp8Config<128, false>>();
  check_v_transpose<FwdFp8Config<128, true>>();
  check_v_transpose<FwdFp8Config<256, false>>();
  check_v_transpose<FwdFp8Config<256, true>>();  // 64-key blocks
  check_v_transpose<FwdFp8Config<64, false, true>>();
  check_v_transpose<FwdFp8Config<64, true, true>>();
  check_v_transpose<FwdFp8Config<128, false, true>>();  // 192-key blocks
  check_v_transpose<FwdFp8Config<256, false, true>>();  // 64-key blocks
  check_v_transpose<FwdFp8Config<256, true, true>>();
  check_v_transpose<Fp8Tile<TileConfig<128, 192, 64, 2, false>>>();  // tuning variants (bench/tune_d128.cu)
  check_v_transpose<Fp8Tile<TileConfig<128, 128, 192, 2, false>>>();  // a 128-key part and a 64-key part
  check_v_transpose<Fp8Tile<TileConfig<64, 128, 256, 2, false>>>();   // two 128-key parts
}

// The gather path's lane map (kv_gather.cuh) on the CPU, walked as KvGather::gather_block walks it:
// every (row, 16-byte chunk) of a K or V stage written exactly once at its swizzled offset, each
// pass's row offset taken from the lane that looked that row up, in the slot (register) the pass's
// group holds, every row of the block looked up once, and each warp instruction's 32 lanes reading
// four whole 128-byte row segments.
template <class Cfg>
void check_gather_lanes() {
  using Lanes = GatherLanes<Cfg::kBlockN>;
  constexpr int eb = Cfg::kOperandBytes, panel_cols = 128 / eb, chunk_cols = 16 / eb;
  for (int cols : {Cfg::kHeadDim, Cfg::kHeadDimV}) {
    const int panels = (cols + panel_cols - 1) / panel_cols;
    std::vector<int> written(size_t(Cfg::kBlockN) * panels * 8, 0), looked_up(Cfg::kBlockN, 0);
    std::vector<int> offsets;
    for (int j = 0; j < Lanes::kOwned; ++j) {
      for (int lane = 0; lane < 32; ++lane)
        if (Lanes::owned_row(lane, j) < Cfg::kBlockN) ++looked_up[Lanes::owned_row(lane, j)];
      for (int i = 8 * j; i < 8 * j + 8 && i < Lanes::kPasses; ++i) {
        ASSERT_EQ(Lanes::owner_slot(i), j) << "pass " << i;
        for (int pn = 0; pn < panels; ++pn) {
          std::vector<int> segment_chunks(Cfg::kBlockN, 0);
          for (int lane = 0; lane < 32; ++lane) {
            const int row = Lanes::row(lane, i), col = panel_cols * pn + Lanes::template chunk_col<eb>(lane);
            ASSERT_EQ(Lanes::template chunk_col<eb>(lane), chunk_cols * Lanes::chunk(lane));
            ASSERT_LT(row, Cfg::kBlockN);
            ASSERT_EQ(Lanes::owned_row(Lanes::owner_lane(lane, i), Lanes::owner_slot(i)), row) << "pass " << i;
            if (col >= cols) continue;
            ++written[(size_t(row) * panels + pn) * 8 + Lanes::chunk(lane)];
            ++segment_chunks[row];
            const uint32_t at = hopper::swizzled_offset<eb>(row, col, Cfg::kBlockN);
            ASSERT_EQ(at % 16, 0u) << "a chunk starts a 16-byte bank group";
            ASSERT_LT(at, uint32_t(hopper::SmemTile<eb, Cfg::kBlockN, panel_cols>::kPanelBytes * panels));
            offsets.push_back(int(at));
          }
          int rows_read = 0;
          for (int n : segment_chunks) {
            if (n == 0) continue;
            ++rows_read;
            EXPECT_EQ(n, std::min(8, (cols - panel_cols * pn) / chunk_cols)) << "a row's chunks split over instructions";
          }
          EXPECT_EQ(rows_read, 4);
        }
      }
    }
    for (int row = 0; row < Cfg::kBlockN; ++row) {
      ASSERT_EQ(looked_up[row], 1) << "row " << row;
      for (int pn = 0; pn < panels; ++pn)
        for (int c = 0; c < 8; ++c)
          ASSERT_EQ(written[(size_t(row) * panels + pn) * 8 + c], panel_cols * pn + chunk_cols * c < cols ? 1 : 0)
              << "row " << row << " panel " << pn << " chunk " << c;
    }
    std::sort(offsets.begin(), offsets.end());
    EXPECT_EQ(std::adjacent_find(offsets.begin(), offsets.end()), offsets.end()) << "two chunks at one offset";
  }
}

TEST(KvGather, LaneMapCoversEveryStage) {
  // Every product tile's key block (64, 80, 112, 128, 192 keys) and head dims (fwd_config.h).
  check_gather_lanes<FwdConfig<64, false>>();
  check_gather_lanes<FwdConfig<96, true>>();   // 112 keys, 96 columns: a half-used panel
  check_gather_lanes<FwdConfig<128, true>>();  // 80 keys
  check_gather_lanes<FwdConfig<256, false>>();
  check_gather_lanes<FwdConfig<256, true>>();
  check_gather_lanes<FwdConfigQkV<192, 128>>();
  check_gather_lanes<FwdSplitConfig<64>>();
  check_gather_lanes<FwdSplitConfig<256>>();
  // The e4m3 tiles (128 columns a panel): 64-, 128- and 192-key blocks, one to two panels.
  check_gather_lanes<FwdFp8Config<64, false>>();
  check_gather_lanes<FwdFp8Config<64, true, true>>();
  check_gather_lanes<FwdFp8Config<128, false, true>>();  // 192-key blocks
  check_gather_lanes<FwdFp8Config<256, false>>();
  check_gather_lanes<FwdFp8Config<256, true>>();
  check_gather_lanes<FwdFp8Config<256, false, true>>();
}

}  // namespace
}  // namespace fa3::attn
