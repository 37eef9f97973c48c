#!/usr/bin/env python3
"""fa3 backward vs PyTorch SDPA's cuDNN and FLASH (FlashAttention-2) backward, on the same tensors.

The forward sweep's shapes (compare.py: 16k tokens, hidden 2048, bf16), head dims 64/128/256 by
default (the Hopper backward's tiles; other head dims run on the tile of the next one up), causal
off/on.  Each implementation
runs its own forward once per input set (fa3: fa3_forward with LSE; SDPA: autograd with the backend
pinned), then its backward is timed alone: fa3_backward, or torch.autograd.grad through SDPA.
fa3's deterministic mode is a row of its own ("fa3 det").  TFLOP/s = 2.5 x the forward's FLOPs.
Every row checks fa3's dQ/dK/dV against cuDNN's (within 2e-2), the deterministic mode's against the
default's (within 2e-2) and against itself (two runs on the same inputs, bitwise), and a slice of
batch 0 (2 heads) against float64 autograd where the sequence is <= 4k (within 1e-2).  Exit status 1
when a check fails.  --timer: compare.py's timers (CUDA events by default, as the perf-log's history).

After the sweep, varlen rows (--varlen 0 skips them): the forward benchmark's 16 packed sequences of
random lengths 256-4096 (compare.py's seed, cu_seqlens_q = cu_seqlens_k), fa3's varlen backward
(and deterministic) vs FlashAttention-2's (aten._flash_attention_backward, the kernel behind SDPA's
FLASH backend) and vs fa3's dense backward at the mean length; float64 autograd checks the first and
the last sequence (2 heads).

  python3 bench/compare_bwd.py --json bwd.json --png bwd.png
  python3 bench/compare_bwd.py --hdims 128 --seqlens 4k,16k --causal 1
"""
import argparse
import itertools
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare  # noqa: E402
import fa3_ctypes  # noqa: E402

IMPLS = ("fa3", "fa3_det", "cudnn", "flash")
LABELS = {"fa3": "fa3", "fa3_det": "fa3 det", "cudnn": "cuDNN", "flash": "FA2"}
PLOT_LABELS = {"fa3": "fa3", "fa3_det": "fa3 deterministic", "cudnn": "cuDNN (SDPA)", "flash": "FA2 (SDPA flash)"}
COLORS = dict(compare.COLORS, fa3_det="C2")
F64_MAX_SEQLEN = 4096


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hdims", type=compare.int_list, default=[64, 128, 256])
    ap.add_argument("--seqlens", type=compare.int_list, default=[1024, 4096, 16384])
    ap.add_argument("--causal", choices=("0", "1", "both"), default="both")
    ap.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--warmup-ms", type=float, default=50.0)
    ap.add_argument("--rep", type=int, default=20)
    ap.add_argument("--timer", choices=("events", "do_bench"), default="events",
                    help="events: CUDA events around back-to-back calls behind a GPU head start (the backward's "
                         "history in docs/perf-log.md); do_bench: triton's, L2 flushed before each call (compare.py's "
                         "default; compare.py --bwd passes its own)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--png", default=None, metavar="PATH", help="write TFLOP/s vs seqlen panels (the sweep) here")
    ap.add_argument("--lib", default=None)
    ap.add_argument("--varlen", choices=("0", "1", "only"), default="1",
                    help="the varlen rows after the sweep (only: without the sweep)")
    args = ap.parse_args(argv)
    args.causals = {"0": [False], "1": [True], "both": [False, True]}[args.causal]
    return args


def timer_of(args):
    """compare.py's timers: back-to-back CUDA events, or triton's do_bench (args.timer)."""
    return compare.time_do_bench if args.timer == "do_bench" else compare.time_calls


