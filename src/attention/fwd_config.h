// Tile shapes of the forward kernel per head dim (chosen by measurement: docs/perf-log.md).
// Shared memory must fit 227 KB: Q [kBlockM][kHeadDim] + kStages x (K + V) [kBlockN][kHeadDim]
// (+ an O staging tile; with kOInKV none, or a 64-row half where it fits: fwd_smem.cuh).
// Registers per consumer thread hold S (kBlockN/2 floats), P (kBlockN/4 words) and O (kHeadDim/2 floats).
#pragma once

namespace fa3::attn {

// Compile-time switches of the kernel's scheduling techniques (FlashAttention-3 3.1 and 3.2,
// FlashAttention-4's lazy rescale, and two of ours); each tile's kSchedule below says which the
// product runs, the benchmark's ablation mode flips one at a time.
enum Schedule : int {
  kPingpong = 1,  // warpgroups take turns issuing GEMMs so one's softmax hides under the other's
  kOverlap = 2,   // issue QK^T of block n+1 before the softmax of block n, PV of block n under it
  kLazyRescale = 4,  // rescale O only when a row max grows by > 2^8 (FlashAttention-4); see softmax.cuh
  kExpUnderPv = 8,   // with kOverlap: the exponentials too run under the PV GEMM (P packed after it)
  kCrossTile = 16,   // with kOverlap: a tile's last PV goes out with the next tile's first QK^T,
                     // the epilogue runs under that QK^T; needs a second Q buffer
  kNarrowFirst = 32,  // a tile's first key block: softmax and PV only on the keys a warpgroup can see
  kFullSchedule = kPingpong | kOverlap | kLazyRescale | kExpUnderPv | kNarrowFirst,  // kCrossTile: per tile
};

// One tile configuration: kBlockM query rows (64 per consumer warpgroup) x kBlockN keys per block,
// kStages K/V buffers, O staged for its TMA store in a tile of its own or (kOInKV, where smem has
// no room for one) in the K and V stages of the tile's last key block, the schedule flags, and the
// head dims: kD of Q and K, kDv of V and O.
template <int kD, int kM, int kN, int kS, bool kOInKV_, int kSched = kFullSchedule, int kDv = kD>
struct TileConfig {
  static constexpr int kHeadDim = kD, kHeadDimV = kDv, kBlockM = kM, kBlockN = kN, kStages = kS;
  static constexpr bool kOInKV = kOInKV_;
  static constexpr int kSchedule = kSched;
  static constexpr int kOperandBytes = 2;  // Q/K/V elements: 16-bit (FwdFp8Config: e4m3)
  static constexpr bool kBlockDescales = false;  // e4m3: WithBlockDescales
};
// A tile with other schedule flags (the benchmark's ablation).
template <class Cfg, int kSched>
struct WithSchedule : Cfg {
  static constexpr int kSchedule = kSched;
};

// The product's tiles. kAlt selects a head dim's second tile, for the problems use_alt_tile()
// gives it (only where has_alt_tile()). Head dims of Q/K and V that differ run on the tile of the
// larger (TMA zero-fills the other's missing columns and drops O's), except pairs with a tile of
// their own (FwdConfigQkV).
template <int kHeadDim_, bool kAlt = false>
struct FwdConfig;
template <int kHeadDimQk, int kHeadDimV>
struct FwdConfigQkV;
constexpr bool has_qkv_tile(int head_dim_qk, int head_dim_v) { return head_dim_qk == 192 && head_dim_v == 128; }

// d96 (and masked d128): 192 query rows (three consumer warpgroups) for longer key sequences; d64:
// 128 query rows for short causal/local ones; d256: a 64-key block for short key sequences.
// has_alt_tile: which (head dim, mask) pairs have a second tile at all (CMakeLists.txt instantiates
// those).
constexpr bool has_alt_tile(int head_dim, bool masked) {
  return head_dim == 96 || head_dim == 256 || (masked && (head_dim == 64 || head_dim == 128));
}
inline bool use_alt_tile(int head_dim, bool masked, int seqlen_q, int seqlen_k) {
  if (head_dim == 96) return seqlen_k >= 2048;
  if (head_dim == 128) return masked && seqlen_k >= 4096;
  if (head_dim == 64) return masked && seqlen_q < 2048;
  if (head_dim == 256) return seqlen_k < 4096;
  return false;
}

// Why each tile (the measurements behind each choice are in docs/perf-log.md, by tile).
//
// d64 is softmax-bound (256 MMA FLOPs per exponential): a third consumer warpgroup adds softmax
// throughput, but 192-row tiles waste more of the diagonal on short causal sequences.
// Softmax-bound tiles (d64, d96): the exponentials wait for the PV (no kExpUnderPv), so P's registers
// are free for them, and then go straight into P against the running max, computing the row max only
// where they could pass 2^8 (MainloopMma::kStaleMax): that removes one ALU instruction per score
// (+10-16% from 4k keys, +3-9% at 1k).
constexpr int kSoftmaxBoundSchedule = kFullSchedule & ~kExpUnderPv;
// The stream schedule: that softmax, and a persistent CTA's tiles as one stream of key blocks
// (kCrossTile: no serial QK^T -> softmax at each tile's start), without narrow first blocks.
constexpr int kStreamSchedule = (kSoftmaxBoundSchedule & ~kNarrowFirst) | kCrossTile;
// d64's 192-row tile streams its tiles too, narrow first blocks kept (+1-2%).
template <>
struct FwdConfig<64, false> : TileConfig<64, 192, 128, 2, false, kSoftmaxBoundSchedule | kCrossTile> {};
// The short causal d64 tile: short tiles make the per-tile start matter, so they stream (+2-6% at
// causal 512-1k); narrow first blocks cost it 5% (its diagonal blocks are mostly visible).
template <>
struct FwdConfig<64, true> : TileConfig<64, 128, 128, 2, false, kStreamSchedule> {};
// d96's 128-row tile (keys < 2k) on the stream schedule: +3-6% at 512-1k, causal and not.
template <>
struct FwdConfig<96, false> : TileConfig<96, 128, 128, 2, false, kStreamSchedule> {};
// Three consumer warpgroups at 160 registers (O 48 + S 56 + P 28; 128 keys spill): more softmax
// throughput from 2k keys (+7-18%), too few tiles to fill the SMs at 1k (6-13% slower there).
template <>
struct FwdConfig<96, true> : TileConfig<96, 192, 112, 2, false, kSoftmaxBoundSchedule> {};
// d128 (all but masked problems from 4k keys): the stream schedule with pingpong beats both 128x128
// with the exponentials under the PV and 192x80 with three consumers: +3-10% non-causal, +6-11%
// causal from 1k (fa3-bench).
template <>
struct FwdConfig<128, false> : TileConfig<128, 128, 128, 2, false, kStreamSchedule> {};
// Masked problems from 4k keys: 192x80 (three consumers at 160 registers, exponentials under the PV,
// no pingpong) runs causal 4k-16k 3-6% faster than the stream tile when calls follow each other
// (compare.py), although one call at a time (fa3-bench) reads the stream tile 7-8% faster: not
// understood, the back-to-back method decides.
template <>
struct FwdConfig<128, true> : TileConfig<128, 192, 80, 2, false, kFullSchedule & ~kPingpong> {};
// d192 and d256: smem holds Q, two K/V stages and no O tile: O is staged in the last block's K/V
// stages (kOInKV).
template <>
struct FwdConfig<192, false> : TileConfig<192, 128, 112, 2, true> {};
template <>
struct FwdConfig<256, false> : TileConfig<256, 128, 80, 2, true> {};
// DeepSeek's d_qk 192 / d_v 128: V and O take a third less smem than d192's, so O gets a tile of
// its own (Q single-buffered: 48 + 2 x (42 + 28) + 32 = 220 KB); 112 keys as d192 (S 56 + P 28 + O 64
// registers).
template <>
struct FwdConfigQkV<192, 128> : TileConfig<192, 128, 112, 2, false, kFullSchedule, 128> {};
// Short key sequences at d256: 64-key blocks waste less of the last (partial) block and of the
// causal diagonal: +5% at 512, +1-4% at 1k-2k, but 2-4% slower at 8k-16k causal; pingpong brings
// nothing with one softmax per 64 keys (+1% without it at causal 512-1k).
template <>
struct FwdConfig<256, true> : TileConfig<256, 128, 64, 2, true, kFullSchedule & ~kPingpong> {};

// The decode kernel's tiles (FwdFeatures::kSplit): 64 query rows (one consumer warpgroup, which
// pack-GQA fills with the query heads of one kv head, tile_rows.cuh), so a decode's few queries
// waste less of the GEMMs (a 128-row tile with 4 used rows computed 7x longer than its K/V took to
// read at 64 x 4k keys); no pingpong with one warpgroup; 128 KB of K/V stages (one CTA per SM: the
// bytes in flight per SM are what a memory-bound kernel needs; 192 KB in place of the unused O
// tile measured the same: perf-log step 64). Other head
// dims run padded: d96 on the d128 tile, d192 (and 192/128) on the d256 tile (TMA zero-fills the
// columns; no extra HBM traffic).
constexpr int kDecodeSchedule = kFullSchedule & ~(kPingpong | kNarrowFirst);
template <int kHeadDim>
struct FwdSplitConfig;
template <>
struct FwdSplitConfig<64> : TileConfig<64, 64, 128, 4, false, kDecodeSchedule> {};
template <>
struct FwdSplitConfig<128> : TileConfig<128, 64, 128, 2, false, kDecodeSchedule> {};
template <>
struct FwdSplitConfig<256> : TileConfig<256, 64, 64, 2, false, kDecodeSchedule> {};
// The FP8 (e4m3) tiles: Q/K/V of one byte, O in bf16. wgmma takes e4m3 operands K-major only, so
// the PV's B is V^T, which warps 1-3 of the producer warpgroup write from the loaded V block into
// stages of their own (v_transpose.cuh: 16 keys x 32 columns per ldmatrix / stmatrix). The GEMMs take
// half the 16-bit time, so a block is mostly the softmax's (fa3-bench --tune, perf-log steps 65
// and 72): d64 and d128 on two consumers with 128 keys and the stream schedule, masked or not
// (unmasked: +7-19% at d128 1k-16k, +0-9% at d64 over the schedule without pingpong; perf-log step
// 98, which also found that earlier choices were measured on inputs whose scores spread 64x too
// wide). d256 (O alone is 128 registers), unmasked: 128-key blocks with the consumers at 240
// registers (S 64 + P 16 + O 128; fwd_launch_shape.cuh), smem Q 32 + 2 x (K 32 + V 32 + V^T 32) KB,
// so O is staged in the last block's K/V stages; pingpong and the exponentials under the PV: +3-4%
// over 64-key blocks at 4k and 16k keys (perf-log step 96). Masked: 64-key blocks without
// pingpong, Q single-buffered: 32 + 2 x (16 + 16 + 16) + an O tile of 64 KB; from 1k keys the
// unmasked 128-key tile as the second tile (block descales too, since their factors come with the
// K stages: perf-log steps 99, 102 and 103; the crossover moved from 4k to 1k keys with the
// ldmatrix transposer: step 113).
// kAlt, d64's second tile (use_fp8_alt_tile): three consumers, 192 query rows (the bf16 d64 tile's
// shape and schedule): unmasked from 1k queries (+12% at 1k, +22-36% at 2k-4k, +32% at 8k-16k over
// the first tile), masked from 2k queries and keys as the bf16 d64 tiles (even there, 8% slower at
// causal 1k; perf-log step 98).
// kAlt, d128's second tile: 192-key blocks from 4k keys (S 96 + P 24 + O 64 registers; smem Q 2 x
// 16 + 2 x (K 24 + V 24 + V^T 32, two panels) + O 32 KB): +5-6% at 16k, even at 4k, 17% slower at
// causal 1k (perf-log step 104). Per-head descales only: a 192-key block spans two blocks of
// block-descale factors (128 keys).
// kAlt, d256's second tiles: unmasked, 64-key blocks with pingpong for key sequences shorter than
// 1k (even with the 128-key tile at 512 keys, 4-10% behind it at 1k-2k since step 112's
// transposer); masked, the 128-key tile from 1k keys (+3.5% at 1k and +9% at 2k over the 64-key
// tile, 6% behind it at 512; perf-log step 113).
template <int kHeadDim, bool kMasked, bool kAlt = false>
struct FwdFp8Config;
template <class Cfg>
struct Fp8Tile : Cfg {
  static constexpr int kOperandBytes = 1;
  static_assert(Cfg::kBlockN % 64 == 0 && (Cfg::kBlockM == 64 || Cfg::kBlockM == 128 || Cfg::kBlockM == 192),
                "e4m3 tiles as built and tested: key blocks of whole 64-key halves, 1 (the decode tiles), 2 or 3 consumers");
};
template <bool kMasked>
struct FwdFp8Config<64, kMasked> : Fp8Tile<TileConfig<64, 128, 128, 2, false, kStreamSchedule>> {};
template <bool kMasked>
struct FwdFp8Config<64, kMasked, true>
    : Fp8Tile<TileConfig<64, 192, 128, 2, false, kSoftmaxBoundSchedule | kCrossTile>> {};
template <bool kMasked>
struct FwdFp8Config<128, kMasked> : Fp8Tile<TileConfig<128, 128, 128, 2, false, kStreamSchedule>> {};
template <bool kMasked>
struct FwdFp8Config<128, kMasked, true> : Fp8Tile<TileConfig<128, 128, 192, 2, false, kStreamSchedule>> {};
template <>
struct FwdFp8Config<256, false> : Fp8Tile<TileConfig<256, 128, 128, 2, true>> {};
template <>
struct FwdFp8Config<256, false, true> : Fp8Tile<TileConfig<256, 128, 64, 2, false>> {};
template <>
struct FwdFp8Config<256, true> : Fp8Tile<TileConfig<256, 128, 64, 2, false, kFullSchedule & ~kPingpong>> {};
template <>
struct FwdFp8Config<256, true, true> : FwdFp8Config<256, false> {};
inline bool use_fp8_alt_tile(int head_dim, bool masked, int seqlen_q, int seqlen_k, bool block_descales) {
  if (head_dim == 256) return masked ? seqlen_k >= 1024 : seqlen_k < 1024;
  if (head_dim == 128) return !block_descales && seqlen_k >= 4096;
  if (head_dim != 64) return false;
  return masked ? seqlen_q >= 2048 && seqlen_k >= 2048 : seqlen_q >= 1024;
}
// An FP8 tile whose softmax takes block descales (descale.cuh's Fp8Softmax): problems that pass
// any of fa3_fwd_params' q/k/v_block_descale.
template <class Cfg>
struct WithBlockDescales : Cfg {
  static_assert(Cfg::kOperandBytes == 1, "block descales are for e4m3 operands");
  static_assert(128 % Cfg::kBlockN == 0, "a key block within one block of factors (multiples of 128 keys)");
  static constexpr bool kBlockDescales = true;
};
// The decode tiles with e4m3 operands: FwdSplitConfig's, V transposed as in the FP8 prefill tiles.
// A decode's rate is its bytes in flight per SM (above): one-byte K/V halve a stage's, so d128
// takes four stages (4 x 32 KB of K/V in flight, bf16's 2 x 64 KB), d64 four as bf16 (4 x 16 KB; its
// e4m3 stages are padded to whole 128-byte panel rows in shared memory), d256 two (2 x 32 KB: three
// do not fit beside its V^T stages). On an H100 (perf-log, 2026-12-05) e4m3 decodes read 2.3-2.6 TB/s.
template <int kHeadDim>
struct FwdFp8SplitConfig : Fp8Tile<FwdSplitConfig<kHeadDim>> {};
template <>
struct FwdFp8SplitConfig<128> : Fp8Tile<TileConfig<128, 64, 128, 4, false, kDecodeSchedule>> {};
constexpr int fp8_head_dim(int padded_head_dim) { return padded_head_dim <= 64 ? 64 : padded_head_dim <= 128 ? 128 : 256; }

constexpr int split_head_dim(int padded_head_dim) { return padded_head_dim <= 64 ? 64 : padded_head_dim <= 128 ? 128 : 256; }

}  // namespace fa3::attn
