// fa3-bench: forward (or, --bwd, backward) throughput on the FlashAttention papers' sweep (16k
// tokens, hidden 2048, head dim 64/128/256, causal off/on, seqlen 512..16k) or one shape from
// flags, plus the FlashAttention-3 Table-2 style schedule ablation.  Median of CUDA-event timings
// after warm-up, inputs rotated through several sets so that L2 does not flatter; standard-normal
// inputs. L2 is flushed before every timed call (--no-flush: back-to-back calls). TFLOP/s =
// 4*b*h*sq*sk*d / t (halved for causal), times 2.5 for the backward (whose rows time fa3_backward
// alone, default and deterministic, after one forward per input set for O and LSE).
// Comparisons with cuDNN/FA2 live in compare.py and compare_bwd.py.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "bench/ablation.h"
#include "bench/tune_variants.h"
#include "fa3/fa3.h"
#include "src/api/bindings.h"
#include "src/api/dispatch.h"
#include "src/api/problem.h"
#include "src/attention/fwd_config.h"
#include "src/attention/fwd_params.h"
#include "src/hopper/driver_api.h"

namespace {

#define CHECK_CUDA(call)                                                                      \
  do {                                                                                        \
    cudaError_t e_ = (call);                                                                  \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "CUDA error %s at %s:%d: %s\n", #call, __FILE__, __LINE__, cudaGetErrorString(e_)); \
      std::exit(2);                                                                           \
    }                                                                                         \
  } while (0)

// Standard normal values (Box-Muller over a per-element hash), written as bf16 or fp16.
__device__ uint32_t hash32(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return uint32_t(x);
}
// dtype: the elements written (e4m3: one byte each, N(0, 1) as for 16 bits, so that the scores
// spread as in practice, where descales undo the quantizer's scale: N(0, 1) x 8 without descales
// made them 64x wider, a near one-hot softmax whose row maxima keep growing, and the stale-max
// softmax then redoes a quarter of the blocks in full; perf-log step 98).
__global__ void fill_normal(uint16_t* dst, size_t n, uint64_t seed, fa3_dtype dtype) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const float u1 = (hash32(seed * 0x9E3779B97F4A7C15ull + 2 * i) + 1.f) * 2.3283064e-10f;
    const float u2 = hash32(seed * 0x9E3779B97F4A7C15ull + 2 * i + 1) * 2.3283064e-10f;
    const float z = sqrtf(-2.f * logf(u1)) * cospif(2.f * u2);
    uint16_t bits;
    if (dtype == FA3_DTYPE_E4M3) {
      reinterpret_cast<__nv_fp8_e4m3*>(dst)[i] = __nv_fp8_e4m3(z);
      continue;
    }
    if (dtype == FA3_DTYPE_BF16) {
      __nv_bfloat16 h = __float2bfloat16_rn(z);
      std::memcpy(&bits, &h, 2);
    } else {
      __half h = __float2half_rn(z);
      std::memcpy(&bits, &h, 2);
    }
    dst[i] = bits;
  }
}

struct Options {
  std::vector<int> hdims{64, 128, 256};
  std::vector<int> seqlens{512, 1024, 2048, 4096, 8192, 16384};
  std::vector<int> causal{0, 1};
  int tokens = 16384, hidden = 2048, batch = 0, heads = 0, heads_kv = 0;
  fa3_dtype dtype = FA3_DTYPE_BF16;
  int warmup = 5, iters = 20;
  float softcap = 0.f;  // applied to every shape: scores s -> softcap * tanh(s / softcap); 0 = off
  bool ablation = false, tune = false, flush = true, bwd = false, host = false;
  std::vector<int> bwd_modes{0, 1};  // --bwd: the deterministic values timed (interleaved)
  std::string json;
  std::string variant;  // --tune: only the variants whose name contains this (and the product)
};

std::vector<int> parse_list(const char* s) {
  std::vector<int> v;
  for (const char* p = s; *p;) {
    v.push_back(std::atoi(p));
    const char* c = std::strchr(p, ',');
    if (!c) break;
    p = c + 1;
  }
  return v;
}