def fa3_bwd_calls(torch, lib, sets, causal, scale, deterministic, **varlen):
    """Forward once per set (O and LSE), then one prepared fa3_backward call per set.  varlen: packed
    [total, h, d] sets and fa3_ctypes.forward's cu_seqlens_q/k, max_seqlen_q/k."""
    calls, grads, kname = [], None, None
    stream = torch.cuda.current_stream().cuda_stream
    for s in sets:
        q, k, v = s["q"], s["k"], s["v"]
        out = torch.empty_like(q[..., : v.shape[-1]])
        if varlen:
            lse = torch.empty(q.shape[1], q.shape[0], dtype=torch.float32, device=q.device)  # [h, total]
        else:
            b, sq, h, _ = q.shape
            lse = torch.empty(b, h, sq, dtype=torch.float32, device=q.device)
        fp = fa3_ctypes.forward(lib, q, k, v, out, lse, causal=causal, softmax_scale=scale, **varlen)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        bp = fa3_ctypes.bwd_params(lib, fp, s["dout"], dq, dk, dv, deterministic)
        bp._keep.append((out, lse, fp))
        if grads is None:
            grads, kname = (dq, dk, dv), fa3_ctypes.bwd_kernel_name(lib, bp)
        calls.append(lambda bp=bp: fa3_ctypes.run_backward(lib, bp, stream))
    return calls, grads, kname


def sdpa_bwd_calls(torch, impl, sets, causal, scale):
    """Autograd forward once per set with the backend pinned; the timed call is its backward."""
    sdpa = torch.nn.functional.scaled_dot_product_attention
    calls, grads = [], None
    with torch.enable_grad(), torch.nn.attention.sdpa_kernel(compare.sdpa_backend(torch, impl)):
        for s in sets:
            leaves = [s[n].detach().clone().requires_grad_() for n in ("q", "k", "v")]
            qt, kt, vt = (t.transpose(1, 2) for t in leaves)
            out = sdpa(qt, kt, vt, is_causal=causal, scale=scale)
            g = s["dout"].transpose(1, 2)

            def call(out=out, leaves=leaves, g=g):
                with torch.enable_grad():
                    return torch.autograd.grad(out, leaves, g, retain_graph=True)
            calls.append(call)
    if calls:
        grads = calls[0]()
    return calls, grads


def grads_fp64(torch, q, k, v, dout, causal, scale):
    """dQ, dK, dV of [s, h, d] slices in float64 autograd."""
    with torch.enable_grad():
        q, k, v = (t.double().requires_grad_() for t in (q, k, v))
        out = compare.attention_fp64(torch, q, k, v, causal, scale)
        return torch.autograd.grad(out, (q, k, v), dout.double())


def fa2_varlen_bwd_calls(torch, sets, cu, max_len, causal, scale):
    """FlashAttention-2's varlen forward once per packed set (aten._flash_attention_forward), then its
    backward (aten._flash_attention_backward) as the timed call."""
    fwd, bwd = torch.ops.aten._flash_attention_forward, torch.ops.aten._flash_attention_backward
    calls = []
    for s in sets:
        out, lse, rng_state, unused, _ = fwd(s["q"], s["k"], s["v"], cu, cu, max_len, max_len, 0.0, causal, False,
                                             scale=scale)
        calls.append(lambda s=s, out=out, lse=lse, rng_state=rng_state, unused=unused: bwd(
            s["dout"], s["q"], s["k"], s["v"], out, lse, cu, cu, max_len, max_len, 0.0, causal, rng_state, unused,
            scale=scale))
    return calls, calls[0]()


