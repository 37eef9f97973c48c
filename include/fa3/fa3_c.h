/* fa3: exact attention for NVIDIA Hopper (sm_90a).  Plain C ABI.
 *
 * Every call takes a parameter struct (initialise it with the matching *_init function so that
 * later versions can add fields with safe defaults), validates it, and returns a status code.
 * On failure, fa3_last_error() returns a message for the calling thread that names the argument
 * and what was expected.  Nothing here allocates device memory or synchronises the stream.
 * Pointers are device (or managed) memory of the calling thread's current device, where fa3 runs.
 *
 * Layout conventions (as FlashAttention):
 *   Q   [batch, seqlen_q, heads_q,  head_dim_qk]   ("BSHD"; last dim contiguous)
 *   K   [batch, seqlen_k, heads_kv, head_dim_qk]
 *   V   [batch, seqlen_k, heads_kv, head_dim_v]
 *   O   [batch, seqlen_q, heads_q,  head_dim_v]
 *   LSE [batch, heads_q, seqlen_q] float32, natural log (varlen: [heads_q, total_q])
 * Strides are in elements.  Varlen (cu_seqlens_q set): Q/O rows are packed, row index =
 * cu_seqlens_q[b] + i, batch_stride is ignored; cu_seqlens_q needs cu_seqlens_k or seqused_k
 * (the keys of each sequence). Likewise cu_seqlens_k packs K/V (alone, queries stay
 * [batch, seqlen_q, ...]); seqused_q / seqused_k shorten each batch entry, packed or not.
 * Paged KV (page_table set): K/V are [num_pages, page_size, heads_kv, d] and batch_stride is the
 * stride between pages.
 *
 * The caller's contract where fa3 cannot check on the host without a sync (device arrays):
 * cu_seqlens_* start at 0 and do not decrease, cu_seqlens_q[b+1] - cu_seqlens_q[b] <= seqlen_q
 * (likewise k; with seqused_k, cu_seqlens_k[b] is only sequence b's first key row, in any order,
 * its keys rows cu_seqlens_k[b] .. + seqused_k[b] - 1 < total_k), cu_seqlens_*[batch] <= total_*,
 * 0 <= seqused_*[b] <= that sequence's length (seqlen_* without cu_seqlens), page_table entries in [0, num_pages).  The up to 127 K/V rows
 * after a sequence's last used key (seqused_k, or the next sequence's rows) are read in its last
 * key block and given weight 0: they must hold finite values (NaN * 0 is NaN); rows past total_k or
 * past seqlen_k of a fixed-length batch are never read. The backward likewise reads the up to 63
 * Q/dO rows after a sequence's last used query (weight 0): finite values there too.
 */
#ifndef FA3_FA3_C_H_
#define FA3_FA3_C_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define FA3_API __declspec(dllexport)
#else
#define FA3_API __attribute__((visibility("default")))
#endif

/* cudaStream_t without requiring the CUDA headers (ABI-identical: a pointer to an opaque struct). */
typedef struct CUstream_st* fa3_stream_t;

#define FA3_VERSION_MAJOR 0
#define FA3_VERSION_MINOR 1

typedef enum fa3_dtype {
  FA3_DTYPE_FP16 = 0,
  FA3_DTYPE_BF16 = 1,
  FA3_DTYPE_E4M3 = 2, /* float8 e4m3fn: Q/K/V of the FP8 forward; the output is bf16 */
  FA3_DTYPE_FP32 = 3  /* accumulators only (dQ accumulation in the backward) */
} fa3_dtype;

typedef enum fa3_status {
  FA3_OK = 0,
  FA3_ERROR_INVALID_ARGUMENT = 1, /* the message names the argument and what was expected */
  FA3_ERROR_NOT_SUPPORTED = 2,    /* valid, but not implemented (yet) for this combination */
  FA3_ERROR_CUDA = 3,             /* a CUDA runtime/driver call failed; the message has the call */
  FA3_ERROR_INTERNAL = 4
} fa3_status;

/* A strided view of one 4-D attention tensor; the last (head-dim) stride is 1. */
typedef struct fa3_tensor {
  void* data;
  int64_t batch_stride; /* elements between batches (varlen: ignored; paged KV: between pages) */
  int64_t row_stride;   /* elements between consecutive sequence positions */
  int64_t head_stride;  /* elements between heads */
} fa3_tensor;

