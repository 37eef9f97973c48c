#!/usr/bin/env python3
"""Host cost of one fa3 call from PyTorch, against the C call itself, on a tiny problem.

A tiny forward (b 1, s 128, h 1, d 64) takes a few microseconds on the GPU, so a loop of N
launches without synchronisation is bound by the host: wall time / N is the host cost per call.
Rows: the C ABI through ctypes with prepared parameters (fa3_forward alone: the C++ call's cost,
plus ctypes' ~1 us), torch.ops.fa3.fwd (dispatcher + allocation of O and LSE),
fa3.flash_attn_func without and with autograd. Prints a table; --json writes it.

    python3 bench/torch_overhead.py [--lib build/release/libfa3.so] [--calls 20000] [--json FILE]
"""
import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fa3  # noqa: E402
import fa3_ctypes  # noqa: E402


def per_call_us(fn, calls):
    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(5):  # the best of five: the host's quietest stretch
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) / calls * 1e6)
    return best


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lib", default=None, help="libfa3.so for the C-call row (default: $FA3_LIB)")
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    q = torch.randn(1, 128, 1, 64, device="cuda", dtype=torch.bfloat16)
    k, v = torch.randn_like(q), torch.randn_like(q)
    rows = {}
    lib = fa3_ctypes.load(args.lib)
    out = torch.empty_like(q)
    lse = torch.empty(1, 1, 128, device="cuda", dtype=torch.float32)
    params = fa3_ctypes.fwd_params(lib, q, k, v, out, lse, causal=True)
    stream = torch.cuda.current_stream().cuda_stream
    rows["C ABI fa3_forward (ctypes)"] = per_call_us(lambda: fa3_ctypes.run_forward(lib, params, stream), args.calls)
    rows["torch.ops.fa3.fwd"] = per_call_us(
        lambda: torch.ops.fa3.fwd.default(q, k, v, None, None, None, None, 0, 0, None, None, None, None,
                                          0.125, True, -1, -1, 0.0, 1, False), args.calls)
    rows["fa3.flash_attn_func"] = per_call_us(lambda: fa3.flash_attn_func(q, k, v, causal=True), args.calls)
    qg = q.clone().requires_grad_()
    rows["fa3.flash_attn_func (requires_grad)"] = per_call_us(
        lambda: fa3.flash_attn_func(qg, k, v, causal=True), args.calls)
    base = rows["C ABI fa3_forward (ctypes)"]
    print(f"{'call':40s} {'us/call':>8s} {'over C':>8s}")
    for name, us in rows.items():
        print(f"{name:40s} {us:8.2f} {us - base:8.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"date": time.strftime("%Y-%m-%d"), "gpu": torch.cuda.get_device_name(),
                       "us_per_call": rows}, f, indent=1)


if __name__ == "__main__":
    main()