def run_shape(torch, lib, args, shape, l2):
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    scale = 1.0 / math.sqrt(shape["d"])
    sets = compare.make_input_sets(torch, shape, dtype, l2)
    gen = torch.Generator(device="cuda").manual_seed(1)
    for s in sets:
        s["dout"] = torch.randn(s["q"].shape[:-1] + (s["v"].shape[-1],), dtype=dtype, device="cuda", generator=gen)
    row = dict(shape, flops=2.5 * compare.flops(shape), impls={}, fa3_kernel=None, rel_err_vs_cudnn={},
               rel_err_f64={})
    grads = {}
    for impl in IMPLS:
        res = {"ms": None, "tflops": None, "reps": 0, "error": None}
        try:
            if impl.startswith("fa3"):
                calls, g, kname = fa3_bwd_calls(torch, lib, sets, shape["causal"], scale, impl == "fa3_det")
                row["fa3_kernel"] = kname
            else:
                calls, g = sdpa_bwd_calls(torch, impl, sets, shape["causal"], scale)
            torch.cuda.synchronize()
            res["ms"], res["reps"] = timer_of(args)(torch, calls, args.warmup_ms, args.rep)
            res["tflops"] = row["flops"] / (res["ms"] * 1e-3) / 1e12
            if impl == "fa3_det":  # the same set twice: bitwise the same gradients
                calls[0]()
                torch.cuda.synchronize()
                first = [t.clone() for t in g]
                calls[0]()
                torch.cuda.synchronize()
                row["det_bitwise"] = all(torch.equal(a, b) for a, b in zip(first, g))
            grads[impl] = g
        except compare.ERRORS as e:
            res["error"] = compare.error_text(e)
        row["impls"][impl] = res
    if "fa3" in grads and "fa3_det" in grads:  # the deterministic mode is as right as the default
        row["rel_err_det_vs_fa3"] = {n: compare.rel_err(torch, a, b)
                                     for n, a, b in zip(("dq", "dk", "dv"), grads["fa3_det"], grads["fa3"])}
    if "fa3" in grads and "cudnn" in grads:
        row["rel_err_vs_cudnn"] = {n: compare.rel_err(torch, a, b)
                                   for n, a, b in zip(("dq", "dk", "dv"), grads["fa3"], grads["cudnn"])}
    if "fa3" in grads and shape["seqlen"] <= F64_MAX_SEQLEN:
        s0 = sets[0]
        want = grads_fp64(torch, *(s0[n][0, :, :2] for n in ("q", "k", "v", "dout")), shape["causal"], scale)
        row["rel_err_f64"] = {n: compare.rel_err(torch, a[0, :, :2], w)
                              for n, a, w in zip(("dq", "dk", "dv"), grads["fa3"], want)}
    return row


def plot_section(rows):
    """The backward rows as compare.plot_sections draws them."""
    return {"rows": rows, "impls": IMPLS, "labels": PLOT_LABELS, "colors": COLORS, "what": "backward"}


VARLEN_IMPLS = ("fa3", "fa3_det", "fa2", "fa3_dense")
VARLEN_LABELS = {"fa3": "fa3 vl", "fa3_det": "det vl", "fa2": "FA2 vl", "fa3_dense": "fa3 mean"}


def run_varlen(torch, lib, args, l2, d, causal):
    """One varlen row: fa3 / fa3 deterministic / FA2 varlen backward on the packed sequences, fa3's dense
    backward on batches of the mean length (the same tokens)."""
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    lengths = compare.varlen_lengths()
    n, h, total = len(lengths), args.hidden // d, sum(lengths)
    mean, longest = round(total / n), max(lengths)
    cu_host = [0] + list(itertools.accumulate(lengths))
    cu = torch.tensor(cu_host, dtype=torch.int32, device="cuda")
    scale = 1.0 / math.sqrt(d)
    gen = torch.Generator(device="cuda").manual_seed(2)
    sets = [{name: st[name][0] for name in ("q", "k", "v")}
            for st in compare.make_input_sets(torch, {"batch": 1, "seqlen": total, "heads": h, "d": d}, dtype, l2)]
    for st in sets:
        st["dout"] = torch.randn(st["q"].shape, dtype=dtype, device="cuda", generator=gen)
    f = 2.5 * sum(compare.attn_flops(1, h, x, x, d, d, causal) for x in lengths)
    row = dict(section="varlen", d=d, causal=causal, seqlens=lengths, total=total, mean_seqlen=mean, heads=h,
               flops={}, impls={}, fa3_kernel=None, rel_err_f64={}, rel_err_vs_fa2={}, fp64_sequences=[0, n - 1])
    grads = {}
    vl = dict(cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=longest, max_seqlen_k=longest)
    for impl in VARLEN_IMPLS:
        res = {"ms": None, "tflops": None, "reps": 0, "error": None}
        flops_ = f
        try:
            if impl == "fa2":
                calls, g = fa2_varlen_bwd_calls(torch, sets, cu, longest, causal, scale)
            elif impl == "fa3_dense":
                dense = compare.make_input_sets(torch, {"batch": n, "seqlen": mean, "heads": h, "d": d}, dtype, l2)
                for st in dense:
                    st["dout"] = torch.randn(st["q"].shape, dtype=dtype, device="cuda", generator=gen)
                calls, g, _ = fa3_bwd_calls(torch, lib, dense, causal, scale, False)
                flops_ = 2.5 * compare.attn_flops(n, h, mean, mean, d, d, causal)
            else:
                calls, g, kname = fa3_bwd_calls(torch, lib, sets, causal, scale, impl == "fa3_det", **vl)
                row["fa3_kernel"] = row["fa3_kernel"] or kname
            torch.cuda.synchronize()
            res["ms"], res["reps"] = timer_of(args)(torch, calls, args.warmup_ms, args.rep)
            res["tflops"] = flops_ / (res["ms"] * 1e-3) / 1e12
            grads[impl] = g
            del calls
        except compare.ERRORS as e:
            res["error"] = compare.error_text(e)
        row["impls"][impl], row["flops"][impl] = res, flops_
    if "fa3" in grads:
        s0 = sets[0]
        for i in row["fp64_sequences"]:
            r0, r1 = cu_host[i], cu_host[i + 1]
            want = grads_fp64(torch, *(s0[x][r0:r1, :2] for x in ("q", "k", "v", "dout")), causal, scale)
            for name, a, w in zip(("dq", "dk", "dv"), grads["fa3"], want):
                e = compare.rel_err(torch, a[r0:r1, :2], w)
                row["rel_err_f64"][name] = max(row["rel_err_f64"].get(name, 0.0), e)
        if "fa2" in grads:
            row["rel_err_vs_fa2"] = {name: compare.rel_err(torch, a, b)
                                     for name, a, b in zip(("dq", "dk", "dv"), grads["fa3"], grads["fa2"])}
    return row