/* FP8 block descales: one float32 factor per block of block_size consecutive positions of one head
 * of one sequence (positions counted from the sequence's start; varlen: batch is the sequence),
 * at data[batch * batch_stride + head * head_stride + position / block_size], blocks contiguous.
 * The attention is computed on factor * Q (and K, V) in each block, on top of the per-head
 * descales. Factors must be positive and finite (V's may also be 0). fa3_quantize_fp8 writes them. */
typedef struct fa3_block_scales {
  const float* data;    /* NULL = none */
  int64_t batch_stride; /* floats between sequences */
  int64_t head_stride;  /* floats between heads */
  int32_t block_size;   /* positions per factor: Q any >= 1; K and V a multiple of 128 */
  int32_t num_blocks;   /* factors per (sequence, head): >= ceil(seqlen / block_size) */
} fa3_block_scales;

/* Forward: O = softmax(scale * Q K^T + mask) V, optionally LSE. */
typedef struct fa3_fwd_params {
  uint32_t struct_size; /* set by fa3_fwd_params_init: sizeof(fa3_fwd_params) */

  fa3_dtype dtype;     /* of Q, K, V */
  fa3_dtype out_dtype; /* of O: equal to dtype for fp16/bf16, bf16 for e4m3 */
  int32_t batch;
  int32_t seqlen_q; /* varlen: the maximum query length over the batch */
  int32_t seqlen_k; /* varlen: the maximum key length; paged: the longest sequence of keys */
  int32_t heads_q;
  int32_t heads_kv; /* heads_q % heads_kv == 0 (GQA / MQA) */
  int32_t head_dim_qk;
  int32_t head_dim_v;

  fa3_tensor q, k, v, out;
  float* lse; /* optional (NULL): float32 log-sum-exp per query row, contiguous */

  float softmax_scale; /* 0 selects the default 1/sqrt(head_dim_qk). A negative scale runs as |scale| on
                        * -Q, a copy made in the workspace (fa3_fwd_workspace_size / fa3_bwd_workspace_size
                        * count it; without it the call is refused): the results are those of the
                        * negative scale, bit for bit the scores (negation is exact). */
  int32_t causal;      /* bottom-right aligned: query i sees keys j <= i + seqlen_k - seqlen_q */
  int32_t window_left; /* sliding window: keys j >= i + seqlen_k - seqlen_q - window_left; -1 = unbounded
                          (as is any window_left >= seqlen_k) */
  int32_t window_right; /* keys j <= i + seqlen_k - seqlen_q + window_right; -1 = unbounded (as is any
                           window_right >= seqlen_q; causal: 0) */
  float softcap;        /* 0 = off, else scores s -> softcap * tanh(s / softcap) */

  /* Variable-length batches (NULL = fixed length). int32 device arrays of batch+1 / batch entries. */
  const int32_t* cu_seqlens_q;
  const int32_t* cu_seqlens_k;
  const int32_t* seqused_q; /* optional: only the first seqused_q[b] queries of batch b are used */
  const int32_t* seqused_k; /* optional: only the first seqused_k[b] keys of batch b are used */
  /* With cu_seqlens_q / cu_seqlens_k (required then, >= 1): the rows of the packed Q and O / K and V
   * tensors (their first extent, >= cu_seqlens_q[batch] / cu_seqlens_k[batch]); LSE is then
   * [heads_q, total_q]. No row at or past them is read or written. Ignored without cu_seqlens. */
  int32_t total_q;
  int32_t total_k;

  /* Paged KV cache (NULL = contiguous K/V). page_table: int32 [batch, max_pages_per_seq]. */
  const int32_t* page_table;
  int64_t page_table_batch_stride;
  int32_t page_size;
  int32_t num_pages;

  /* FP8 descale factors: float32 [batch, heads_kv] with the strides below (NULL = 1): the attention
   * is computed on q_descale * Q, k_descale * K, v_descale * V (FlashAttention-3's descales).
   * e4m3 problems run on the Hopper FP8 kernels (P is rounded to e4m3 for the PV product there).
   * Decodes with per-head descales only (no softcap, no block descales) take the decode kernel as
   * 16-bit problems do: num_splits > 1 then needs the workspace (an error
   * without it), automatic splits take what fits; with softcap or block descales num_splits has
   * no effect. */
  const float* q_descale;
  const float* k_descale;
  const float* v_descale;
  int64_t descale_batch_stride;
  int64_t descale_head_stride;

  /* Split-KV for decodes (a kv head's queries x its query heads <= 128 rows, or num_splits > 1):
   * 0 = choose automatically, 1 = no split, up to 128 (capped at the key blocks). Splits keep
   * partial results in the workspace: with num_splits > 1 it must hold fa3_fwd_workspace_size()
   * bytes; automatic splits take what a smaller workspace (or none) holds. With softcap the decode
   * kernel is not used: num_splits then has no effect (the prefill kernels run). */
  int32_t num_splits;
  void* workspace;    /* device scratch of fa3_fwd_workspace_size() bytes (may be NULL when that is 0) */
  size_t workspace_bytes;

  /* FP8 block descales (e4m3 only; data NULL = none): Q's per query head [batch][heads_q][blocks],
   * K's and V's per kv head [batch][heads_kv][blocks]. Q's join the row's softmax constant, K's the
   * key block's, V's multiply the block's probabilities (the Hopper FP8 kernel shifts the block's
   * logits by log2 of the factor).
   * Appended: a caller built before them passes struct_size FA3_FWD_PARAMS_SIZE_V1 and has none. */
  fa3_block_scales q_block_descale;
  fa3_block_scales k_block_descale;
  fa3_block_scales v_block_descale;

  /* Learnable attention sinks (gpt-oss; NULL = none): float32 [heads_q], one logit per query head
   * that joins every row's softmax denominator without a value row:
   *   O = sum_j exp(s_j) V_j / (sum_j exp(s_j) + exp(sink_h)),  LSE = log(sum_j exp(s_j) + exp(sink_h)),
   * s_j the scores after scale and softcap (the sink is in the same units). A row that sees no key
   * gets O = 0 and LSE = sink_h. Every kernel takes them (split-KV: the combine adds the sink once).
   * Appended: callers built before them pass FA3_FWD_PARAMS_SIZE_V2 (or _V1) and have none. */
  const float* sinks;

  /* KV-cache append with rotary embedding (flash_attn_with_kvcache's k / v / rotary_cos / rotary_sin),
   * run before the attention in the same call. All NULL / 0 = none.
   * cache_seqlens: int32 [batch], the keys each sequence's cache (K / V, contiguous or paged) holds
   *   before this call; with it seqused_k must be NULL and the call attends to cache_seqlens[b] +
   *   seqlen_new keys of sequence b (the caller's contract: at most seqlen_k; keys past it are
   *   neither written nor read). Without k_new (and leftpad_k) it is seqused_k by another name (no
   *   workspace).
   * k_new / v_new: [batch, seqlen_new, heads_kv, head_dim_qk / head_dim_v] new keys and values,
   *   written into K / V at positions cache_seqlens[b] + i (needs cache_seqlens; K and V are then
   *   written, so their strides must not overlap). Packed (cu_seqlens_new, int32 [batch + 1]):
   *   [total_new, heads_kv, d] rows, sequence b's i-th at row cu_seqlens_new[b] + i (batch_stride and
   *   seqlen_new unused).
   * rotary_cos / rotary_sin: [rotary_rows, rotary_dim / 2] in dtype (rows rotary_row_stride apart):
   *   the rotary embedding of the first rotary_dim columns of Q and of k_new (rotary_interleaved = 1:
   *   pairs (2i, 2i + 1), 0: halves (i, i + rotary_dim / 2)), k_new's row i at position
   *   cache_seqlens[b] + i, Q's row i there too when causal or windowed, else at cache_seqlens[b]
   *   (FlashAttention-3's rule; 0 without cache_seqlens). rotary_rows >= seqlen_k. The rotated Q is
   *   written to the workspace (fa3_fwd_workspace_size counts it); q itself is not changed.
   *   Packed queries (cu_seqlens_q): row i of sequence b is its i-th query.
   * Not with cu_seqlens_k (the cache is indexed by batch entry or page table). e4m3 caches take
   * cache_seqlens and k_new / v_new (e4m3 bytes under the cache's k_descale / v_descale and block
   * descales: copied as given), not rotary (NOT_SUPPORTED: rotate before quantizing). */
  const int32_t* cache_seqlens;
  fa3_tensor k_new, v_new;
  int32_t seqlen_new;
  int32_t rotary_dim;
  const void* rotary_cos;
  const void* rotary_sin;
  int64_t rotary_row_stride;
  int32_t rotary_rows;
  int32_t rotary_interleaved;

  /* Packed new keys for the append (above): int32 [batch + 1] cumulative counts, and their total
   * (the rows of k_new / v_new). Appended: callers built before them pass FA3_FWD_PARAMS_SIZE_V4. */
  const int32_t* cu_seqlens_new;
  int32_t total_new;

  /* Left-padded caches (flash_attn_with_kvcache's cache_leftpad; NULL = none): int32 [batch],
   * sequence b's first key is row leftpad_k[b] of its rows of K / V. seqused_k and cache_seqlens
   * still count rows from row 0 (sequence b attends to rows leftpad_k[b] .. seqused_k[b] - 1, or to
   * cache_seqlens[b] + its new keys, or to seqlen_k - 1 without either; new keys still go to row
   * cache_seqlens[b]), and the masks align with the keys it attends to. A contiguous cache only (not
   * with page_table or cu_seqlens_k), K's and V's batch strides a whole number of their rows, the same
   * for both (a [batch, rows, heads_kv, d] cache, rows >= seqlen_k); not with FP8 block descales.
   * The per-sequence starts and key counts are made in the workspace (fa3_fwd_workspace_size counts
   * them), so a left-padded call needs one even without new keys.
   * rotary_seqlens (NULL = cache_seqlens): int32 [batch], the rotary position of sequence b's first
   * new key, with rotary_cos / rotary_sin (FlashAttention-3's rotary_seqlens): k_new's row i is rotated
   * at rotary_seqlens[b] + i, Q's row i at rotary_seqlens[b] (+ i when causal or windowed); where the
   * new keys go does not change.
   * Appended: callers built before them pass FA3_FWD_PARAMS_SIZE_V5. */
  const int32_t* leftpad_k;
  const int32_t* rotary_seqlens;

  /* SMs left free (FlashAttention-3's sm_margin; 0 = none, >= 0): the forward's persistent
   * attention kernels (prefill, decode) launch at most max(1, SMs - sm_margin) CTAs, one an SM, and
   * automatic splits (num_splits = 0) are planned for that many, so that kernels on other streams
   * (communication during context or tensor parallelism) find SMs free while the attention runs.
   * Without it a persistent grid takes every SM until its last tile. The short kernels of a call
   * (the append, the combine of split results) and the backward are not limited: their CTAs retire
   * one tile each, which frees SMs as they go.
   * Appended: callers built before it pass FA3_FWD_PARAMS_SIZE_V6 and have none. */
  int32_t sm_margin;
} fa3_fwd_params;

