// A consumer warpgroup's work on its CTA's tiles, as the producer's notes give them: Q in, mainloop,
// epilogue, Q out. Two flows:
//  - per tile: each tile starts with its own QK^T and ends with its own epilogue; O is staged in a
//    tile of its own or (kOInKV) in the last key block's K and V stages;
//  - stream (kCrossTile): the tiles of the CTA form one stream of key blocks, a tile's last PV and
//    epilogue overlapping the next tile's first QK^T (mainloop_mma.cuh).
#pragma once
#include "src/attention/block_info.cuh"
#include "src/attention/descale.cuh"
#include "src/attention/epilogue.cuh"
#include "src/attention/fwd_smem.cuh"
#include "src/attention/mainloop_mma.cuh"
#include "src/attention/tile_scheduler.cuh"

namespace fa3::attn {

template <class Elem, class Cfg, class Feat>
struct FwdConsumer {
  using Mainloop = MainloopMma<Elem, Cfg, Feat>;
  using Softmax = typename Mainloop::Softmax;
  using Seq = typename Mainloop::Seq;
  static constexpr int kDv = Cfg::kHeadDimV;
  static constexpr bool kFp8 = FwdSmem<Cfg>::kTransposeV;

  const FwdKernelParams& p;
  FwdSmem<Cfg> smem;
  int consumer, thread;  // warpgroup 0 .. kBlockM/64-1 of the consumers; thread 0 .. 127 in it
  Mainloop mainloop;
  using Epi = Epilogue<Elem, Cfg, Feat>;
  Epi epilogue;
  hopper::PipelineState<FwdSmem<Cfg>::kQStages> q_st;

  __device__ __forceinline__ FwdConsumer(const FwdKernelParams& params, FwdSmem<Cfg> s, int c, int t)
      : p(params), smem(s), consumer(c), thread(t), mainloop{params, s, c, t}, epilogue{params, s, c, t} {}

  __device__ __forceinline__ void run() {
    mainloop.start_turns();
    if constexpr (Mainloop::kCrossTile) run_stream();
    else run_per_tile();
    epilogue.drain();
  }

 private:
  // Q's buffer and its note go back to the producer once this warpgroup no longer reads them. Every
  // thread arrives: an arrive releases only the arriving thread's own reads, and the producer
  // rewrites the note (an arrive by thread 0 alone left the other threads' reads unordered before
  // that write: compute-sanitizer racecheck).
  __device__ __forceinline__ void release_q() { smem.bars().q.consumer_release(q_st); }

  // Tile w's score pipeline: its score modifier (mainloop.scores) and a fresh softmax. e4m3: the
  // descales join the softmax's scale, or with softcap the tanh's factor (score_mod.cuh); block
  // descales: the rows' factors, descale.cuh (with softcap: the tanh's, per row); the key blocks'
  // come with their K stages.
  __device__ __forceinline__ Softmax begin_tile_scores(const WorkTile& w, const Seq& seq) {
    // (The two branches below index by w.head, which a packed decode tile's is not: none of them
    // reaches the decode kernel, split_plan.h.)
    static_assert(!(Feat::kSplit && (Cfg::kBlockDescales || Feat::kSoftcap)), "decode tiles: per-head descales only");
    if constexpr (Cfg::kBlockDescales) {
      const auto rows = mainloop.thread_queries(w.m_block);
      if constexpr (Feat::kSoftcap) {
        const float f = p.softcap_scale * qk_descale<true>(p, w.batch, w.head);
        mainloop.scores.begin_rows(f * q_block_factor(p, w.batch, w.head, rows.q[0], seq.seqlen_q(p)),
                                   f * q_block_factor(p, w.batch, w.head, rows.q[1], seq.seqlen_q(p)));
      }
      return Softmax(p, w.batch, w.head, rows.q, seq.seqlen_q(p));
    } else if constexpr (Feat::kSoftcap) {
      mainloop.scores.begin_tile(p, qk_descale<kFp8>(p, w.batch, w.head));
      return Softmax(p.scale_log2);
    } else {
      // (A query head of the tile: the decode kernel's packed tiles are per kv head, whose query
      // heads share its descales; descale.cuh indexes by query head.)
      return Softmax(softmax_scale_log2<kFp8>(p, w.batch, Mainloop::Rows::head(p, w.head, 0)));
    }
  }