void usage() {
  std::puts(
      "fa3-bench [--hdim 64,128,256] [--seqlen 512,...,16384] [--causal 0,1] [--tokens 16384] [--hidden 2048]\n"
      "          [--batch B --heads H [--heads-kv HKV]] [--dtype bf16|fp16|e4m3] [--warmup 5] [--iters 20]\n"
      "          [--softcap X] [--bwd [--bwd-modes 0,1]] [--ablation] [--tune [--variant NAME]] [--no-flush] [--host] [--json FILE]\n"
      "  --host: the host time of one fa3::forward call on tiny problems (no GPU wait in the loop)\n"
      "  --bwd: the backward (fa3_backward, default and deterministic) instead of the forward\n"
      "  --bwd-modes 0,1: the backward's deterministic values to time, interleaved (0: default mode alone)\n"
      "  --softcap: scaled scores s -> X * tanh(s / X) in every run (0 = off); FLOPs are counted as without\n"
      "  --tune: time every tile variant compiled in (cmake -DFA3_BUILD_TUNE=ON) on --hdim/--seqlen/--causal\n"
      "  --variant NAME: with --tune, only the variants whose name contains NAME (beside the product)");
}

struct Result {
  int hdim, causal, seqlen, batch, heads, heads_kv;
  std::string kernel, schedule;
  double ms, tflops;
  std::string error;
  double vs_first = -1;  // --tune: relative Frobenius distance of O from the first variant's (the product's)
};

using Launcher = std::function<fa3::Status(const fa3::FwdArgs&)>;
struct Variant {
  std::string label;
  Launcher launch;
};

// Fills L2 with other data before each timed call (as triton's do_bench does), so no call finds
// its inputs cached and every variant starts from the same state.
void flush_l2(int it) {
  static void* buf = nullptr;
  constexpr size_t kBytes = 256u << 20;
  if (!buf) CHECK_CUDA(cudaMalloc(&buf, kBytes));
  CHECK_CUDA(cudaMemsetAsync(buf, it & 0xff, kBytes));
}

