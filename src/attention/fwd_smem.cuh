// Shared-memory layout of the forward kernel and the named barriers its warpgroups use.
// Tiles are TMA images with the 128-byte swizzle (hopper::SmemTile: panels of 64 16-bit or 128 e4m3
// columns, [rows][128 B] each), every tile 1024-byte aligned (the swizzle atom) so descriptors keep
// base_offset 0.
#pragma once
#include <cstdint>

#include "src/hopper/arch.cuh"
#include "src/hopper/mbarrier.cuh"
#include "src/hopper/smem_tile.cuh"

namespace fa3::attn {

// The FP8 kernel's V^T ring (v_transpose.cuh): its stages' barriers, and per V stage whether the
// producer loaded a block into it or ended the stream (the transposer's only way to know when to
// stop). The 16-bit kernels have none (an empty base: their layout stays as it is).
template <int kStages, bool kTransposeV>
struct VtBarriers {};
template <int kStages>
struct VtBarriers<kStages, true> {
  hopper::PipelineBarriers<kStages> vt;
  int v_loaded[kStages];
};

// FP8 block descales (descale.cuh): key block n's factors, written by the producer beside the K
// stage that holds block n (before the stage's arrival) and read by the consumers after their wait
// on it, so the consumers neither walk nor wait for the factor arrays (perf-log step 102). One
// 16-byte slot per K stage (as a float4: K's factor, log2 of V's, 1 / V's, unused), read with one
// LDS.128 by its shared address (MainloopMma::s_done; a generic pointer made it two LD.E).
// Other kernels have none (an empty base).
template <int kStages, bool kBlockDescales>
struct KeyBlockFactorSlots {};
template <int kStages>
struct KeyBlockFactorSlots<kStages, true> {
  float4 k_factors[kStages];
};

// The gather path (kv_gather.cuh, pages that are not a multiple of 16 rows): per K and V stage, the
// barrier on which the walker posts a stage's request to its gather warp.
template <int kStages>
struct GatherPosts {
  uint64_t k[kStages], v[kStages];
};

// Arrivals per consumer warpgroup that release a K stage (kK), or a stage of the ring the PV reads
// (kPv: V; e4m3: V^T): thread 0's with the whole count, or every thread's where the threads read
// the stage by themselves, since an mbarrier arrival orders only the arriving thread's own reads
// for compute-sanitizer's racecheck (a named barrier before thread 0's arrival does not carry it:
// perf-log steps 102, 110). The threads read a stage with block descales (each its K stage's factor
// slot) and, in the varlen tiles that stage O in the last key block's stages (kOInKV), the kept K
// and V stages (their direct store: MainloopMma::release_kept); the fixed-length tiles' TMA store is
// waited for by thread 0. A ring's release is the same code at every block, so such a ring takes
// an arrival from every thread at every block.
template <class Cfg, class Feat>
struct StageReleasers {
  static constexpr bool kThreadsReadKept = Cfg::kOInKV && Feat::kVarlen;
  static constexpr uint32_t kK = (Cfg::kBlockDescales || kThreadsReadKept) ? hopper::kWarpgroupSize : 1;
  static constexpr uint32_t kPv = kThreadsReadKept ? hopper::kWarpgroupSize : 1;
};

template <class Cfg>
struct FwdSmem {
  // Q and K have head_dim_qk columns, V and O head_dim_v (TileConfig::kHeadDimV). O is staged for
  // its store in a tile of the query rows, or (kOInKV) in 64-row tiles: one per warpgroup. O is
  // 16-bit also for e4m3 operands (bf16).
  static constexpr int kElem = Cfg::kOperandBytes;
  using QTile = hopper::SmemTile<kElem, Cfg::kBlockM, Cfg::kHeadDim>;
  using KTile = hopper::SmemTile<kElem, Cfg::kBlockN, Cfg::kHeadDim>;
  using VTile = hopper::SmemTile<kElem, Cfg::kBlockN, Cfg::kHeadDimV>;
  using OTile = hopper::SmemTile16<Cfg::kBlockM, Cfg::kHeadDimV>;
  using OWarpgroupTile = hopper::SmemTile16<64, Cfg::kHeadDimV>;
  // e4m3: the PV's B operand must be K-major, i.e. V^T [d_v][keys] (keys permuted inside 16-key
  // groups as P is: hopper::MmaE4m3::pack_step), written from each loaded V stage.
  static constexpr bool kTransposeV = kElem == 1;
  using VtTile = hopper::SmemTile<1, Cfg::kHeadDimV, Cfg::kBlockN>;
  static constexpr int kQBytes = QTile::kBytes, kKBytes = KTile::kBytes, kVBytes = VTile::kBytes;
  static constexpr int kVtBytes = kTransposeV ? VtTile::kBytes : 0;
  static constexpr int kOBytes = OTile::kBytes;
  // Q is double-buffered when it fits, so the next tile's Q loads while this tile still runs
  // (otherwise every tile starts with a Q round trip: a bubble that dominates short sequences).
  // (+1024 alignment slack, +kBarrierBound an upper bound of the barriers, whose size depends on
  // kQStages: checked below)
  // (e4m3 with four or more stages — the FP8 decode tiles — have the V^T ring's barriers as well.)
  static constexpr int kBarrierBound = kTransposeV && Cfg::kStages >= 4 ? 448 : 320;
  static constexpr int kBytesWithoutQ =
      Cfg::kStages * (kKBytes + kVBytes + kVtBytes) + (Cfg::kOInKV ? 0 : kOBytes) + 1024 + kBarrierBound;
  static constexpr int kQStages = kBytesWithoutQ + 2 * kQBytes <= 227 * 1024 ? 2 : 1;
  // kOInKV: one warpgroup's 64 rows of O (panels of 64 rows) fit in a K or a V stage.
  static_assert(!Cfg::kOInKV || (Cfg::kBlockN >= 64 && Cfg::kBlockM == 128 && Cfg::kHeadDimV == Cfg::kHeadDim),
                "O in K/V stages: 2 consumers, >= 64 keys, one head dim");
  static_assert(!Cfg::kOInKV || (KTile::kBytes >= OWarpgroupTile::kBytes &&
                                 (kTransposeV ? VtTile::kBytes : VTile::kBytes) >= OWarpgroupTile::kBytes),
                "O in K/V stages: a stage holds a warpgroup's 64 rows of O");

