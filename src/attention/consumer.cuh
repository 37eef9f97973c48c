// A consumer warpgroup's work on its CTA's tiles, as the producer's notes give them: Q in, mainloop,
// epilogue, Q out. Two flows:
//  - per tile: each tile starts with its own QK^T and ends with its own epilogue; O is staged in a
//    tile of its own or (kOInKV) in the last key block's K and V stages;
//  - stream (kCrossTile): the tiles of the CTA form one stream of key blocks, a tile's last PV and
//    epilogue overlapping the next tile's first QK^T (mainloop_mma.cuh).
#pragma once
#include "src/attention/block_info.cuh"
#include "src/attention/epilogue.cuh"
#include "src/attention/fwd_smem.cuh"
#include "src/attention/mainloop_mma.cuh"
#include "src/attention/tile_scheduler.cuh"

namespace fa3::attn {

template <class Elem, class Cfg, bool kMasked>
struct FwdConsumer {
  using Mainloop = MainloopMma<Elem, Cfg, kMasked>;
  using Softmax = typename Mainloop::Softmax;

  const FwdKernelParams& p;
  FwdSmem<Cfg> smem;
  int consumer, thread;  // warpgroup 0 .. kBlockM/64-1 of the consumers; thread 0 .. 127 in it
  Mainloop mainloop;
  Epilogue<Elem, Cfg> epilogue;
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

  // The next tile from the producer's note in the next Q stage (waits for it; fwd_smem.cuh). Tiles the
  // producer skipped on the way (no visible key) get their zeros here: the walk (tile_at_step) runs
  // in the consumers only then. `done`: the steps of the walk handled so far. False at the end.
  __device__ __forceinline__ bool next_tile(int& done, WorkTile& w, BlockRange& r) {
    smem.bars().q.consumer_wait(q_st);
    const auto note = smem.bars().note[q_st.index];
    for (; done < note.step; ++done) {
      WorkTile empty;
      tile_at_step(done, blockIdx.x, gridDim.x, p, empty);
      epilogue.store_zero(empty);
    }
    ++done;
    w = {note.m_block, note.head, note.batch};
    r = {note.n_min, note.n_max};
    return note.m_block >= 0;
  }

  __device__ __forceinline__ void run_per_tile() {
    WorkTile w;
    BlockRange r;
    for (int done = 0; next_tile(done, w, r);) {
      if (mainloop.rows_past_end(w.m_block)) {  // nothing to compute or store (rows past seqlen_q)
        mainloop.run_idle(r);
        release_q();
        q_st.advance();
        continue;
      }
      float o[Cfg::kHeadDim / 2];
      Softmax softmax(p.scale_log2);
      mainloop.run(w.m_block, r, q_st.index, o, softmax, [&] { release_q(); });
      if constexpr (Cfg::kOInKV) {
        // No room for an O tile: the last key block's stages, kept from the producer, take the
        // two warpgroups' O (K's or a half tile of its own for consumer 0, V's for 1) once both
        // warpgroups' GEMMs are done; they go back from the next tile's begin (MainloopMma::kept).
        // The next Q does not wait.
        hopper::named_barrier_sync(kBarOInKV, 2 * hopper::kWarpgroupSize);
        epilogue.store(w, o, softmax, mainloop.o_staging_in_kept_stage(), 64);
      } else {
        epilogue.store(w, o, softmax, epilogue.own_staging(), Cfg::kBlockM);
      }
      q_st.advance();
    }
  }

  // One stream of key blocks across this CTA's tiles (the next tile's Q is in the second buffer).
  __device__ __forceinline__ void run_stream() {
    int done = 0;
    WorkTile w;
    BlockRange r;
    if (!next_tile(done, w, r)) return;
    float o[Cfg::kHeadDim / 2], s[Cfg::kBlockN / 2];
    uint32_t pa[Cfg::kBlockN / 16][4];
    Softmax softmax(p.scale_log2);
    mainloop.begin_tile(w.m_block, r, q_st.index, o, s, pa, softmax);
    for (;;) {
      mainloop.middle_blocks(w.m_block, r, q_st.index, o, s, pa, softmax);
      release_q();
      q_st.advance();
      WorkTile w_next;
      BlockRange r_next;
      if (!next_tile(done, w_next, r_next)) {
        mainloop.end_tile(o, pa);
        epilogue.store(w, o, softmax, epilogue.own_staging(), Cfg::kBlockM);
        return;
      }
      mainloop.end_tile_start_next(q_st.index, o, s, pa);
      epilogue.store(w, o, softmax, epilogue.own_staging(), Cfg::kBlockM);  // under the next tile's first QK^T
      softmax = Softmax(p.scale_log2);
      mainloop.next_first_softmax(w_next.m_block, r_next, s, pa, softmax);
#pragma unroll
      for (int i = 0; i < Cfg::kHeadDim / 2; ++i) o[i] = 0.f;
      w = w_next;
      r = r_next;
    }
  }
};

}  // namespace fa3::attn
