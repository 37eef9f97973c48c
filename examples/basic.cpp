// The README's example: causal bf16 attention on device buffers, errors reported by message.
#include <cuda_runtime_api.h>
#include <fa3/fa3.h>

#include <cstdio>

int main() {
  const int b = 2, s = 1024, h = 16, d = 128;
  void *q, *k, *v, *o;
  for (void** p : {&q, &k, &v, &o})
    if (cudaMalloc(p, size_t(b) * s * h * d * 2) != cudaSuccess) return std::puts("no GPU memory"), 1;
  fa3::FwdArgs a;  // defaults: bf16, scale 1/sqrt(d), no mask
  a.batch = b, a.seqlen_q = a.seqlen_k = s, a.heads_q = a.heads_kv = h, a.head_dim_qk = a.head_dim_v = d;
  a.q = fa3::bshd(q, s, h, d), a.k = fa3::bshd(k, s, h, d), a.v = fa3::bshd(v, s, h, d), a.out = fa3::bshd(o, s, h, d);
  a.causal = 1;
  fa3::Status st = fa3::forward(a, /*stream=*/nullptr);
  if (!st) return std::printf("fa3: %s\n", st.message().c_str()), 1;
  return cudaDeviceSynchronize() == cudaSuccess ? 0 : 1;
}
