#!/usr/bin/env python3
"""Host cost of one fa3 call from PyTorch, against the C call itself, on a tiny problem.

A tiny forward (b 1, s 128, h 1, d 64); bursts of calls are timed on the host without waiting for
the GPU (per_call_us), so each row is the host's cost of one call.
Rows: the C ABI through ctypes with prepared parameters (fa3_forward alone: the C++ call's cost,
plus ctypes' ~1 us), torch.ops.fa3.fwd (dispatcher + allocation of O and LSE),
fa3.flash_attn_func without and with autograd. Prints a table; --json writes it.

    python3 bench/torch_overhead.py [--lib build/release/libfa3.so] [--calls 200] [--json FILE]
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


def burst_us(fn, calls):
    """Host time per call of one burst of `calls` launches, timed without waiting for the GPU (the
    launch queue holds them); the GPU is drained first. A loop that synchronised only at its end
    would read the GPU's time instead wherever a call costs the host less than its kernel takes."""
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t0) / calls * 1e6


def best_us(fns, calls, rounds=100):
    """The best burst of each function over `rounds` rounds that take every function in turn, so
    a noisy stretch of the host's time hits all of them alike rather than one row."""
    for fn in fns.values():
        for _ in range(200):
            fn()
    best = {name: float("inf") for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            best[name] = min(best[name], burst_us(fn, calls))
    torch.cuda.synchronize()
    return best


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lib", default=None, help="libfa3.so for the C-call row (default: $FA3_LIB)")
    ap.add_argument("--calls", type=int, default=200, help="calls per burst (within the launch queue)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    q = torch.randn(1, 128, 1, 64, device="cuda", dtype=torch.bfloat16)
    k, v = torch.randn_like(q), torch.randn_like(q)
    lib = fa3_ctypes.load(args.lib)
    out = torch.empty_like(q)
    lse = torch.empty(1, 1, 128, device="cuda", dtype=torch.float32)
    params = fa3_ctypes.fwd_params(lib, q, k, v, out, lse, causal=True)
    stream = torch.cuda.current_stream().cuda_stream
    qg = q.clone().requires_grad_()
    rows = best_us({
        "C ABI fa3_forward (ctypes)": lambda: fa3_ctypes.run_forward(lib, params, stream),
        "torch.ops.fa3.fwd": lambda: torch.ops.fa3.fwd.default(
            q, k, v, None, None, None, None, 0, 0, None, None, None, None, 0.125, True, -1, -1, 0.0, 1,
            False),
        "fa3.flash_attn_func": lambda: fa3.flash_attn_func(q, k, v, causal=True),
        "fa3.flash_attn_func (requires_grad)": lambda: fa3.flash_attn_func(qg, k, v, causal=True),
    }, args.calls)
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