  // The tile a note describes, with its sequence info (varlen: the note's; else the parameters').
  __device__ __forceinline__ Seq seq_of(const typename FwdSmem<Cfg>::TileNote& note) const {
    if constexpr (Feat::kVarlen) return Seq(note.batch, note.seqlen_q, note.seqlen_k, note.q_row0, note.k_row0);
    else return Seq(p, note.batch);
  }

  // The next tile from the producer's note in the next Q stage (waits for it; fwd_smem.cuh). False
  // at the end of the walk. (Tiles without a visible key never come: the producer zeroes them.)
  __device__ __forceinline__ bool next_tile(WorkTile& w, BlockRange& r, Seq& seq) {
    smem.bars().q.consumer_wait(q_st);
    const auto note = smem.bars().note[q_st.index];
    w = {note.m_block, note.head, note.batch};
    if constexpr (Feat::kSplit)  // (the split travels in m_block: fwd_smem.cuh)
      if (note.m_block >= 0) w = {note.m_block % p.num_m_blocks, note.head, note.batch, note.m_block / p.num_m_blocks};
    r = {note.n_min, note.n_max};
    seq = seq_of(note);
    return note.m_block >= 0;
  }

  __device__ __forceinline__ void run_per_tile() {
    WorkTile w;
    BlockRange r;
    Seq seq = Seq::unset(p);
    while (next_tile(w, r, seq)) {
      if (mainloop.rows_past_end(w.m_block, seq)) {  // nothing to compute or store (rows past seqlen_q)
        mainloop.run_idle(r);
        release_q();
        q_st.advance();
        continue;
      }
      float o[kDv / 2];
      Softmax softmax = begin_tile_scores(w, seq);
      mainloop.run(w.m_block, seq, r, q_st.index, o, softmax, [&] { release_q(); });
      if constexpr (Cfg::kOInKV) {
        // No room for an O tile: the last key block's stages, kept from the producer, take the
        // two warpgroups' O (K's or a half tile of its own for consumer 0, V's for 1) once both
        // warpgroups' GEMMs are done; they go back from the next tile's begin (MainloopMma::kept).
        // The next Q does not wait.
        hopper::named_barrier_sync(kBarOInKV, 2 * hopper::kWarpgroupSize);
        epilogue.template store<typename Epi::KeptStaging>(w, seq, o, softmax, mainloop.o_staging_in_kept_stage());
      } else {
        epilogue.template store<typename Epi::OwnStaging>(w, seq, o, softmax, epilogue.own_staging());
      }
      q_st.advance();
    }
  }

  // One stream of key blocks across this CTA's tiles (the next tile's Q is in the second buffer).
  __device__ __forceinline__ void run_stream() {
    WorkTile w;
    BlockRange r;
    Seq seq = Seq::unset(p);
    if (!next_tile(w, r, seq)) return;
    float o[kDv / 2], s[Cfg::kBlockN / 2];
    uint32_t pa[Cfg::kBlockN / Mainloop::Mma::kK][4];
    Softmax softmax = begin_tile_scores(w, seq);
    mainloop.begin_tile(w.m_block, seq, r, q_st.index, o, s, pa, softmax);
    for (;;) {
      mainloop.middle_blocks(w.m_block, seq, r, q_st.index, o, s, pa, softmax);
      release_q();
      q_st.advance();
      WorkTile w_next;
      BlockRange r_next;
      Seq seq_next(seq);
      if (!next_tile(w_next, r_next, seq_next)) {
        mainloop.end_tile(o, s, pa);
        epilogue.template store<typename Epi::OwnStaging>(w, seq, o, softmax, epilogue.own_staging());
        return;
      }
      mainloop.end_tile_start_next(q_st.index, o, s, pa);
      // Under the next tile's first QK^T.
      epilogue.template store<typename Epi::OwnStaging>(w, seq, o, softmax, epilogue.own_staging());
      softmax = begin_tile_scores(w_next, seq_next);  // (the last tile's scores are all P by now)
      mainloop.next_first_softmax(w_next.m_block, seq_next, r_next, s, pa, softmax);
#pragma unroll
      for (int i = 0; i < kDv / 2; ++i) o[i] = 0.f;
      w = w_next;
      r = r_next;
      seq = seq_next;
    }
  }
};

}  // namespace fa3::attn