/* The struct_size of fa3_fwd_params before the block descales (still accepted). */
#define FA3_FWD_PARAMS_SIZE_V1 offsetof(fa3_fwd_params, q_block_descale)
/* The struct_size of fa3_fwd_params before the sinks (still accepted). */
#define FA3_FWD_PARAMS_SIZE_V2 offsetof(fa3_fwd_params, sinks)
/* The struct_size of fa3_fwd_params before the KV-cache append (still accepted). */
#define FA3_FWD_PARAMS_SIZE_V3 offsetof(fa3_fwd_params, cache_seqlens)
/* The struct_size of fa3_fwd_params before the packed new keys (still accepted). */
#define FA3_FWD_PARAMS_SIZE_V4 offsetof(fa3_fwd_params, cu_seqlens_new)
/* The struct_size of fa3_fwd_params before the left padding and rotary positions (still accepted). */
#define FA3_FWD_PARAMS_SIZE_V5 offsetof(fa3_fwd_params, leftpad_k)
/* The struct_size of fa3_fwd_params before sm_margin (still accepted). */
#define FA3_FWD_PARAMS_SIZE_V6 offsetof(fa3_fwd_params, sm_margin)

/* Backward: given dO (and O, LSE from the forward) computes dQ, dK, dV. */
typedef struct fa3_bwd_params {
  uint32_t struct_size;
  fa3_fwd_params fwd; /* the forward's arguments: q, k, v, out (= O), lse (required), masks, ... */
                      /* (not the KV-cache append's cache_seqlens, k_new / v_new, rotary_cos / sin,
                       * rotary_seqlens, nor leftpad_k: pass the keys each sequence used as seqused_k,
                       * or packed keys with cu_seqlens_k) */
  fa3_tensor dout;    /* dO, layout of O */
  fa3_tensor dq, dk, dv;
  int32_t deterministic; /* 1: bitwise reproducible dQ/dK/dV (the key blocks add dQ in a fixed order) */
  void* workspace;
  size_t workspace_bytes;
  /* Optional (NULL = not wanted): float32 [heads_q], the gradient of fwd.sinks (which it needs):
   * dsink_h = -sum over the head's rows of exp(sink_h - LSE) * rowsum(dO * O). Written, not
   * accumulated; always bitwise reproducible (a fixed summation order). */
  float* dsinks;
  /* Optional (NULL = none): float32, laid out as fwd.lse, the gradient of the loss with respect to
   * the forward's LSE, for losses that use LSE itself (merging partial attentions by their LSEs,
   * z-loss-style terms): dQ / dK / dV (and dsinks) are then the gradients through O and LSE
   * together. Rows whose LSE is -inf (no visible key) take no gradient from it. */
  const float* dlse;
} fa3_bwd_params;

