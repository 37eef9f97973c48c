// Valid calls of each public entry point at fake device addresses, for the host-side tests
// (test_validation.cpp, test_api_fuzz.cpp): validation reads no pointer, so these run without a
// GPU. Distinct, 16-byte-aligned addresses; contiguous BSHD tensors.
#pragma once
#include <cstdint>

#include "fa3/fa3.h"

namespace fa3::test {

template <typename T = void>
T* fake(uintptr_t address) {
  return reinterpret_cast<T*>(address);
}

constexpr int kBatch = 2, kSeqQ = 128, kSeqK = 256, kHeadsQ = 8, kHeadsKv = 2, kDim = 128;

// A bf16 GQA forward.
inline fa3::FwdArgs valid_fwd() {
  fa3::FwdArgs a;
  a.dtype = a.out_dtype = FA3_DTYPE_BF16;
  a.batch = kBatch;
  a.seqlen_q = kSeqQ;
  a.seqlen_k = kSeqK;
  a.heads_q = kHeadsQ;
  a.heads_kv = kHeadsKv;
  a.head_dim_qk = a.head_dim_v = kDim;
  a.q = fa3::bshd(fake(0x100000), kSeqQ, kHeadsQ, kDim);
  a.k = fa3::bshd(fake(0x200000), kSeqK, kHeadsKv, kDim);
  a.v = fa3::bshd(fake(0x300000), kSeqK, kHeadsKv, kDim);
  a.out = fa3::bshd(fake(0x400000), kSeqQ, kHeadsQ, kDim);
  return a;
}

// `a` with the KV-cache append of seqlen_new new keys per sequence and a rotary embedding of 64 of
// its head dims (a decode step's flash_attn_with_kvcache).
inline fa3::FwdArgs with_append(fa3::FwdArgs a, int seqlen_new) {
  a.cache_seqlens = fake<const int32_t>(0x600000);
  a.k_new = fa3::bshd(fake(0x610000), seqlen_new, a.heads_kv, a.head_dim_qk);
  a.v_new = fa3::bshd(fake(0x620000), seqlen_new, a.heads_kv, a.head_dim_v);
  a.seqlen_new = seqlen_new;
  a.rotary_cos = fake<const void>(0x630000);
  a.rotary_sin = fake<const void>(0x640000);
  a.rotary_dim = 64;
  a.rotary_rows = a.seqlen_k;
  a.rotary_row_stride = 32;
  return a;
}

// Four splits of a [batch, seqlen_q, heads_q, d] output in FlashAttention-3's layout, into bf16.
inline fa3::CombineArgs valid_combine() {
  fa3::CombineArgs x;
  x.num_splits = 4;
  x.batch = kBatch;
  x.seqlen = kSeqQ;
  x.heads = kHeadsQ;
  x.head_dim = kDim;
  x.out_partial = fake<const float>(0x100000);
  x.out_partial_row_stride = kHeadsQ * kDim;
  x.out_partial_head_stride = kDim;
  x.out_partial_batch_stride = int64_t(kSeqQ) * kHeadsQ * kDim;
  x.out_partial_split_stride = kBatch * x.out_partial_batch_stride;
  x.lse_partial = fake<const float>(0x200000);
  x.lse_partial_head_stride = 1;
  x.lse_partial_row_stride = kHeadsQ;
  x.lse_partial_batch_stride = kSeqQ * kHeadsQ;
  x.lse_partial_split_stride = kBatch * kSeqQ * kHeadsQ;
  x.out = fa3::bshd(fake(0x300000), kSeqQ, kHeadsQ, kDim);
  return x;
}

// K-shaped bf16 to e4m3 with the Hadamard rotation, blocks of 128 positions.
inline fa3::QuantizeArgs valid_quantize() {
  fa3::QuantizeArgs a;
  a.batch = kBatch;
  a.seqlen = kSeqK;
  a.heads = kHeadsKv;
  a.head_dim = kDim;
  a.in = fa3::bshd(fake(0x200000), kSeqK, kHeadsKv, kDim);
  a.out = fa3::bshd(fake(0x900000), kSeqK, kHeadsKv, kDim);
  a.descale = fake<float>(0xa00000);
  a.descale_batch_stride = kHeadsKv * 2;
  a.descale_head_stride = 2;
  a.hadamard = 1;
  return a;
}

}  // namespace fa3::test
