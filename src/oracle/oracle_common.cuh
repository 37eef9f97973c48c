// What the reference GPU kernels share: element loads in fp32, and each batch entry's
// lengths and first packed rows by the API's varlen rules.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "fa3/fa3_c.h"
#include "src/hopper/elem.cuh"

namespace fa3::detail {

template <class T>
__device__ __forceinline__ float load_f(const T* p) {
  return hopper::to_f32(*p);
}
using hopper::from_f32;

// Per-batch lengths and offsets, following the API's varlen rules.
struct SeqInfo {
  int sq, sk;
  int64_t q_row0, k_row0;  // first packed row (varlen) or 0
};

__device__ __forceinline__ SeqInfo seq_info(const fa3_fwd_params& a, int b) {
  SeqInfo s{a.seqlen_q, a.seqlen_k, 0, 0};
  if (a.cu_seqlens_q) {
    s.q_row0 = a.cu_seqlens_q[b];
    s.sq = a.cu_seqlens_q[b + 1] - a.cu_seqlens_q[b];
  }
  if (a.cu_seqlens_k) {
    s.k_row0 = a.cu_seqlens_k[b];
    s.sk = a.cu_seqlens_k[b + 1] - a.cu_seqlens_k[b];
  }
  if (a.seqused_q) s.sq = a.seqused_q[b];
  if (a.seqused_k) s.sk = a.seqused_k[b];
  return s;
}

}  // namespace fa3::detail