// Times one shape for every variant, interleaved call by call (GPU clocks drift with temperature
// and power: interleaving keeps the comparison fair), over input sets in rotation; median per variant.
// o.bwd: the variants are replaced by the backward's two modes on the same sets.
std::vector<Result> run_shape(const Options& o, int d, int causal, int s, int b, int h, int hkv,
                              std::vector<Variant> variants) {
  const size_t q_elems = size_t(b) * s * h * d, kv_elems = size_t(b) * s * hkv * d;
  const size_t set_bytes = (2 * q_elems + 2 * kv_elems) * 2 * (o.bwd ? 2 : 1);
  const int sets = int(std::max<size_t>(2, (240ull << 20) / set_bytes + 1));  // > 4x the 60 MB L2
  std::vector<void*> bufs;
  std::vector<fa3::FwdArgs> args(sets);
  for (int i = 0; i < sets; ++i) {
    void *q, *k, *v, *out;
    CHECK_CUDA(cudaMalloc(&q, q_elems * 2));
    CHECK_CUDA(cudaMalloc(&k, kv_elems * 2));
    CHECK_CUDA(cudaMalloc(&v, kv_elems * 2));
    CHECK_CUDA(cudaMalloc(&out, q_elems * 2));
    for (auto [p, n] : {std::pair{q, q_elems}, std::pair{k, kv_elems}, std::pair{v, kv_elems}})
      fill_normal<<<1024, 256>>>(static_cast<uint16_t*>(p), n, bufs.size() + 1, o.dtype);
    CHECK_CUDA(cudaGetLastError());
    bufs.insert(bufs.end(), {q, k, v, out});
    auto& a = args[i];
    a.dtype = o.dtype;
    a.out_dtype = o.dtype == FA3_DTYPE_E4M3 ? FA3_DTYPE_BF16 : o.dtype;
    a.batch = b;
    a.seqlen_q = a.seqlen_k = s;
    a.heads_q = h;
    a.heads_kv = hkv;
    a.head_dim_qk = a.head_dim_v = d;
    a.causal = causal;
    a.softcap = o.softcap;
    a.q = fa3::bshd(q, s, h, d);
    a.k = fa3::bshd(k, s, hkv, d);
    a.v = fa3::bshd(v, s, hkv, d);
    a.out = fa3::bshd(out, s, h, d);
  }
  // The backward: O and LSE from one forward per set, then dO and the gradients (the layouts of
  // O, Q, K, V) and the workspace; one BwdArgs per set and mode.
  std::vector<std::vector<fa3::BwdArgs>> bwd_args(o.bwd_modes.size());
  if (o.bwd) {
    for (int i = 0; i < sets; ++i) {
      fa3::FwdArgs& a = args[i];
      void *lse, *dout, *dq, *dk, *dv, *ws;
      CHECK_CUDA(cudaMalloc(&lse, size_t(b) * h * s * sizeof(float)));
      CHECK_CUDA(cudaMalloc(&dout, q_elems * 2));
      CHECK_CUDA(cudaMalloc(&dq, q_elems * 2));
      CHECK_CUDA(cudaMalloc(&dk, kv_elems * 2));
      CHECK_CUDA(cudaMalloc(&dv, kv_elems * 2));
      fill_normal<<<1024, 256>>>(static_cast<uint16_t*>(dout), q_elems, 1000 + i, o.dtype);
      CHECK_CUDA(cudaGetLastError());
      a.lse = static_cast<float*>(lse);
      const fa3::Status st = fa3::forward(a);
      if (!st.ok()) {
        std::fprintf(stderr, "forward for the backward failed: %s\n", st.message().c_str());
        std::exit(2);
      }
      fa3::BwdArgs ba;
      ba.fwd = a;
      ba.dout = fa3::bshd(dout, s, h, d);
      ba.dq = fa3::bshd(dq, s, h, d);
      ba.dk = fa3::bshd(dk, s, hkv, d);
      ba.dv = fa3::bshd(dv, s, hkv, d);
      size_t bytes = 0;  // the same for both modes (the semaphores are always there)
      const fa3::Status ws_st = fa3::workspace_size(ba, &bytes);
      if (!ws_st.ok()) {
        std::fprintf(stderr, "fa3_bwd_workspace_size: %s\n", ws_st.message().c_str());
        std::exit(2);
      }
      CHECK_CUDA(cudaMalloc(&ws, std::max<size_t>(bytes, 16)));
      ba.workspace = ws;
      ba.workspace_bytes = bytes;
      for (size_t mi = 0; mi < o.bwd_modes.size(); ++mi) {
        ba.deterministic = o.bwd_modes[mi];
        bwd_args[mi].push_back(ba);
      }
      bufs.insert(bufs.end(), {lse, dout, dq, dk, dv, ws});
    }
    variants.clear();
    for (int det : o.bwd_modes) variants.push_back({det ? "backward deterministic" : "backward", nullptr});
  }
  const char* name = "?";
  if (o.bwd) fa3::kernel_name(bwd_args[0][0], &name);
  else fa3::kernel_name(args[0], &name);
  std::vector<Result> results;
  for (const auto& v : variants) results.push_back(Result{d, causal, s, b, h, hkv, name, v.label, 0, 0, ""});
  std::vector<std::vector<float>> times(variants.size());
  cudaEvent_t e0, e1;
  CHECK_CUDA(cudaEventCreate(&e0));
  CHECK_CUDA(cudaEventCreate(&e1));
  for (int it = 0; it < o.warmup + o.iters; ++it)
    for (size_t vi = 0; vi < variants.size(); ++vi) {
      if (!results[vi].error.empty()) continue;
      if (o.flush) flush_l2(it);
      CHECK_CUDA(cudaEventRecord(e0));
      const fa3::Status st = o.bwd ? fa3::backward(bwd_args[vi][it % sets]) : variants[vi].launch(args[it % sets]);
      CHECK_CUDA(cudaEventRecord(e1));
      if (!st.ok()) results[vi].error = st.message();
      CHECK_CUDA(cudaEventSynchronize(e1));
      float ms = 0;
      CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
      if (it >= o.warmup) times[vi].push_back(ms);
    }
  CHECK_CUDA(cudaGetLastError());
  // Several forward variants (--tune, --ablation): each one's O on the first input set against the
  // first variant's, so a tile that computes garbage fast cannot win.
  if (!o.bwd && variants.size() > 1) {
    const bool bf16 = args[0].out_dtype == FA3_DTYPE_BF16;
    std::vector<uint16_t> raw(q_elems);
    std::vector<double> first(q_elems);
    for (size_t vi = 0; vi < variants.size(); ++vi) {
      if (!results[vi].error.empty()) continue;
      CHECK_CUDA(cudaMemset(args[0].out.data, 0xff, q_elems * 2));  // NaN: rows a variant skips show
      if (!variants[vi].launch(args[0]).ok()) continue;
      CHECK_CUDA(cudaMemcpy(raw.data(), args[0].out.data, q_elems * 2, cudaMemcpyDeviceToHost));
      double num = 0, den = 0;
      for (size_t i = 0; i < q_elems; ++i) {
        const double x = bf16 ? double(__bfloat162float(__nv_bfloat16_raw{raw[i]}))
                              : double(__half2float(__half_raw{raw[i]}));
        if (vi == 0) first[i] = x;
        num += (x - first[i]) * (x - first[i]);
        den += first[i] * first[i];
      }
      results[vi].vs_first = std::sqrt(num / std::max(den, 1e-30));
      if (!(results[vi].vs_first < 5e-2)) results[vi].error = "O differs from the first variant's";
    }
  }
  // Causal: the s(s+1)/2 visible pairs (bottom-right, s_q = s_k).
  const double pairs = causal ? double(s) * (s + 1) / 2 : double(s) * s;
  const double flops = 4.0 * b * h * pairs * d * (o.bwd ? 2.5 : 1.0);
  for (size_t vi = 0; vi < variants.size(); ++vi) {
    auto& t = times[vi];
    if (t.empty() || !results[vi].error.empty()) continue;
    std::sort(t.begin(), t.end());
    results[vi].ms = t[t.size() / 2];
    results[vi].tflops = flops / (results[vi].ms * 1e-3) / 1e12;
  }
  for (void* p : bufs) CHECK_CUDA(cudaFree(p));
  CHECK_CUDA(cudaEventDestroy(e0));
  CHECK_CUDA(cudaEventDestroy(e1));
  return results;
}