FA3_API void fa3_fwd_params_init(fa3_fwd_params* params);
FA3_API void fa3_bwd_params_init(fa3_bwd_params* params);

/* Validation only (no CUDA call): FA3_OK when fa3_forward would accept the arguments. */
FA3_API fa3_status fa3_fwd_validate(const fa3_fwd_params* params);
FA3_API fa3_status fa3_fwd_workspace_size(const fa3_fwd_params* params, size_t* bytes);
FA3_API fa3_status fa3_forward(const fa3_fwd_params* params, fa3_stream_t stream);

/* Which implementation fa3_forward would run for these arguments: "hopper" (the warp-specialised
 * TMA/wgmma kernels) or "reference-gpu" (the simple fp32 kernel that covers every feature; every
 * valid call takes the Hopper kernels today, and the name stays for what a later feature may
 * need first). */
FA3_API fa3_status fa3_fwd_kernel_name(const fa3_fwd_params* params, const char** name);

FA3_API fa3_status fa3_bwd_validate(const fa3_bwd_params* params);
FA3_API fa3_status fa3_bwd_workspace_size(const fa3_bwd_params* params, size_t* bytes);
/* The backward runs three kernels on `stream` (no allocation, no synchronisation: CUDA-graph safe)
 * and needs fa3_bwd_workspace_size() bytes of device scratch in params->workspace. deterministic = 0
 * accumulates dQ with fp32 reduce-adds in whatever order the key blocks finish; 1 orders them. */
