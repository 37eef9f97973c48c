#!/usr/bin/env python3
"""fa3 forward vs PyTorch SDPA's cuDNN and FLASH (FlashAttention-2) backends, on the same tensors.

The sweep is the FlashAttention papers': 16k tokens in total (batch = tokens // seqlen), hidden 2048
(heads = hidden // d), head dims 64/128/256, causal off/on, seqlen 512..16k, bf16.  Each row also
checks fa3's output against cuDNN's and FA2's; once per (d, causal) a small slice is checked against
a float64 reference.  The run exits non-zero when fa3 is off by more than 1e-2 there or a NaN shows.

  python3 bench/compare.py                          # full sweep, table on stdout
  python3 bench/compare.py --quick --json r.json --png r.png
  python3 bench/compare.py --hdims 128 --seqlens 1k,8k --causal 1 --impls fa3,cudnn

Timing: CUDA events around each call, inputs rotated over several sets (> 4x L2 together) so
that L2 does not hold the previous call's K/V, median of --rep calls.  Baselines run without
autograd, so neither SDPA backend nor fa3 writes the LSE.
"""
import argparse
import itertools
import datetime
import json
import math
import os
import platform
import statistics
import sys
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fa3_ctypes  # noqa: E402  (needs the path above)

IMPLS = ("fa3", "cudnn", "flash")
LABELS = {"fa3": "fa3", "cudnn": "cuDNN (SDPA)", "flash": "FA2 (SDPA flash)"}
DEFAULT_SEQLENS = (512, 1024, 2048, 4096, 8192, 16384)
QUICK_SEQLENS = (1024, 4096, 16384)
DEFAULT_HDIMS = (64, 128, 256)
L2_BYTES = 60 << 20     # H200's L2; the device property is used when it is larger
MAX_REL_ERR = 1e-2      # fa3 vs the float64 reference
REF_HEADS = 2           # heads of batch element 0 checked against float64
TIME_BUDGET_MS = 10_000  # per impl and shape: a slow path (reference-gpu) gets fewer timed calls
COLORS = {"fa3": "C3", "cudnn": "C0", "flash": "C1"}  # the same colour in every panel


# --------------------------------------------------------------------------------- arguments ----

def int_list(text):
    """"512,1k,16k" -> [512, 1024, 16384] (k = 1024, as seqlens are powers of two)."""
    out = []
    for item in text.split(","):
        item = item.strip().lower()
        out.append(int(item[:-1]) * 1024 if item.endswith("k") else int(item))
    return out


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hdims", type=int_list, default=list(DEFAULT_HDIMS), help="head dims (default 64,128,256)")
    ap.add_argument("--seqlens", type=int_list, default=list(DEFAULT_SEQLENS),
                    help="sequence lengths, k = 1024 (default 512,1k,2k,4k,8k,16k)")
    ap.add_argument("--causal", choices=("0", "1", "both"), default="both")
    ap.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    ap.add_argument("--tokens", type=int, default=16384, help="batch * seqlen (default 16384)")
    ap.add_argument("--hidden", type=int, default=2048, help="heads * head_dim (default 2048)")
    ap.add_argument("--warmup-ms", type=float, default=50.0, help="warm-up time per implementation and shape")
    ap.add_argument("--rep", type=int, default=30, help="timed calls per implementation and shape (median)")
    ap.add_argument("--json", default=None, metavar="PATH", help="write all numbers and the environment here")
    ap.add_argument("--png", default=None, metavar="PATH", help="write TFLOP/s vs seqlen plots here")
    ap.add_argument("--lib", default=None, metavar="PATH", help="libfa3.so (default $FA3_LIB or build/release)")
    ap.add_argument("--impls", default=",".join(IMPLS), help="subset of fa3,cudnn,flash")
    ap.add_argument("--timer", choices=("do_bench", "events"), default="do_bench",
                    help="do_bench: triton.testing.do_bench median (L2 flushed before every call; the method of "
                         "ANCHORS.md); events: back-to-back calls, CUDA events around each")
    ap.add_argument("--quick", action="store_true", help="seqlens 1k,4k,16k and head dims 64,128,256 only")
    args = ap.parse_args(argv)
    if args.quick:
        args.seqlens, args.hdims = list(QUICK_SEQLENS), list(DEFAULT_HDIMS)
    args.impls = [i.strip() for i in args.impls.split(",") if i.strip()]
    unknown = [i for i in args.impls if i not in IMPLS]
    if unknown or not args.impls:
        ap.error(f"--impls: unknown {unknown}; choose from {','.join(IMPLS)}")
    bad = [d for d in args.hdims if args.hidden % d]
    if bad:
        ap.error(f"--hidden {args.hidden} is not a multiple of head dims {bad}")
    if args.rep < 1:
        ap.error("--rep must be >= 1")
    args.causals = {"0": [False], "1": [True], "both": [False, True]}[args.causal]
    return args