void print(const Result& r) {
  char vs[32] = "";
  if (r.vs_first >= 0) std::snprintf(vs, sizeof vs, " (O vs first %.1e)", r.vs_first);
  std::printf("%5d %7d %7d %6d %6d %6s  %-14s %-22s %9.3f %9.1f%s %s\n", r.hdim, r.causal, r.seqlen, r.batch, r.heads,
              (std::to_string(r.heads_kv)).c_str(), r.kernel.c_str(), r.schedule.c_str(), r.ms, r.tflops, vs,
              r.error.c_str());
  std::fflush(stdout);
}

// A launch with nothing around it: the floor under fa3's host cost on this host. The argument is
// as large as the forward kernels' (a kernel's parameters are copied into the launch at each call).
__global__ void empty_kernel(fa3::attn::FwdKernelParams) {}

// Best of 20 bursts of 200 calls of `call`, in us per call (burst 0 warms the caches).
template <class F>
double best_burst(F&& call) {
  double best = 1e30;
  for (int burst = 0; burst < 21; ++burst) {
    CHECK_CUDA(cudaDeviceSynchronize());
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < 200; ++i) call();
    const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / 200;
    if (burst > 0) best = std::min(best, us);
  }
  CHECK_CUDA(cudaDeviceSynchronize());
  return best;
}