  // Byte offsets from the 1024-aligned base. O is staged for its TMA store in a tile of its own, or
  // (kOInKV, when smem is short) in the K and V stages of the tile's last key block (consumer.cuh);
  // where 64 rows of O still fit (kOHalf), consumer 0 stages in a half tile of its own instead of
  // the K stage, which the producer needs sooner than the V stage (the V^T stage with e4m3).
  static constexpr int kOffK = kQStages * kQBytes;
  static constexpr int kOffV = kOffK + Cfg::kStages * kKBytes;
  static constexpr int kOffVt = kOffV + Cfg::kStages * kVBytes;
  static constexpr int kOffO = kOffVt + Cfg::kStages * kVtBytes;
  static constexpr int kOHalfBytes = OWarpgroupTile::kBytes;
  static constexpr bool kOHalf = Cfg::kOInKV && kOffO + kOHalfBytes + kBarrierBound + 1024 <= 227 * 1024;
  static constexpr int kOffBarriers = kOffO + (Cfg::kOInKV ? (kOHalf ? kOHalfBytes : 0) : kOBytes);

  // The producer's note on the tile whose Q a stage holds, written before the stage's arrival
  // (release) and read by the consumers after their wait on it (acquire): the consumers never run
  // the tile walk themselves (tile_scheduler.cuh; its integer divisions were 7% of their
  // instructions at d64 causal 512). m_block < 0: the walk ended (no Q loaded). Tiles without a
  // visible key get no note (the producer writes their zeros). The sequence's lengths and first
  // rows are its SeqlenInfo (varlen kernels read them).
  // The decode kernel's key split travels in m_block (split * num_m_blocks + m_block): a tenth
  // field changed the notes' stride and, with it, the loads and register allocation of every
  // other kernel's consumers.
  struct TileNote {
    int m_block, head, batch, n_min, n_max;
    int seqlen_q, seqlen_k, q_row0, k_row0;
  };
  struct Barriers : VtBarriers<Cfg::kStages, kTransposeV>, KeyBlockFactorSlots<Cfg::kStages, Cfg::kBlockDescales> {
    hopper::PipelineBarriers<kQStages> q;
    hopper::PipelineBarriers<Cfg::kStages> k, v;
    TileNote note[kQStages];
    GatherPosts<Cfg::kStages> posted;
  };
  static_assert(sizeof(Barriers) <= kBarrierBound, "the barriers outgrew the bound kQStages assumes");
  // Dynamic smem to request: the layout plus slack to round the base up to 1024 bytes.
  static constexpr int kBytes = kOffBarriers + sizeof(Barriers) + 1024;
  static_assert(kBytes <= 227 * 1024, "forward tile configuration exceeds 227 KB of shared memory");

  uint8_t* base;
  __device__ __forceinline__ explicit FwdSmem(uint8_t* raw)
      : base(reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(raw) + 1023) & ~uintptr_t(1023))) {}
  __device__ __forceinline__ uint8_t* q(int stage) const { return base + stage * kQBytes; }
  __device__ __forceinline__ uint8_t* k(int stage) const { return base + kOffK + stage * kKBytes; }
  __device__ __forceinline__ uint8_t* v(int stage) const { return base + kOffV + stage * kVBytes; }
  __device__ __forceinline__ uint8_t* vt(int stage) const { return base + kOffVt + stage * kVtBytes; }
  __device__ __forceinline__ uint8_t* o() const { return base + kOffO; }
  __device__ __forceinline__ Barriers& bars() const { return *reinterpret_cast<Barriers*>(base + kOffBarriers); }
};

// Named barrier ids (0 is __syncthreads).
enum FwdBarrier : int {
  kBarSchedule = 2,   // + consumer index: pingpong turn to issue GEMMs (up to 3 consumers)
  kBarEpilogue = 5,   // + consumer index: one warpgroup's O staging, and its warps' meeting in skip_block
  kBarOInKV = 8,      // kOInKV: every consumer's GEMMs of the tile are done, the last K/V stages are free
};

}  // namespace fa3::attn
