// The persistent tile scheduler on the CPU: every CTA walks tile_at_step() as the kernel does;
// every tile must come up exactly once, and masked (causal) problems must stay balanced under
// the cost model "a tile costs its key blocks + 1.5" (the per-tile overhead seen on the H200).
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "src/attention/block_info.cuh"
#include "src/attention/tile_scheduler.cuh"

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

// The producer's notes and the consumers' gap walk (consumer.cuh, FwdSmem::TileNote), replayed for
// every CTA: the producer notes each tile with a visible key (step = its place in the walk) and
// then the walk's length; the consumers compute the noted tiles and write zeros for the steps
// between notes. Every tile must be computed or zeroed exactly once, zeroed ones having no visible
// key, on problems whose masks leave tiles without keys (seqlen_q > seqlen_k causal, windows).
TEST(TileScheduler, NotesCoverEveryTile) {
  struct Case {
    int sq, sk, left, right;
  };
  for (const Case c : {Case{1000, 300, -1, 0}, Case{700, 900, 100, 0}, Case{2100, 2600, 300, 40}, Case{512, 512, 0, 0},
                       Case{4096, 100, -1, 0}, Case{300, 9000, 64, 64}, Case{128, 128, -1, -1}})
    for (int grid : {1, 5, 132}) {
      constexpr int kM = 128, kN = 128;
      FwdKernelParams p{};
      p.batch = 2;
      p.heads_q = 3;
      p.seqlen_q = c.sq;
      p.seqlen_k = c.sk;
      p.window_left = c.left;
      p.window_right = c.right;
      p.num_m_blocks = (c.sq + kM - 1) / kM;
      p.num_tiles = p.num_m_blocks * p.heads_q * p.batch;
      p.lpt_order = c.left >= 0 || c.right >= 0;
      const int num_bh = p.batch * p.heads_q, g = std::min(grid, p.num_tiles);
      p.pair_rounds = pair_rounds(num_bh, p.num_m_blocks, g, pair_slack(num_bh, p.num_m_blocks, g));
      std::vector<int> computed(p.num_tiles, 0), zeroed(p.num_tiles, 0);
      auto index = [&](const WorkTile& w) { return (w.batch * p.heads_q + w.head) * p.num_m_blocks + w.m_block; };
      for (int cta = 0; cta < g; ++cta) {
        struct Note {
          WorkTile w;
          int step;
        };
        std::vector<Note> notes;  // the producer's, in order; m_block < 0: the end
        int step = 0;
        WorkTile w;
        BlockRange r;
        while (next_visible_tile<kM, kN>(step, cta, g, p, w, r)) notes.push_back({w, step - 1});
        notes.push_back({{-1, 0, 0}, step - 1});
        int done = 0;  // the consumers'
        for (const Note& n : notes) {
          for (; done < n.step; ++done) {
            WorkTile e;
            ASSERT_TRUE(tile_at_step(done, cta, g, p, e));
            EXPECT_TRUE((block_range<kM, kN>(e.m_block, p).empty())) << "zeroed a tile with keys";
            ++zeroed[index(e)];
          }
          ++done;
          if (n.w.m_block < 0) break;
          EXPECT_FALSE((block_range<kM, kN>(n.w.m_block, p).empty()));
          ++computed[index(n.w)];
        }
      }
      for (int t = 0; t < p.num_tiles; ++t)
        ASSERT_EQ(computed[t] + zeroed[t], 1) << "tile " << t << " sq " << c.sq << " sk " << c.sk << " window " << c.left
                                               << "," << c.right << " grid " << grid;
    }
}

}  // namespace
}  // namespace fa3::attn