# ------------------------------------------------------------------------------- environment ----

def environment(torch, args, lib_path):
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return {
        "gpu": props.name,
        "compute_capability": f"{props.major}.{props.minor}",
        "sm_count": props.multi_processor_count,
        "l2_bytes": getattr(props, "L2_cache_size", None),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "python": platform.python_version(),
        "host": platform.node(),
        "date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "fa3_lib": lib_path,
        "dtype": args.dtype,
    }


def l2_bytes(env):
    return max(L2_BYTES, env["l2_bytes"] or 0)


# ----------------------------------------------------------------------------------- shapes ----

def shape_of(args, d, causal, seqlen):
    return {"d": d, "causal": causal, "seqlen": seqlen,
            "batch": max(1, args.tokens // seqlen),  # one sequence even when seqlen > tokens
            "heads": args.hidden // d}


def flops(shape):
    """4*b*h*s*s*d (QK^T and PV, 2 flops per MAC); causal does half the work."""
    f = 4 * shape["batch"] * shape["heads"] * shape["seqlen"] ** 2 * shape["d"]
    return f / 2 if shape["causal"] else f


def make_input_sets(torch, shape, dtype, l2):
    """Enough independent (q, k, v) sets that cycling through them keeps each call's inputs out of L2."""
    b, s, h, d = shape["batch"], shape["seqlen"], shape["heads"], shape["d"]
    set_bytes = 3 * b * s * h * d * torch.empty((), dtype=dtype).element_size()
    n_sets = max(2, 4 * l2 // set_bytes + 1)
    gen = torch.Generator(device="cuda").manual_seed(0)  # same inputs on every run
    sets = []
    for _ in range(n_sets):
        q, k, v = (torch.randn(b, s, h, d, dtype=dtype, device="cuda", generator=gen) for _ in range(3))
        sets.append({"q": q, "k": k, "v": v,
                     # SDPA wants [b, h, s, d]: views of the very same memory, no copies.
                     "qt": q.transpose(1, 2), "kt": k.transpose(1, 2), "vt": v.transpose(1, 2)})
    return sets


# ---------------------------------------------------------------------------- implementations ----

def fa3_calls(torch, lib, sets, causal, scale):
    """One prepared fa3_forward call per input set: the params are built outside the timed region."""
    outs = [torch.empty_like(s["q"]) for s in sets]
    params = [fa3_ctypes.fwd_params(lib, s["q"], s["k"], s["v"], o, causal=causal, softmax_scale=scale)
              for s, o in zip(sets, outs)]
    stream = torch.cuda.current_stream().cuda_stream
    calls = [lambda p=p: fa3_ctypes.run_forward(lib, p, stream) for p in params]
    return calls, outs[0], fa3_ctypes.kernel_name(lib, params[0])


def sdpa_calls(torch, sets, causal, scale):
    sdpa = torch.nn.functional.scaled_dot_product_attention
    return [lambda s=s: sdpa(s["qt"], s["kt"], s["vt"], is_causal=causal, scale=scale) for s in sets]


def sdpa_backend(torch, impl):
    from torch.nn.attention import SDPBackend
    return SDPBackend.CUDNN_ATTENTION if impl == "cudnn" else SDPBackend.FLASH_ATTENTION


def sdpa_reasons(caught):
    """The informative lines of SDPA's refusal warnings ("head_dim should be no more than 256"),
    without the headers ("... not used because:"), the disabled backends and the source locations."""
    notes = []
    for w in caught:
        msg = str(w.message).split(" (Triggered internally at")[0].strip()
        if msg and not msg.endswith("because:") and "runtime disabled" not in msg and msg not in notes:
            notes.append(msg)
    return notes


def first_call(fn):
    """Runs fn once, turning a refusal into (None, reason); SDPA explains refusals through warnings."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            return fn(), None
        except (RuntimeError, fa3_ctypes.Fa3Error, ValueError) as e:
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            return None, " | ".join([first] + sdpa_reasons(caught))


# ------------------------------------------------------------------------------------ timing ----

def gpu_head_start(torch, rep):
    """Keeps the GPU busy while Python queues the timed calls, so that the events measure GPU time
    and not Python's launch overhead (larger for an SDPA call than for a ctypes call)."""
    if hasattr(torch.cuda, "_sleep"):
        torch.cuda._sleep(int(rep * 200_000))  # ~100 us of GPU clock per queued call


def time_calls(torch, calls, warmup_ms, rep):
    """(median milliseconds of one call, calls timed), cycling through the input sets in the same
    order for every implementation.  Calls slower than TIME_BUDGET_MS / rep are timed fewer times."""
    n = len(calls)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for i in range(3):  # a few calls first: cuDNN builds its graphs, caches warm up
        calls[i % n]()
    end.record()
    end.synchronize()
    per_call = max(start.elapsed_time(end) / 3, 1e-3)
    for i in range(min(1000, int(warmup_ms / per_call))):
        calls[i % n]()
    rep = min(rep, max(3, int(TIME_BUDGET_MS / per_call)))

    starts = [torch.cuda.Event(enable_timing=True) for _ in range(rep)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(rep)]
    torch.cuda.synchronize()
    gpu_head_start(torch, rep)
    for i in range(rep):
        starts[i].record()
        calls[i % n]()
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends)), rep


def time_do_bench(torch, calls, warmup_ms, rep):
    """(median milliseconds, calls timed) from triton.testing.do_bench, which flushes L2 before each
    timed call; the calls still cycle through the input sets in the same order for every impl."""
    import triton.testing
    counter = itertools.count()
    n = len(calls)
    ms = triton.testing.do_bench(lambda: calls[next(counter) % n](), warmup=max(25, int(warmup_ms)),
                                 rep=100, return_mode="median")
    return ms, next(counter)


# ------------------------------------------------------------------------------- correctness ----

def rel_err(torch, a, b):
    """||a - b|| / ||b|| (Frobenius), in float32 (float64 for the reference)."""
    dt = torch.float64 if torch.float64 in (a.dtype, b.dtype) else torch.float32
    a, b = a.to(dt), b.to(dt)
    return ((a - b).norm() / b.norm()).item()


def has_nan(torch, t):
    return bool(torch.isnan(t).any().item())


def attention_fp64(torch, q, k, v, causal, scale, chunk=1024):
    """Plain softmax(scale QK^T) V in float64 on [s, h, d] slices, query rows in chunks so that the
    scores of a 16k sequence never sit in memory whole.  Causal is bottom-right aligned, like fa3."""
    q, k, v = (t.double().transpose(0, 1) for t in (q, k, v))  # [h, s, d]
    sq, sk = q.shape[1], k.shape[1]
    out = torch.empty(q.shape[0], sq, v.shape[2], dtype=torch.float64, device=q.device)
    cols = torch.arange(sk, device=q.device)
    for i0 in range(0, sq, chunk):
        i1 = min(sq, i0 + chunk)
        s = (q[:, i0:i1] @ k.transpose(1, 2)) * scale
        if causal:
            rows = torch.arange(i0, i1, device=q.device)[:, None] + (sk - sq)
            s.masked_fill_(cols[None, :] > rows, float("-inf"))
        out[:, i0:i1] = torch.softmax(s, dim=-1) @ v
    return out.transpose(0, 1)


def reference_check(torch, kept, causal, scale):
    """Every implementation's slice vs float64: fa3's number decides, the others give the scale."""
    q, k, v = kept["inputs"]
    ref = attention_fp64(torch, q, k, v, causal, scale)
    return {impl: rel_err(torch, o, ref) for impl, o in kept["outs"].items()}


# ----------------------------------------------------------------------------------- one row ----

def run_impl(torch, lib, args, impl, sets, causal, scale):
    """Probes one implementation on set 0, then times it over all sets.

    Returns (result, O of set 0 as [b, s, h, d] or None, fa3 kernel name or None).  A refusal (SDPA
    has no kernel for the shape, fa3 returns an error) becomes result["error"], never an exception.
    """
    from contextlib import nullcontext
    res = {"ms": None, "tflops": None, "reps": 0, "error": None}
    kname = None
    # SDPA would silently fall back to another backend: pin the one under test for the whole run.
    ctx = nullcontext() if impl == "fa3" else torch.nn.attention.sdpa_kernel(sdpa_backend(torch, impl))
    try:
        with ctx:
            if impl == "fa3":
                calls, out, kname = fa3_calls(torch, lib, sets, causal, scale)
                _, err = first_call(calls[0])
            else:
                calls = sdpa_calls(torch, sets, causal, scale)
                out, err = first_call(calls[0])
                out = None if out is None else out.transpose(1, 2)  # back to [b, s, h, d]
            if err is not None:
                res["error"] = err
                return res, None, kname
            torch.cuda.synchronize()  # an asynchronous failure shows here, charged to this impl
            timer = time_do_bench if args.timer == "do_bench" else time_calls
            res["ms"], res["reps"] = timer(torch, calls, args.warmup_ms, args.rep)
    except (RuntimeError, fa3_ctypes.Fa3Error, ValueError) as e:
        res["error"] = (str(e).strip().splitlines() or [type(e).__name__])[0]
        return res, None, kname
    return res, out, kname


def run_shape(torch, lib, args, shape, l2):
    """Runs every implementation on the same input sets; returns the row and the float64 check's slices."""
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    scale = 1.0 / math.sqrt(shape["d"])
    sets = make_input_sets(torch, shape, dtype, l2)
    row = dict(shape, flops=flops(shape), n_input_sets=len(sets), impls={}, fa3_kernel=None,
               rel_err_vs={}, nan={})
    outs = {}
    for impl in args.impls:
        res, out, kname = run_impl(torch, lib, args, impl, sets, shape["causal"], scale)
        if res["ms"] is not None:
            res["tflops"] = row["flops"] / (res["ms"] * 1e-3) / 1e12
            outs[impl] = out
            row["nan"][impl] = has_nan(torch, out)
        if impl == "fa3":
            row["fa3_kernel"] = kname
        row["impls"][impl] = res

    if "fa3" in outs:
        for other in ("cudnn", "flash"):
            if other in outs:
                row["rel_err_vs"][other] = rel_err(torch, outs["fa3"], outs[other])
    kept = None
    if outs:  # the float64 check's inputs: batch 0, first heads (small: [s, REF_HEADS, d])
        s0 = sets[0]
        kept = {"inputs": [s0[n][0, :, :REF_HEADS].clone() for n in ("q", "k", "v")],
                "outs": {impl: o[0, :, :REF_HEADS].clone() for impl, o in outs.items()},
                "seqlen": shape["seqlen"]}
    return row, kept


# ------------------------------------------------------------------------------------ output ----

def fmt(x, spec):
    """format(x, spec), or "n/a" padded to the same width so that the columns stay aligned."""
    width = int(spec.split(".")[0] or 0)
    return "n/a".rjust(width) if x is None else format(x, spec)


def ratio(row, a, b):
    ta, tb = (row["impls"].get(i, {}).get("tflops") for i in (a, b))
    return ta / tb if ta and tb else None


def print_header(env, args):
    print(f"# fa3 vs SDPA cuDNN / FLASH (FA2) forward | {env['gpu']} (sm_{env['compute_capability'].replace('.', '')}, "
          f"{env['sm_count']} SMs) | torch {env['torch']}, CUDA {env['cuda']}, cuDNN {env['cudnn']} | "
          f"{env['date_utc']}")
    print(f"# {args.dtype}, tokens {args.tokens}, hidden {args.hidden}, median of {args.rep} calls, "
          f"inputs rotated over > 4x L2; TFLOP/s = 4*b*h*s^2*d/t (x0.5 causal); err = ||fa3-x||/||x||")
    print(f"{'d':>4} {'causal':>6} {'seqlen':>6} {'b':>3} {'h':>3} | {'fa3':>6} {'cuDNN':>6} {'FA2':>6} | "
          f"{'/cuDNN':>6} {'/FA2':>6} | {'err/cuDNN':>9} {'err/FA2':>9} | kernel")


def print_row(row):
    t = {i: row["impls"].get(i, {}).get("tflops") for i in IMPLS}
    e = row["rel_err_vs"]
    print(f"{row['d']:>4} {('yes' if row['causal'] else 'no'):>6} {row['seqlen']:>6} {row['batch']:>3} "
          f"{row['heads']:>3} | {fmt(t['fa3'], '6.1f')} {fmt(t['cudnn'], '6.1f')} {fmt(t['flash'], '6.1f')} | "
          f"{fmt(ratio(row, 'fa3', 'cudnn'), '6.2f')} {fmt(ratio(row, 'fa3', 'flash'), '6.2f')} | "
          f"{fmt(e.get('cudnn'), '9.2e')} {fmt(e.get('flash'), '9.2e')} | {row['fa3_kernel'] or '-'}", flush=True)
    for impl, res in row["impls"].items():
        if res["error"]:
            print(f"       {LABELS[impl]} n/a: {res['error'][:400]}", flush=True)
    for impl, nan in row["nan"].items():
        if nan:
            print(f"       {LABELS[impl]}: NaN in the output", flush=True)


def print_summary(rows):
    """Geometric-mean speedups over the rows where both ran: one number per baseline."""
    for other in ("cudnn", "flash"):
        rs = [r for r in (ratio(row, "fa3", other) for row in rows) if r]
        if rs:
            gm = math.exp(sum(map(math.log, rs)) / len(rs))
            print(f"# fa3 / {LABELS[other]}: geometric mean {gm:.2f} over {len(rs)} shapes "
                  f"(min {min(rs):.2f}, max {max(rs):.2f})")


def plot(rows, args, env, path):
    """One panel per (causal, d), TFLOP/s vs seqlen on a log2 axis, as in the FlashAttention-3 paper."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(args.causals), len(args.hdims), squeeze=False,
                             figsize=(4.2 * len(args.hdims), 3.4 * len(args.causals)))
    for ci, causal in enumerate(args.causals):
        for di, d in enumerate(args.hdims):
            ax = axes[ci][di]
            group = [r for r in rows if r["d"] == d and r["causal"] == causal]
            for impl in args.impls:
                pts = [(r["seqlen"], r["impls"][impl]["tflops"]) for r in group if r["impls"][impl]["tflops"]]
                if pts:
                    ax.plot(*zip(*pts), marker="o", color=COLORS[impl], label=LABELS[impl])
            ax.set_xscale("log", base=2)
            ax.set_xticks(args.seqlens)
            ax.set_xticklabels([f"{s // 1024}k" if s >= 1024 else str(s) for s in args.seqlens])
            ax.set_ylim(bottom=0)
            ax.grid(True, alpha=0.3)
            ax.set_title(f"head dim {d}, {'causal' if causal else 'non-causal'}")
            ax.set_xlabel("sequence length")
            ax.set_ylabel("TFLOP/s")
    # One legend for the figure: a panel may lack an implementation that refused its shapes.
    handles = [plt.Line2D([], [], marker="o", color=COLORS[i], label=LABELS[i]) for i in args.impls]
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), frameon=False)
    fig.suptitle(f"Attention forward, {args.dtype}, {env['gpu']} (torch {env['torch']}, cuDNN {env['cudnn']})")
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)


# -------------------------------------------------------------------------------------- main ----

def main(argv=None):
    args = parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        print("compare.py: no CUDA device visible", file=sys.stderr)
        return 2
    lib, lib_path = None, None
    if "fa3" in args.impls:
        try:
            lib = fa3_ctypes.load(args.lib)
            lib_path = lib._name
        except (OSError, RuntimeError) as e:
            print(f"compare.py: {e}", file=sys.stderr)
            return 2

    env = environment(torch, args, lib_path)
    l2 = l2_bytes(env)
    print_header(env, args)
    rows, checks, problems = [], [], []
    torch.set_grad_enabled(False)
    for d in args.hdims:
        for causal in args.causals:
            kept = None  # the longest seqlen's slices: the most accumulation, the hardest case
            for seqlen in args.seqlens:
                row, k = run_shape(torch, lib, args, shape_of(args, d, causal, seqlen), l2)
                rows.append(row)
                print_row(row)
                if k is not None and "fa3" in k["outs"]:
                    kept = k
                problems += [f"d={d} causal={int(causal)} seqlen={seqlen}: NaN in {LABELS[i]}'s output"
                             for i, nan in row["nan"].items() if nan]
                torch.cuda.empty_cache()  # 16k x 2048 bf16 is 64 MB a tensor: give it back per shape
            if kept is not None:
                errs = reference_check(torch, kept, causal, 1.0 / math.sqrt(d))
                ok = math.isfinite(errs["fa3"]) and errs["fa3"] <= MAX_REL_ERR
                checks.append({"d": d, "causal": causal, "seqlen": kept["seqlen"], "batch_index": 0,
                               "heads": REF_HEADS, "rel_err_vs_fp64": errs, "ok": ok})
                others = ", ".join(f"{LABELS[i]} {e:.2e}" for i, e in errs.items() if i != "fa3")
                print(f"  float64 check d={d} {'causal' if causal else 'non-causal'} seqlen={kept['seqlen']} "
                      f"(batch 0, heads 0-{REF_HEADS - 1}): fa3 {errs['fa3']:.2e}"
                      f"{' (' + others + ')' if others else ''} {'ok' if ok else 'FAIL > %.0e' % MAX_REL_ERR}",
                      flush=True)
                if not ok:
                    problems.append(f"d={d} causal={int(causal)}: fa3 rel err vs float64 {errs['fa3']:.3e}")
            elif "fa3" in args.impls:
                print(f"  float64 check d={d} {'causal' if causal else 'non-causal'}: skipped, fa3 never ran")
            kept = None
            torch.cuda.empty_cache()

    print_summary(rows)
    for p in problems:
        print(f"PROBLEM: {p}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"environment": env, "config": {k: v for k, v in vars(args).items()},
                       "rows": rows, "float64_checks": checks, "problems": problems}, f, indent=1)
        print(f"# wrote {args.json}")
    if args.png:
        plot(rows, args, env, args.png)
        print(f"# wrote {args.png}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