FA3_API fa3_status fa3_backward(const fa3_bwd_params* params, fa3_stream_t stream);
/* "hopper" (the warp-specialised wgmma backward: fp16/bf16, head dims <= 256; a negative softmax scale
 * on a negated copy of Q) or "reference-gpu" (the simple fp32 kernels that cover every backward
 * feature; no valid call takes them today). */
FA3_API fa3_status fa3_bwd_kernel_name(const fa3_bwd_params* params, const char** name);

/* Combine: merges partial attention results over splits of the keys (split-KV, context
 * parallelism, cascade attention) through their log-sum-exps:
 *   LSE = log(sum_s exp(lse_s)),  O = sum_s exp(lse_s - LSE) * O_s  (sinks: see the last field).
 * A split with lse_s = -inf (its keys hidden from the row) gets weight 0 and its O_s is not read;
 * a row whose splits are all -inf gets O = 0 and LSE = -inf. fa3_forward runs the same kernel on its
 * workspace when it splits (num_splits). Element strides; the last (head-dim) stride is 1. */
typedef struct fa3_combine_params {
  uint32_t struct_size; /* set by fa3_combine_params_init */
  fa3_dtype out_dtype;  /* of out: fp16, bf16 or fp32 */
  int32_t num_splits;   /* 1 .. 128 */
  int32_t batch;
  int32_t seqlen; /* rows per batch entry (with cu_seqlens: the longest) */
  int32_t heads;
  int32_t head_dim; /* a multiple of 4, <= 256 */
  /* float32 partial outputs: split s, batch b, row i, head h at
   * out_partial + s*split_stride + b*batch_stride + i*row_stride + h*head_stride (+ column);
   * 16-byte aligned, strides multiples of 4. FlashAttention-3's [splits, batch, seqlen, heads, d]. */
  const float* out_partial;
  int64_t out_partial_split_stride, out_partial_batch_stride, out_partial_row_stride, out_partial_head_stride;
  /* float32 partial LSEs (natural log), [splits, batch, seqlen, heads] in FlashAttention-3. */
  const float* lse_partial;
  int64_t lse_partial_split_stride, lse_partial_batch_stride, lse_partial_row_stride, lse_partial_head_stride;
  fa3_tensor out; /* [batch, seqlen, heads, head_dim] of out_dtype; 8-byte aligned rows (16 for fp32) */
  float* lse;     /* optional (NULL): the merged LSE with the strides below */
  int64_t lse_batch_stride, lse_row_stride, lse_head_stride;
  /* Optional, int32 device arrays: packed rows (row of (b, i) = cu_seqlens[b] + i in every tensor,
   * batch strides ignored; batch + 1 entries) and the rows used per batch entry (batch entries). */
  const int32_t* cu_seqlens;
  const int32_t* seqused;
  /* Optional, float32 [heads]: attention sinks (fa3_fwd_params.sinks), a logit per head that joins
   * every row's sum once: LSE = log(sum_s exp(lse_s) + exp(sink_h)), O = sum_s exp(lse_s - LSE) O_s.
   * A row whose splits are all -inf then gets O = 0 and LSE = sink_h. Appended: callers built
   * before it pass FA3_COMBINE_PARAMS_SIZE_V1 and have none. */
  const float* sinks;
} fa3_combine_params;