def print_varlen_header():
    lengths = compare.varlen_lengths()
    print(f"\n## varlen backward, {len(lengths)} sequences of random lengths {min(lengths)}-{max(lengths)} "
          f"(compare.py's seed), TFLOP/s = 2.5 x forward FLOPs of the visible pairs; fa3 mean = fa3 dense at the "
          f"mean length; err = fa3 vs float64 (first and last sequence, 2 heads)")
    print(f"{'d':>4} {'causal':>6} | " + " ".join(f"{VARLEN_LABELS[i]:>8}" for i in VARLEN_IMPLS) +
          f" | {'/FA2 vl':>7} {'/dense':>7} {'det/fa3':>7} | {'err':>8} | kernel")


def print_varlen_row(row):
    t = {i: row["impls"][i]["tflops"] for i in VARLEN_IMPLS}
    f = compare.fmt
    r = lambda a, b: t[a] / t[b] if t[a] and t[b] else None  # noqa: E731
    err = max(row["rel_err_f64"].values()) if row["rel_err_f64"] else None
    print(f"{row['d']:>4} {('yes' if row['causal'] else 'no'):>6} | " + " ".join(f(t[i], '8.1f') for i in VARLEN_IMPLS) +
          f" | {f(r('fa3', 'fa2'), '7.2f')} {f(r('fa3', 'fa3_dense'), '7.2f')} {f(r('fa3_det', 'fa3'), '7.2f')} | "
          f"{f(err, '8.1e')} | {row['fa3_kernel'] or '-'}", flush=True)
    for impl, res in row["impls"].items():
        if res["error"]:
            print(f"       {VARLEN_LABELS[impl]} n/a: {res['error'][:300]}", flush=True)


def print_row(row):
    t = {i: row["impls"][i]["tflops"] for i in IMPLS}
    f = compare.fmt
    r = lambda a, b: t[a] / t[b] if t[a] and t[b] else None  # noqa: E731
    e = row["rel_err_f64"] or row["rel_err_vs_cudnn"]
    err = max(e.values()) if e else None
    print(f"{row['d']:>4} {('yes' if row['causal'] else 'no'):>6} {row['seqlen']:>6} {row['batch']:>3} {row['heads']:>3} | "
          f"{f(t['fa3'], '6.1f')} {f(t['fa3_det'], '7.1f')} {f(t['cudnn'], '6.1f')} {f(t['flash'], '6.1f')} | "
          f"{f(r('fa3', 'cudnn'), '6.2f')} {f(r('fa3', 'flash'), '6.2f')} {f(r('fa3_det', 'fa3'), '7.2f')} | "
          f"{f(err, '8.1e')} {'f64' if row['rel_err_f64'] else 'cuDNN'} | {row['fa3_kernel'] or '-'}", flush=True)
    for impl, res in row["impls"].items():
        if res["error"]:
            print(f"       {LABELS[impl]} n/a: {res['error'][:300]}", flush=True)