// The host cost of fa3::forward: bursts of back-to-back calls on one tiny problem (short enough
// that the launch queue never fills, so the host never waits for the GPU), the GPU drained between
// bursts; the best burst's time per call. The problem's tensors stay the same from call to call, as
// a decode step's do.
void host_cost() {
  struct Shape {
    const char* name;
    int sq, sk, hq, hkv;
  };
  const Shape shapes[] = {{"decode b1 s_q 1, 128 keys, 8:8 heads", 1, 128, 8, 8},
                          {"decode b1 s_q 1, 4096 keys, 32:8 heads", 1, 4096, 32, 8},
                          {"prefill b1 256 x 256, 8 heads", 256, 256, 8, 8}};
  std::printf("host cost of fa3::forward (us per call, best of 20 bursts of 200 calls):\n");
  for (const Shape& sh : shapes) {
    const int d = 128;
    void *q, *k, *v, *out, *lse;
    CHECK_CUDA(cudaMalloc(&q, size_t(sh.sq) * sh.hq * d * 2));
    CHECK_CUDA(cudaMalloc(&k, size_t(sh.sk) * sh.hkv * d * 2));
    CHECK_CUDA(cudaMalloc(&v, size_t(sh.sk) * sh.hkv * d * 2));
    CHECK_CUDA(cudaMalloc(&out, size_t(sh.sq) * sh.hq * d * 2));
    CHECK_CUDA(cudaMalloc(&lse, size_t(sh.sq) * sh.hq * 4));
    CHECK_CUDA(cudaMemset(q, 0, size_t(sh.sq) * sh.hq * d * 2));
    CHECK_CUDA(cudaMemset(k, 0, size_t(sh.sk) * sh.hkv * d * 2));
    CHECK_CUDA(cudaMemset(v, 0, size_t(sh.sk) * sh.hkv * d * 2));
    fa3::FwdArgs a;
    a.batch = 1;
    a.seqlen_q = sh.sq;
    a.seqlen_k = sh.sk;
    a.heads_q = sh.hq;
    a.heads_kv = sh.hkv;
    a.head_dim_qk = a.head_dim_v = d;
    a.q = fa3::bshd(q, sh.sq, sh.hq, d);
    a.k = fa3::bshd(k, sh.sk, sh.hkv, d);
    a.v = fa3::bshd(v, sh.sk, sh.hkv, d);
    a.out = fa3::bshd(out, sh.sq, sh.hq, d);
    a.lse = static_cast<float*>(lse);
    a.causal = 1;
    size_t bytes = 0;
    void* ws = nullptr;
    if (!fa3::workspace_size(a, &bytes).ok()) std::exit(2);
    if (bytes) CHECK_CUDA(cudaMalloc(&ws, bytes));
    a.workspace = ws;
    a.workspace_bytes = bytes;
    const double best = best_burst([&] {
      if (!fa3::forward(a).ok()) std::exit(2);
    });
    const char* name = nullptr;
    const double checks = best_burst([&] {  // validation and the dispatch's choice, no launch
      if (!fa3::kernel_name(a, &name).ok()) std::exit(2);
    });
    // The dispatch and launch alone (no validation, device or pointer checks): the problem as the
    // API layer hands it over.
    const fa3::detail::FwdProblem problem = fa3::detail::make_problem(a);
    const double launch_only = best_burst([&] {
      if (!fa3::detail::hopper_fwd(problem, nullptr).ok()) std::exit(2);
    });
    const double unchecked = best_burst([&] {  // fa3's bindings' entry: no per-pointer checks
      if (!fa3::detail::forward_device_tensors(a, nullptr).ok()) std::exit(2);
    });
    const char* kernel = nullptr;
    std::string instance;
    fa3::kernel_name(a, &kernel);
    fa3::detail::hopper_fwd_instance(fa3::detail::make_problem(a), &instance);
    std::printf("  %-42s %6.2f  (%s, workspace %zu bytes; validation and dispatch alone %.2f, without the "
                "pointer checks %.2f, dispatch and launch alone %.2f)\n",
                sh.name, best, instance.c_str(), bytes, checks, unchecked, launch_only);
    for (void* p : {q, k, v, out, lse, ws}) cudaFree(p);
  }
  int dev = 0;
  const double get_device = best_burst([&] { CHECK_CUDA(cudaGetDevice(&dev)); });
  std::printf("  %-42s %6.2f\n", "cudaGetDevice", get_device);
  fa3::attn::FwdKernelParams blob{};
  const double bare = best_burst([&] {
    empty_kernel<<<1, 32>>>(blob);
    CHECK_CUDA(cudaGetLastError());
  });
  std::printf("  %-42s %6.2f  (an empty kernel, %zu bytes of parameters, <<<>>>)\n", "bare launch", bare,
              sizeof blob);
  // The same through the driver with the function looked up once (the runtime's <<<>>> finds the
  // function and the current context at each call).
  cudaFunction_t fn = nullptr;
  CHECK_CUDA(cudaGetFuncBySymbol(&fn, reinterpret_cast<const void*>(empty_kernel)));
  if (const auto launch = fa3::hopper::driver_api().launch_kernel.fn) {
    const double driver = best_burst([&] {
      void* args[] = {&blob};
      if (launch(reinterpret_cast<CUfunction>(fn), 1, 1, 1, 32, 1, 1, 0, nullptr, args, nullptr) != CUDA_SUCCESS)
        std::exit(2);
    });
    std::printf("  %-42s %6.2f  (the same through cuLaunchKernel, function looked up once)\n", "bare launch, driver",
                driver);
  }
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        usage();
        std::exit(1);
      }
      return argv[++i];
    };
    if (a == "--hdim") o.hdims = parse_list(next());
    else if (a == "--seqlen") o.seqlens = parse_list(next());
    else if (a == "--causal") o.causal = parse_list(next());
    else if (a == "--tokens") o.tokens = std::atoi(next());
    else if (a == "--hidden") o.hidden = std::atoi(next());
    else if (a == "--batch") o.batch = std::atoi(next());
    else if (a == "--heads") o.heads = std::atoi(next());
    else if (a == "--heads-kv") o.heads_kv = std::atoi(next());
    else if (a == "--dtype") {
      const std::string t = next();
      o.dtype = t == "fp16" ? FA3_DTYPE_FP16 : t == "e4m3" ? FA3_DTYPE_E4M3 : FA3_DTYPE_BF16;
    }
    else if (a == "--warmup") o.warmup = std::atoi(next());
    else if (a == "--iters") o.iters = std::atoi(next());
    else if (a == "--softcap") o.softcap = float(std::atof(next()));
    else if (a == "--ablation") o.ablation = true;
    else if (a == "--bwd") o.bwd = true;
    else if (a == "--bwd-modes") o.bwd_modes = parse_list(next());
    else if (a == "--tune") o.tune = true;
    else if (a == "--variant") o.variant = next();
    else if (a == "--no-flush") o.flush = false;
    else if (a == "--host") o.host = true;
    else if (a == "--json") o.json = next();
    else {
      usage();
      return a == "--help" || a == "-h" ? 0 : 1;
    }
  }
  if (o.host) {
    host_cost();
    return 0;
  }
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  if (o.bwd && (o.ablation || o.tune)) {
    std::fprintf(stderr, "--bwd times the sweep (or one shape); --ablation and --tune are forward-only\n");
    return 1;
  }
  std::printf("fa3-bench on %s (%d SMs), dtype %s%s", prop.name, prop.multiProcessorCount, fa3::dtype_name(o.dtype),
              o.bwd ? ", backward (TFLOP/s = 2.5 x forward FLOPs)" : "");
  if (o.softcap != 0.f) std::printf(", softcap %g", o.softcap);
  std::printf("\n");
  std::printf("%5s %7s %7s %6s %6s %6s  %-14s %-22s %9s %9s\n", "hdim", "causal", "seqlen", "batch", "heads", "hkv",
              "kernel", "schedule", "ms", "TFLOP/s");
  std::vector<Result> results;
  const Variant product{"product", [](const fa3::FwdArgs& a) { return fa3::forward(a); }};
  auto record = [&](std::vector<Result> rs) {
    for (auto& r : rs) print(r), results.push_back(std::move(r));
  };
  if (o.ablation) {  // FlashAttention-3 Table 2 shape
    std::vector<Variant> vs;
    constexpr int kProduct = fa3::attn::FwdConfig<128, false>::kSchedule;  // the tile that runs s = 8448
    constexpr bool kHasPingpong = (kProduct & fa3::attn::kPingpong) != 0;
    const std::pair<int, const char*> scheds[] = {
        {kProduct, kHasPingpong ? "product (pingpong)" : "product (no pingpong)"},
        {kProduct & ~fa3::attn::kOverlap, "no intra-WG overlap"},
        {kProduct ^ fa3::attn::kPingpong, kHasPingpong ? "no pingpong" : "with pingpong"}};
    for (auto [sched, label] : scheds)
      vs.push_back({label, [sched = sched](const fa3::FwdArgs& a) {
                      return fa3::bench::run_schedule_ablation(fa3::detail::make_problem(a), sched, nullptr);
                    }});
    record(run_shape(o, 128, 0, 8448, 4, 16, 16, vs));
  } else if (o.tune) {  // every compiled tile variant of a head dim, interleaved, on the sweep's shapes
    for (int d : o.hdims)
      for (int c : o.causal)
        for (int s : o.seqlens) {
          std::vector<Variant> vs{product};
          for (const auto& v : fa3::bench::tune_variants())
            if (v.head_dim == d && v.masked == (c != 0) && v.dtype == o.dtype && v.softcap == (o.softcap != 0.f) &&
                v.name.find(o.variant) != std::string::npos)
              vs.push_back({v.name, [&v](const fa3::FwdArgs& a) { return v.launch(fa3::detail::make_problem(a), nullptr); }});
          const int h = o.hidden / d, b = std::max(1, o.tokens / s);
          record(run_shape(o, d, c, s, b, h, h, vs));
        }
  } else {
    for (int d : o.hdims)
      for (int c : o.causal)
        for (int s : o.seqlens) {
          const int h = o.heads ? o.heads : o.hidden / d, b = o.batch ? o.batch : std::max(1, o.tokens / s);
          record(run_shape(o, d, c, s, b, h, o.heads_kv ? o.heads_kv : h, {product}));
        }
  }
  if (!o.json.empty()) {
    FILE* f = std::fopen(o.json.c_str(), "w");
    if (!f) {
      std::perror(o.json.c_str());
      return 1;
    }
    std::fprintf(f, "{\"device\": \"%s\", \"dtype\": \"%s\", \"softcap\": %g, \"direction\": \"%s\", \"results\": [\n",
                 prop.name, fa3::dtype_name(o.dtype), o.softcap, o.bwd ? "backward" : "forward");
    for (size_t i = 0; i < results.size(); ++i) {
      const auto& r = results[i];
      std::fprintf(f,
                   "  {\"hdim\": %d, \"causal\": %d, \"seqlen\": %d, \"batch\": %d, \"heads\": %d, \"heads_kv\": %d, "
                   "\"kernel\": \"%s\", \"schedule\": \"%s\", \"ms\": %.5f, \"tflops\": %.2f, \"error\": \"%s\"}%s\n",
                   r.hdim, r.causal, r.seqlen, r.batch, r.heads, r.heads_kv, r.kernel.c_str(), r.schedule.c_str(), r.ms,
                   r.tflops, r.error.c_str(), i + 1 < results.size() ? "," : "");
    }
    std::fprintf(f, "]}\n");
    std::fclose(f);
  }
  int failures = 0;
  for (const auto& r : results) failures += !r.error.empty();
  return failures ? 1 : 0;
}