/* The struct_size of fa3_combine_params before the sinks (still accepted). */
#define FA3_COMBINE_PARAMS_SIZE_V1 offsetof(fa3_combine_params, sinks)

FA3_API void fa3_combine_params_init(fa3_combine_params* params);
/* One kernel on `stream`; no allocation, no synchronisation. */
FA3_API fa3_status fa3_combine(const fa3_combine_params* params, fa3_stream_t stream);

/* FP8 quantization for fa3_forward's e4m3 inputs: a 16-bit [batch, seqlen, heads, head_dim] tensor
 * to e4m3 with one descale per block of block_size positions of each (sequence, head):
 *   y = x, or with hadamard (incoherent processing) y = (x * signs) H, H the head_dim x head_dim
 *   Walsh-Hadamard matrix (+-1 entries, so H / sqrt(head_dim) is orthogonal), signs[c] = +-1 from
 *   (seed, c); with a = max |y| over the block: out = e4m3(y * (448 / a)) rounded to nearest even,
 *   descale = a / 448 (/ sqrt(head_dim) with hadamard), 1 and zeros for an all-zero block. So
 *   descale * out is x, or x's rotation (x * signs) H / sqrt(head_dim); the descales are what
 *   fa3_fwd_params' block descales take.
 * Rotate Q and K with the same seed (Q H (K H)^T = Q K^T), V not. One kernel on `stream`, one read
 * of `in` and one write of `out` (blocks of more than 128 positions read theirs twice, the second
 * time mostly from L2); no allocation, no synchronisation. */
typedef struct fa3_quantize_params {
  uint32_t struct_size; /* set by fa3_quantize_params_init */
  fa3_dtype in_dtype;   /* of in: fp16 or bf16 (out is e4m3) */
  int32_t batch;
  int32_t seqlen; /* with cu_seqlens: the longest sequence */
  int32_t heads;
  int32_t head_dim; /* a multiple of 8, <= 256; with hadamard a power of two >= 16 */
  fa3_tensor in, out;
  /* Optional: packed rows (row of (b, i) = cu_seqlens[b] + i, batch strides ignored; batch + 1
   * int32 entries) and the rows of in and out then (>= cu_seqlens[batch]). */
  const int32_t* cu_seqlens;
  int32_t total;
  /* The descales written: float32 at descale[b * descale_batch_stride + h * descale_head_stride +
   * position / block_size], ceil(seqlen / block_size) per (sequence, head). */
  float* descale;
  int64_t descale_batch_stride;
  int64_t descale_head_stride;
  int32_t block_size; /* 16, 32, 64, or a multiple of 128 */
  int32_t hadamard;   /* 1: rotate first */
  uint64_t seed;      /* of the rotation's signs */
} fa3_quantize_params;

FA3_API void fa3_quantize_params_init(fa3_quantize_params* params);
FA3_API fa3_status fa3_quantize_fp8(const fa3_quantize_params* params, fa3_stream_t stream);

/* The message of the last failed call on this thread ("" after a successful call). */
FA3_API const char* fa3_last_error(void);

/* sizeof(fa3_fwd_params) / sizeof(fa3_bwd_params) as compiled into the library (binding checks). */
FA3_API size_t fa3_fwd_params_size(void);
FA3_API size_t fa3_bwd_params_size(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* FA3_FA3_C_H_ */