def print_header():
    print(f"{'d':>4} {'causal':>6} {'seqlen':>6} {'b':>3} {'h':>3} | {'fa3':>6} {'fa3det':>7} {'cuDNN':>6} {'FA2':>6} | "
          f"{'/cuDNN':>6} {'/FA2':>6} {'det/fa3':>7} | {'err':>8} vs    | kernel")


def run_sweep(torch, lib, args, l2):
    """The sweep's backward rows, printed as they come, and the geometric means; (rows, problems).
    compare.py --bwd calls it with its own sweep's settings."""
    rows, problems = [], []
    for d in args.hdims:
        for causal in args.causals:
            for s in args.seqlens:
                row = run_shape(torch, lib, args, compare.shape_of(args, d, causal, s), l2)
                print_row(row)
                rows.append(row)
                bad = {k: v for k, v in row["rel_err_f64"].items() if not v <= compare.MAX_REL_ERR}
                if bad:
                    problems.append(f"backward d{d} causal={causal} s{s}: fa3 vs float64 {bad}")
                # Where float64 is too slow (long sequences) cuDNN stands in; the deterministic mode is
                # held to the default's gradients and to itself.
                bad = {k: v for k, v in {**row["rel_err_vs_cudnn"], **row.get("rel_err_det_vs_fa3", {})}.items()
                       if not v <= compare.PEER_MAX_REL_ERR}
                if bad:
                    problems.append(f"backward d{d} causal={causal} s{s}: fa3 vs cuDNN / det vs default {bad}")
                if row.get("det_bitwise") is False:
                    problems.append(f"backward d{d} causal={causal} s{s}: the deterministic mode's gradients "
                                    "differ between two runs")
    for other in ("cudnn", "flash"):
        rs = [row["impls"]["fa3"]["tflops"] / row["impls"][other]["tflops"] for row in rows
              if row["impls"]["fa3"]["tflops"] and row["impls"][other]["tflops"]]
        if rs:
            print(f"# backward fa3 / {LABELS[other]}: geometric mean {math.exp(sum(map(math.log, rs)) / len(rs)):.2f} "
                  f"over {len(rs)} shapes (min {min(rs):.2f}, max {max(rs):.2f})")
    return rows, problems


def main(argv=None):
    args = parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        print("compare_bwd.py: no CUDA device visible", file=sys.stderr)
        return 2
    lib = fa3_ctypes.load(args.lib)
    env = compare.environment(torch, args, lib._name)
    l2 = compare.l2_bytes(env)
    torch.set_grad_enabled(False)
    print(compare.env_line(env).replace("forward", "backward"))
    print(f"# {args.dtype}, tokens {args.tokens}, hidden {args.hidden}, timer {args.timer}; TFLOP/s = 2.5 x forward "
          f"FLOPs / t (causal: the visible pairs); err = max over dQ/dK/dV of ||fa3-x||/||x||")
    print_header()
    rows, problems = run_sweep(torch, lib, args, l2) if args.varlen != "only" else ([], [])
    varlen_rows = []
    if args.varlen != "0":
        print_varlen_header()
        for d in args.hdims:
            for causal in args.causals:
                row = run_varlen(torch, lib, args, l2, d, causal)
                print_varlen_row(row)
                varlen_rows.append(row)
                bad = {k: v for k, v in row["rel_err_f64"].items() if not v <= compare.MAX_REL_ERR}
                if bad or row["impls"]["fa3"]["error"]:
                    problems.append(f"varlen d{d} causal={causal}: fa3 vs float64 {bad} {row['impls']['fa3']['error'] or ''}")
    for p in problems:
        print(f"PROBLEM: {p}")
    if args.png and rows:
        compare.plot_sections([plot_section(rows)], args, env, args.png)
        print(f"# wrote {args.png}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"environment": env, "config": {k: v for k, v in vars(args).items()}, "rows": rows,
                       "varlen_rows": varlen_rows, "problems": problems}, f, indent=1)
        print(f"# wrote {args.json}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
