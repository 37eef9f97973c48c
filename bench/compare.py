#!/usr/bin/env python3
"""fa3 forward vs PyTorch SDPA's cuDNN and FLASH (FlashAttention-2) backends, on the same tensors.

The sweep is the FlashAttention papers': 16k tokens in total (batch = tokens // seqlen), hidden 2048
(heads = hidden // d), head dims 64/128/256, causal off/on, seqlen 512..16k, bf16.  Each row also
checks fa3's output against cuDNN's and FA2's; once per (d, causal) a small slice is checked against
a float64 reference.  The run exits non-zero when fa3 is off by more than 1e-2 there or a NaN shows.

  python3 bench/compare.py                          # full sweep, table on stdout
  python3 bench/compare.py --quick --json r.json --png r.png
  python3 bench/compare.py --hdims 128 --seqlens 1k,8k --causal 1 --impls fa3,cudnn
  python3 bench/compare.py --extras --json r.json         # the sweep, then the extra rows
  python3 bench/compare.py --only-extras softcap,varlen   # only (some of) the extra rows

Extra rows (opt-in, their own tables after the sweep, key "extras" of the JSON): softcap 30 (fa3 with
vs without), head dims 192/128 (fa3 vs fa3 at 192/192, cuDNN/FA2 where SDPA takes d_v != d_qk) and
varlen (16 random lengths 256..4096: fa3 vs FA2's varlen kernel and vs fa3 dense at the mean length),
paged KV, FP8, attention sinks (fa3 with vs without). Each fa3 output there is checked against float64; their FLOPs count the visible (query, key) pairs
exactly: 2*pairs*(d_qk + d_v).

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
import random
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
PEER_MAX_REL_ERR = 2e-2  # fa3 vs cuDNN / FA2 (each within MAX_REL_ERR of float64): every sweep row
REF_HEADS = 2           # heads of batch element 0 checked against float64
TIME_BUDGET_MS = 10_000  # per impl and shape: a slow path (reference-gpu) gets fewer timed calls
COLORS = {"fa3": "C3", "cudnn": "C0", "flash": "C1"}  # the same colour in every panel
ERRORS = (RuntimeError, fa3_ctypes.Fa3Error, ValueError)  # a refusal or failure of one implementation

# Extra rows (--extras): fixed shapes, 16k tokens and hidden 2048 as the sweep unless said otherwise.
EXTRA_SECTIONS = ("softcap", "hdim192", "varlen", "paged", "fp8", "sinks")
FP8_HDIMS = (64, 128, 256)
# fa3's e4m3 forward vs float64 on the bf16 values it was quantized from (the inputs' quantization
# included: 4.8-5.7e-2 on the sweep's N(0, 1) inputs, 2026-12-01)
FP8_MAX_REL_ERR = 8e-2
FP8_BLOCK = 128   # fa3_quantize_fp8's block of tokens in the fp8 section
FP8_SEED = 2026   # of the rotation's signs
PAGE_SIZES = (16, 256)
PAGED_HDIMS = (128, 256)
EXTRA_SEQLENS = (4096, 16384)
SOFTCAP = 30.0
SOFTCAP_HDIMS = (64, 128, 256)
MLA_DQK, MLA_DV = 192, 128             # DeepSeek's head dims; heads = hidden // MLA_DV
VARLEN_SEQS, VARLEN_MIN, VARLEN_MAX, VARLEN_SEED = 16, 256, 4096, 0
VARLEN_HDIMS = (128, 64)


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
    ap.add_argument("--bwd", action="store_true",
                    help="after the forward sweep, the backward on the same shapes (compare_bwd.py's rows: fa3, "
                         "its deterministic mode, cuDNN, FA2), in the JSON and as panels of the PNG")
    ap.add_argument("--lib", default=None, metavar="PATH", help="libfa3.so (default $FA3_LIB or build/release)")
    ap.add_argument("--impls", default=",".join(IMPLS), help="subset of fa3,cudnn,flash")
    ap.add_argument("--timer", choices=("do_bench", "events"), default="do_bench",
                    help="do_bench: triton.testing.do_bench median (L2 flushed before every call; the method of "
                         "docs/anchors.md); events: back-to-back calls, CUDA events around each")
    ap.add_argument("--quick", action="store_true", help="seqlens 1k,4k,16k and head dims 64,128,256 only")
    ap.add_argument("--extras", nargs="?", const=",".join(EXTRA_SECTIONS), default=None, metavar="LIST",
                    help="after the sweep, run the extra rows: softcap, hdim192, varlen, paged, fp8, sinks (default: all); "
                         "they honour --causal, --dtype, --tokens, --hidden, --timer and --impls (peers)")
    ap.add_argument("--only-extras", nargs="?", const=",".join(EXTRA_SECTIONS), default=None, metavar="LIST",
                    help="run the extra rows only, no sweep (LIST as for --extras)")
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
    chosen = args.only_extras or args.extras
    args.extras = [x.strip() for x in chosen.split(",") if x.strip()] if chosen else []
    args.only_extras = args.only_extras is not None
    unknown = [x for x in args.extras if x not in EXTRA_SECTIONS]
    if unknown:
        ap.error(f"--extras/--only-extras: unknown {unknown}; choose from {','.join(EXTRA_SECTIONS)}")
    if args.extras and "fa3" not in args.impls:
        ap.error("--extras/--only-extras time fa3: keep fa3 in --impls")
    bad = [d for d in set(SOFTCAP_HDIMS + VARLEN_HDIMS + (MLA_DV,)) if args.extras and args.hidden % d]
    if bad:
        ap.error(f"--hidden {args.hidden} is not a multiple of the extra rows' head dims {sorted(bad)}")
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
    """4*b*h*s*s*d (QK^T and PV, 2 flops per MAC); causal counts the visible pairs, s(s+1)/2."""
    s = shape["seqlen"]
    return attn_flops(shape["batch"], shape["heads"], s, s, shape["d"], shape["d"], shape["causal"])


def make_input_sets(torch, shape, dtype, l2):
    """Enough independent (q, k, v) sets that cycling through them keeps each call's inputs out of L2.
    V has head dim shape["d_v"] where given (else d)."""
    b, s, h, d = shape["batch"], shape["seqlen"], shape["heads"], shape["d"]
    dv = shape.get("d_v", d)
    set_bytes = b * s * h * (2 * d + dv) * torch.empty((), dtype=dtype).element_size()
    n_sets = max(2, 4 * l2 // set_bytes + 1)
    gen = torch.Generator(device="cuda").manual_seed(0)  # same inputs on every run
    sets = []
    for _ in range(n_sets):
        q, k, v = (torch.randn(b, s, h, dd, dtype=dtype, device="cuda", generator=gen) for dd in (d, d, dv))
        sets.append({"q": q, "k": k, "v": v,
                     # SDPA wants [b, h, s, d]: views of the very same memory, no copies.
                     "qt": q.transpose(1, 2), "kt": k.transpose(1, 2), "vt": v.transpose(1, 2)})
    return sets


# ---------------------------------------------------------------------------- implementations ----

def fa3_calls(torch, lib, sets, causal, scale, **kw):
    """One prepared fa3_forward call per input set: the params are built outside the timed region.
    kw goes to fa3_ctypes.fwd_params (softcap, varlen's cu_seqlens_q/k, max_seqlen_q/k, page_table)."""
    outs = [s["q"].new_empty(s["q"].shape[:-1] + (s["v"].shape[-1],)) for s in sets]  # head dim of V
    params = [fa3_ctypes.fwd_params(lib, s["q"], s["k"], s["v"], o, causal=causal, softmax_scale=scale, **kw)
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


def error_text(e):
    """The first line of an exception's message."""
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def first_call(fn):
    """Runs fn once, turning a refusal into (None, reason); SDPA explains refusals through warnings."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            return fn(), None
        except ERRORS as e:
            return None, " | ".join([error_text(e)] + sdpa_reasons(caught))


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


def attention_fp64(torch, q, k, v, causal, scale, softcap=0.0, chunk=1024, sinks=None):
    """Plain softmax(scale QK^T) V in float64 on [s, h, d] slices, query rows in chunks so that the
    scores of a 16k sequence never sit in memory whole.  Causal is bottom-right aligned, like fa3;
    softcap > 0 maps the scaled scores s to softcap * tanh(s / softcap) before the mask; sinks [h]:
    one more logit per row, without a value."""
    q, k, v = (t.double().transpose(0, 1) for t in (q, k, v))  # [h, s, d]
    sq, sk = q.shape[1], k.shape[1]
    out = torch.empty(q.shape[0], sq, v.shape[2], dtype=torch.float64, device=q.device)
    cols = torch.arange(sk, device=q.device)
    for i0 in range(0, sq, chunk):
        i1 = min(sq, i0 + chunk)
        s = (q[:, i0:i1] @ k.transpose(1, 2)) * scale
        if softcap:
            s = softcap * torch.tanh(s / softcap)
        if causal:
            rows = torch.arange(i0, i1, device=q.device)[:, None] + (sk - sq)
            s.masked_fill_(cols[None, :] > rows, float("-inf"))
        if sinks is not None:
            sink = sinks.double()[:, None, None].expand(-1, i1 - i0, 1)
            out[:, i0:i1] = torch.softmax(torch.cat([s, sink], dim=-1), dim=-1)[..., :-1] @ v
            continue
        out[:, i0:i1] = torch.softmax(s, dim=-1) @ v
    return out.transpose(0, 1)


def reference_check(torch, kept, causal, scale, softcap=0.0, sinks=None):
    """Every implementation's slice vs float64: fa3's number decides, the others give the scale."""
    q, k, v = kept["inputs"]
    ref = attention_fp64(torch, q, k, v, causal, scale, softcap, sinks=sinks)
    return {impl: rel_err(torch, o, ref) for impl, o in kept["outs"].items()}


# ----------------------------------------------------------------------------------- one row ----

def measure(torch, args, calls):
    """Probes calls[0] (a refusal becomes res["error"], never an exception), then times all the calls
    with args.timer.  Returns (res, what calls[0] returned, or None after an error)."""
    res = {"ms": None, "tflops": None, "reps": 0, "error": None}
    try:
        first, err = first_call(calls[0])
        if err is not None:
            res["error"] = err
            return res, None
        torch.cuda.synchronize()  # an asynchronous failure shows here, charged to this impl
        timer = time_do_bench if args.timer == "do_bench" else time_calls
        res["ms"], res["reps"] = timer(torch, calls, args.warmup_ms, args.rep)
    except ERRORS as e:
        res["error"] = error_text(e)
        return res, None
    return res, first


def run_fa3(torch, lib, args, sets, causal, scale, **kw):
    """fa3 on every set (kw: see fa3_calls).  Returns (result, O of set 0 or None, kernel name or None)."""
    try:
        calls, out, kname = fa3_calls(torch, lib, sets, causal, scale, **kw)
    except ERRORS as e:  # fa3 refused the arguments (workspace size, kernel name)
        return {"ms": None, "tflops": None, "reps": 0, "error": error_text(e)}, None, None
    res, _ = measure(torch, args, calls)
    return res, (None if res["error"] else out), kname


def run_sdpa(torch, args, impl, sets, causal, scale):
    """One SDPA backend ("cudnn" or "flash") on every set.  Returns (result, O of set 0 as [b, s, h, d] or None)."""
    # SDPA would silently fall back to another backend: pin the one under test for the whole run.
    with torch.nn.attention.sdpa_kernel(sdpa_backend(torch, impl)):
        res, out = measure(torch, args, sdpa_calls(torch, sets, causal, scale))
    return res, (None if out is None else out.transpose(1, 2))  # back to [b, s, h, d]


def run_impl(torch, lib, args, impl, sets, causal, scale):
    """Probes one implementation on set 0, then times it over all sets.

    Returns (result, O of set 0 as [b, s, h, d] or None, fa3 kernel name or None).  A refusal (SDPA
    has no kernel for the shape, fa3 returns an error) becomes result["error"], never an exception.
    """
    if impl == "fa3":
        return run_fa3(torch, lib, args, sets, causal, scale)
    res, out = run_sdpa(torch, args, impl, sets, causal, scale)
    return res, out, None


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


def env_line(env):
    return (f"# fa3 vs SDPA cuDNN / FLASH (FA2) forward | {env['gpu']} (sm_{env['compute_capability'].replace('.', '')}, "
            f"{env['sm_count']} SMs) | torch {env['torch']}, CUDA {env['cuda']}, cuDNN {env['cudnn']} | "
            f"{env['date_utc']}")


def print_header(env, args):
    print(env_line(env))
    timing = ("triton do_bench's median (L2 flushed before each call)" if args.timer == "do_bench"
              else f"median of up to {args.rep} back-to-back calls (CUDA events)")
    print(f"# {args.dtype}, tokens {args.tokens}, hidden {args.hidden}, {timing}, "
          f"inputs rotated over > 4x L2; TFLOP/s = 4*b*h*s^2*d/t (causal: the s(s+1)/2 visible pairs); "
          f"err = ||fa3-x||/||x||")
    print(f"{'d':>4} {'causal':>6} {'seqlen':>6} {'b':>3} {'h':>3} | {'fa3':>6} {'cuDNN':>6} {'FA2':>6} | "
          f"{'/cuDNN':>6} {'/FA2':>6} | {'err/cuDNN':>9} {'err/FA2':>9} | kernel")


def print_row(row):
    t = {i: row["impls"].get(i, {}).get("tflops") for i in IMPLS}
    e = row["rel_err_vs"]
    print(f"{row['d']:>4} {('yes' if row['causal'] else 'no'):>6} {row['seqlen']:>6} {row['batch']:>3} "
          f"{row['heads']:>3} | {fmt(t['fa3'], '6.1f')} {fmt(t['cudnn'], '6.1f')} {fmt(t['flash'], '6.1f')} | "
          f"{fmt(ratio(row, 'fa3', 'cudnn'), '6.2f')} {fmt(ratio(row, 'fa3', 'flash'), '6.2f')} | "
          f"{fmt(e.get('cudnn'), '9.2e')} {fmt(e.get('flash'), '9.2e')} | {row['fa3_kernel'] or '-'}", flush=True)
    print_row_problems(row, LABELS)


def print_row_problems(row, labels):
    """The errors (n/a with the reason) and NaN outputs of one row's implementations."""
    for impl, res in row["impls"].items():
        if res["error"]:
            print(f"       {labels[impl]} n/a: {res['error'][:400]}", flush=True)
    for impl, nan in row["nan"].items():
        if nan:
            print(f"       {labels[impl]}: NaN in the output", flush=True)


def print_summary(rows):
    """Geometric-mean speedups over the rows where both ran: one number per baseline."""
    for other in ("cudnn", "flash"):
        rs = [r for r in (ratio(row, "fa3", other) for row in rows) if r]
        if rs:
            gm = math.exp(sum(map(math.log, rs)) / len(rs))
            print(f"# fa3 / {LABELS[other]}: geometric mean {gm:.2f} over {len(rs)} shapes "
                  f"(min {min(rs):.2f}, max {max(rs):.2f})")


def plot_sections(sections, args, env, path):
    """One panel per (causal, d), TFLOP/s vs seqlen on a log2 axis, as in the FlashAttention-3 paper, for
    each section ({rows, impls, labels, colors, what}: the forward sweep, compare_bwd.py's backward
    rows), one row of panels per (section, causal)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n_rows = len(sections) * len(args.causals)
    fig, axes = plt.subplots(n_rows, len(args.hdims), squeeze=False,
                             figsize=(4.2 * len(args.hdims), 3.4 * n_rows))
    handles = {}
    for si, sec in enumerate(sections):
        for ci, causal in enumerate(args.causals):
            for di, d in enumerate(args.hdims):
                ax = axes[si * len(args.causals) + ci][di]
                group = [r for r in sec["rows"] if r["d"] == d and r["causal"] == causal]
                for impl in sec["impls"]:
                    pts = [(r["seqlen"], r["impls"][impl]["tflops"]) for r in group if r["impls"][impl]["tflops"]]
                    if pts:
                        ax.plot(*zip(*pts), marker="o", color=sec["colors"][impl], label=sec["labels"][impl])
                    # One legend for the figure: a panel may lack an implementation that refused its shapes.
                    handles.setdefault(sec["labels"][impl], sec["colors"][impl])
                ax.set_xscale("log", base=2)
                ax.set_xticks(args.seqlens)
                ax.set_xticklabels([f"{s // 1024}k" if s >= 1024 else str(s) for s in args.seqlens])
                ax.set_ylim(bottom=0)
                ax.grid(True, alpha=0.3)
                ax.set_title(f"{sec['what']}, head dim {d}, {'causal' if causal else 'non-causal'}")
                ax.set_xlabel("sequence length")
                ax.set_ylabel("TFLOP/s")
    lines = [plt.Line2D([], [], marker="o", color=c, label=label) for label, c in handles.items()]
    fig.legend(handles=lines, loc="lower center", ncol=len(lines), frameon=False)
    what = " and ".join(sec["what"] for sec in sections)
    fig.suptitle(f"Attention {what}, {args.dtype}, {env['gpu']} (torch {env['torch']}, cuDNN {env['cudnn']})")
    fig.tight_layout(rect=(0, 0.04 if n_rows > 2 else 0.05, 1, 1))
    fig.savefig(path, dpi=120)
    plt.close(fig)


# -------------------------------------------------------------------------------- extra rows ----
# Opt-in (--extras / --only-extras): features of the Hopper kernel beyond the sweep, each against a
# plain fa3 run that sets the bar (and the SDPA peers where they can run the same problem).

# Per section: the title, the TFLOP/s columns (row key, header) and the ratios (num, den, goal, header).
EXTRA_SPECS = {
    "softcap": {
        "title": f"softcap {SOFTCAP:g} (scaled scores s -> {SOFTCAP:g}*tanh(s/{SOFTCAP:g})): fa3 with vs without "
                 "on the same inputs and FLOPs; cuDNN without softcap (SDPA has none), for scale",
        "columns": (("fa3_softcap", "fa3+cap"), ("fa3", "fa3"), ("cudnn", "cuDNN")),
        "ratios": (("fa3_softcap", "fa3", 0.90, "cap/plain"),),
    },
    "hdim192": {
        "title": f"head dims qk {MLA_DQK} / v {MLA_DV}: fa3 vs fa3 at {MLA_DQK}/{MLA_DQK} (own inputs), and cuDNN / "
                 "FA2 through SDPA where they take d_v != d_qk",
        "columns": (("fa3", "fa3"), ("fa3_192", "fa3 192"), ("cudnn", "cuDNN"), ("flash", "FA2")),
        "ratios": (("fa3", "fa3_192", 0.90, "/192x192"), ("fa3", "cudnn", None, "/cuDNN")),
    },
    "varlen": {
        "title": f"varlen, {VARLEN_SEQS} sequences of random lengths {VARLEN_MIN}-{VARLEN_MAX} (seed {VARLEN_SEED}, "
                 "cu_seqlens_q = cu_seqlens_k): fa3 vs FA2 varlen (aten._flash_attention_forward), and vs dense "
                 "batches at the mean length",
        "columns": (("fa3_varlen", "fa3 vl"), ("fa2_varlen", "FA2 vl"), ("fa3_dense", "fa3 mean"),
                    ("fa3_varlen_eq", "fa3 vl=mn"), ("cudnn_dense", "cuDNN mn")),
        # vl=mn: the dense batches passed as varlen (equal lengths): what the varlen path itself costs,
        # apart from the lengths' spread.
        "ratios": (("fa3_varlen", "fa2_varlen", 1.8, "/FA2 vl"), ("fa3_varlen", "fa3_dense", 0.90, "/dense"),
                   ("fa3_varlen_eq", "fa3_dense", None, "vl=mn/dense")),
    },
    "fp8": {
        "title": "FP8 (e4m3 Q/K/V quantized per (batch, kv head) from the bf16 inputs, descales as "
                 "FlashAttention-3's, bf16 O): fa3 e4m3 vs fa3 and cuDNN in bf16 on the same values",
        "columns": (("fa3_fp8", "fa3 fp8"), ("fa3_fp8_block", "fp8 blk"), ("fa3_fp8_cap", "fp8+cap"),
                    ("fa3", "fa3 bf16"), ("cudnn", "cuDNN")),
        # fp8 blk: fa3_quantize_fp8's blocks of 128 tokens, Q and K rotated (incoherent processing);
        # fp8+cap: the per-head e4m3 inputs with softcap SOFTCAP (against float64 with it).
        "ratios": (("fa3_fp8", "fa3", None, "fp8/bf16"), ("fa3_fp8", "cudnn", None, "fp8/cuDNN"),
                   ("fa3_fp8_block", "fa3_fp8", 0.97, "blk/head"), ("fa3_fp8_cap", "fa3_fp8", None, "cap/fp8")),
    },
    "sinks": {
        "title": "attention sinks (gpt-oss: a logit per head joining each row's softmax sum, here "
                 "linspace(-2, 4)): fa3 with vs without on the same inputs and FLOPs",
        "columns": (("fa3_sinks", "fa3+sink"), ("fa3", "fa3"), ("cudnn", "cuDNN")),
        "ratios": (("fa3_sinks", "fa3", 0.98, "sink/plain"),),
    },
    "paged": {
        "title": f"paged KV cache (pages of {' and '.join(map(str, PAGE_SIZES))} rows, shuffled; the same keys and "
                 "values): fa3 paged vs fa3 on contiguous K/V",
        "columns": (("fa3", "fa3"),) + tuple((f"fa3_paged{n}", f"paged{n}") for n in PAGE_SIZES),
        "ratios": tuple((f"fa3_paged{n}", "fa3", 0.90, f"p{n}/contig") for n in PAGE_SIZES),
    },
}
EXTRA_LABELS = {
    "fa3": "fa3", "fa3_softcap": f"fa3 softcap {SOFTCAP:g}", "fa3_192": f"fa3 d{MLA_DQK}/{MLA_DQK}",
    "fa3_varlen": "fa3 varlen", "fa3_dense": "fa3 dense at the mean length",
    "cudnn": LABELS["cudnn"], "flash": LABELS["flash"], "cudnn_dense": "cuDNN (SDPA) dense at the mean length",
    "fa2_varlen": "FA2 varlen", "fa3_varlen_eq": "fa3 varlen at equal lengths (the dense batches packed)",
    **{f"fa3_paged{n}": f"fa3 paged, pages of {n}" for n in PAGE_SIZES},
    "fa3_fp8": "fa3 e4m3", "fa3_sinks": "fa3 with attention sinks",
    "fa3_fp8_block": "fa3 e4m3, block descales and rotated Q/K (fa3_quantize_fp8)",
    "fa3_fp8_cap": "fa3 e4m3 with softcap (per-head descales)",
}


def nan_high(x):
    """Sort key that ranks NaN above everything: the worst of several errors."""
    return math.inf if math.isnan(x) else x


def visible_pairs(sq, sk, causal):
    """The (query, key) pairs that take part; causal is bottom-right aligned as in fa3: query i sees
    keys j <= i + sk - sq."""
    if not causal:
        return sq * sk
    if sq <= sk:  # every row sees sk - sq + 1 keys and one more per row: a closed form
        return sq * (sk - sq) + sq * (sq + 1) // 2
    return sum(min(sk, max(0, i + sk - sq + 1)) for i in range(sq))


def attn_flops(batch, heads, sq, sk, d_qk, d_v, causal):
    """2 flops per multiply-add: QK^T costs 2*d_qk per visible pair, PV 2*d_v."""
    return 2 * batch * heads * visible_pairs(sq, sk, causal) * (d_qk + d_v)


def varlen_lengths():
    """The varlen rows' sequence lengths: the same for every implementation and every run."""
    rng = random.Random(VARLEN_SEED)
    return [rng.randint(VARLEN_MIN, VARLEN_MAX) for _ in range(VARLEN_SEQS)]


def new_extra_row(section, case, **fields):
    return dict(section=section, case=case, **fields, impls={}, flops={}, kernels={}, nan={}, rel_err_vs_fp64={})


def record(torch, row, key, res, out, flops_, kname=None):
    """Stores one run in an extra row; its TFLOP/s come from its own FLOPs."""
    if res["ms"] is not None:
        res["tflops"] = flops_ / (res["ms"] * 1e-3) / 1e12
    row["impls"][key], row["flops"][key] = res, flops_
    if kname:
        row["kernels"][key] = kname
    if out is not None:
        row["nan"][key] = has_nan(torch, out)


def dense_check(torch, row, s0, outs, causal, scale, softcap=0.0, sinks=None):
    """float64 check of batch 0, heads 0..REF_HEADS-1 of input set s0; outs: {key: O [b, s, h, d_v] or None}."""
    kept = {"inputs": [s0[n][0, :, :REF_HEADS] for n in ("q", "k", "v")],
            "outs": {key: o[0, :, :REF_HEADS] for key, o in outs.items() if o is not None}}
    if kept["outs"]:
        row["rel_err_vs_fp64"].update(reference_check(torch, kept, causal, scale, softcap,
                                                      None if sinks is None else sinks[:REF_HEADS]))


def varlen_check(torch, row, s0, cu_host, outs, causal, scale, seqs):
    """float64 check of sequences `seqs` (heads 0..REF_HEADS-1) of the packed set s0; the worst error per run."""
    for i in seqs:
        r0, r1 = cu_host[i], cu_host[i + 1]
        kept = {"inputs": [s0[n][r0:r1, :REF_HEADS] for n in ("q", "k", "v")],
                "outs": {key: o[r0:r1, :REF_HEADS] for key, o in outs.items() if o is not None}}
        if not kept["outs"]:
            return
        for key, e in reference_check(torch, kept, causal, scale).items():
            errs = row["rel_err_vs_fp64"]
            errs[key] = max(errs.get(key, 0.0), e, key=nan_high)


def run_fa2_varlen(torch, args, sets, cu, max_len, causal, scale):
    """FlashAttention-2's varlen forward as PyTorch ships it (aten._flash_attention_forward, the kernel
    behind SDPA's FLASH backend) on packed [total, h, d] sets.  A missing op or a signature other than
    (q, k, v, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, return_debug_mask, *, scale)
    becomes res["error"], with the schema this torch has."""
    try:
        op = torch.ops.aten._flash_attention_forward
    except (AttributeError, RuntimeError) as e:
        return {"ms": None, "tflops": None, "reps": 0, "error": f"aten._flash_attention_forward: {error_text(e)}"}, None
    schema = getattr(getattr(op, "default", None), "_schema", "?")

    def call(s):
        try:
            return op(s["q"], s["k"], s["v"], cu, cu, max_len, max_len, 0.0, causal, False, scale=scale)[0]
        except TypeError as e:  # the binding's complaint about the arguments
            raise RuntimeError(f"aten._flash_attention_forward: {error_text(e)}") from None

    res, out = measure(torch, args, [lambda s=s: call(s) for s in sets])
    if res["error"]:
        res["error"] += f" | schema: {schema}"
    return res, out


def extra_softcap(torch, lib, args, l2, dtype, d, causal, seqlen):
    """fa3 with softcap vs fa3 without on the sweep's shape (and cuDNN without, for scale)."""
    shape = shape_of(args, d, causal, seqlen)
    b, h = shape["batch"], shape["heads"]
    row = new_extra_row("softcap", f"d{d} {seqlen // 1024}k{' causal' if causal else ''}", d=d, d_v=d,
                        causal=causal, seqlen=seqlen, batch=b, heads=h, softcap=SOFTCAP)
    scale, f = 1.0 / math.sqrt(d), attn_flops(b, h, seqlen, seqlen, d, d, causal)
    sets = make_input_sets(torch, shape, dtype, l2)
    res, out, kname = run_fa3(torch, lib, args, sets, causal, scale, softcap=SOFTCAP)
    record(torch, row, "fa3_softcap", res, out, f, kname)
    dense_check(torch, row, sets[0], {"fa3_softcap": out}, causal, scale, SOFTCAP)
    plain_fa3_and_cudnn(torch, lib, args, row, sets, causal, scale, f)
    return row


def extra_sinks(torch, lib, args, l2, dtype, d, causal, seqlen):
    """fa3 with attention sinks vs fa3 without on the sweep's shape (the sinks join each row once, after
    its last key block: the goal is no measurable cost)."""
    shape = shape_of(args, d, causal, seqlen)
    b, h = shape["batch"], shape["heads"]
    row = new_extra_row("sinks", f"d{d} {seqlen // 1024}k{' causal' if causal else ''}", d=d, d_v=d,
                        causal=causal, seqlen=seqlen, batch=b, heads=h)
    scale, f = 1.0 / math.sqrt(d), attn_flops(b, h, seqlen, seqlen, d, d, causal)
    sets = make_input_sets(torch, shape, dtype, l2)
    sinks = torch.linspace(-2.0, 4.0, h, device="cuda", dtype=torch.float32)
    res, out, kname = run_fa3(torch, lib, args, sets, causal, scale, sinks=sinks)
    record(torch, row, "fa3_sinks", res, out, f, kname)
    dense_check(torch, row, sets[0], {"fa3_sinks": out}, causal, scale, sinks=sinks)
    plain_fa3_and_cudnn(torch, lib, args, row, sets, causal, scale, f)
    return row


def plain_fa3_and_cudnn(torch, lib, args, row, sets, causal, scale, f):
    """The rows' reference columns: fa3 and cuDNN on the plain problem (no softcap, 16-bit inputs),
    timed and checked against float64."""
    res, out, kname = run_fa3(torch, lib, args, sets, causal, scale)
    record(torch, row, "fa3", res, out, f, kname)
    plain = {"fa3": out}
    if "cudnn" in args.impls:
        res, plain["cudnn"] = run_sdpa(torch, args, "cudnn", sets, causal, scale)
        record(torch, row, "cudnn", res, plain["cudnn"], f)
    dense_check(torch, row, sets[0], plain, causal, scale)


def extra_hdim192(torch, lib, args, l2, dtype, causal, seqlen):
    """d_qk 192 / d_v 128 vs fa3 at 192/192, with cuDNN and FA2 through SDPA where they accept it."""
    b, h = max(1, args.tokens // seqlen), args.hidden // MLA_DV
    shape = {"d": MLA_DQK, "d_v": MLA_DV, "causal": causal, "seqlen": seqlen, "batch": b, "heads": h}
    row = new_extra_row("hdim192", f"{seqlen // 1024}k{' causal' if causal else ''}", **shape)
    scale = 1.0 / math.sqrt(MLA_DQK)
    sets = make_input_sets(torch, shape, dtype, l2)
    f = attn_flops(b, h, seqlen, seqlen, MLA_DQK, MLA_DV, causal)
    res, out, kname = run_fa3(torch, lib, args, sets, causal, scale)
    record(torch, row, "fa3", res, out, f, kname)
    outs = {"fa3": out}
    for impl in ("cudnn", "flash"):
        if impl in args.impls:
            res, outs[impl] = run_sdpa(torch, args, impl, sets, causal, scale)
            record(torch, row, impl, res, outs[impl], f)
    dense_check(torch, row, sets[0], outs, causal, scale)
    del sets, outs, out  # the 192/192 bar on its own inputs
    sets = make_input_sets(torch, dict(shape, d_v=MLA_DQK), dtype, l2)
    res, out, kname = run_fa3(torch, lib, args, sets, causal, scale)
    record(torch, row, "fa3_192", res, out, attn_flops(b, h, seqlen, seqlen, MLA_DQK, MLA_DQK, causal), kname)
    dense_check(torch, row, sets[0], {"fa3_192": out}, causal, scale)
    return row


def extra_varlen(torch, lib, args, l2, dtype, d, causal):
    """fa3 varlen vs FA2 varlen on packed [total, h, d] tensors, and fa3 / cuDNN dense at the mean length."""
    lengths = varlen_lengths()
    n, h, total = len(lengths), args.hidden // d, sum(lengths)
    mean, longest = round(total / n), max(lengths)
    cu_host = [0] + list(itertools.accumulate(lengths))
    cu = torch.tensor(cu_host, dtype=torch.int32, device="cuda")
    row = new_extra_row("varlen", f"d{d}{' causal' if causal else ''}", d=d, d_v=d, causal=causal, batch=n,
                        heads=h, seqlens=lengths, total=total, mean_seqlen=mean, fp64_sequences=[0, n - 1])
    scale = 1.0 / math.sqrt(d)
    # Packed sets: batch 0 of [1, total, h, d] sets, so that L2 rotation works as for the sweep.
    sets = [{name: s[name][0] for name in ("q", "k", "v")}
            for s in make_input_sets(torch, {"batch": 1, "seqlen": total, "heads": h, "d": d}, dtype, l2)]
    f = sum(attn_flops(1, h, s, s, d, d, causal) for s in lengths)
    res, out, kname = run_fa3(torch, lib, args, sets, causal, scale, cu_seqlens_q=cu, cu_seqlens_k=cu,
                              max_seqlen_q=longest, max_seqlen_k=longest)
    record(torch, row, "fa3_varlen", res, out, f, kname)
    outs = {"fa3_varlen": out}
    if "flash" in args.impls:
        res, outs["fa2_varlen"] = run_fa2_varlen(torch, args, sets, cu, longest, causal, scale)
        record(torch, row, "fa2_varlen", res, outs["fa2_varlen"], f)
    varlen_check(torch, row, sets[0], cu_host, outs, causal, scale, row["fp64_sequences"])
    del sets, outs, out  # dense batches at the mean length
    dense = {"batch": n, "seqlen": mean, "heads": h, "d": d}
    sets = make_input_sets(torch, dense, dtype, l2)
    fd = attn_flops(n, h, mean, mean, d, d, causal)
    res, out, kname = run_fa3(torch, lib, args, sets, causal, scale)
    record(torch, row, "fa3_dense", res, out, fd, kname)
    outs = {"fa3_dense": out}
    # The same batches as packed sequences of equal length: only the varlen machinery differs.
    packed = [{name: st[name].reshape(1, n * mean, h, d)[0] for name in ("q", "k", "v")} for st in sets]
    cu_eq = torch.arange(0, n * mean + 1, mean, dtype=torch.int32, device="cuda")
    res, out_eq, kname = run_fa3(torch, lib, args, packed, causal, scale, cu_seqlens_q=cu_eq, cu_seqlens_k=cu_eq,
                                 max_seqlen_q=mean, max_seqlen_k=mean)
    record(torch, row, "fa3_varlen_eq", res, out_eq, fd, kname)
    if out_eq is not None and out is not None:  # the dense run's math: agreement is information, not a check
        row["varlen_eq_vs_dense_rel_err"] = rel_err(torch, out_eq.reshape(out.shape), out)
    del packed, out_eq
    if "cudnn" in args.impls:
        res, outs["cudnn_dense"] = run_sdpa(torch, args, "cudnn", sets, causal, scale)
        record(torch, row, "cudnn_dense", res, outs["cudnn_dense"], fd)
    dense_check(torch, row, sets[0], outs, causal, scale)
    return row


def paged_sets(torch, sets, page):
    """Each set's K and V as a page pool [pages, page, h, d] shuffled by one permutation, and the
    page table [b, s / page] every set shares."""
    b, s = sets[0]["k"].shape[:2]
    n = b * s // page
    perm = torch.randperm(n, device="cuda", generator=torch.Generator(device="cuda").manual_seed(page))
    out = []
    for st in sets:
        paged = dict(st)
        for name in ("k", "v"):
            t = st[name]
            pool = torch.empty((n, page) + tuple(t.shape[2:]), dtype=t.dtype, device=t.device)
            pool[perm] = t.reshape(n, page, *t.shape[2:])
            paged[name] = pool
        out.append(paged)
    return out, perm.to(torch.int32).reshape(b, s // page).contiguous()


def extra_paged(torch, lib, args, l2, dtype, d, causal, seqlen):
    """fa3 on a paged copy of the sweep's K/V (pages shuffled) vs fa3 on the contiguous tensors."""
    shape = shape_of(args, d, causal, seqlen)
    b, h = shape["batch"], shape["heads"]
    row = new_extra_row("paged", f"d{d} {seqlen // 1024}k{' causal' if causal else ''}", d=d, d_v=d, causal=causal,
                        seqlen=seqlen, batch=b, heads=h, page_sizes=list(PAGE_SIZES))
    scale, f = 1.0 / math.sqrt(d), attn_flops(b, h, seqlen, seqlen, d, d, causal)
    sets = make_input_sets(torch, shape, dtype, l2)
    res, out, kname = run_fa3(torch, lib, args, sets, causal, scale)
    record(torch, row, "fa3", res, out, f, kname)
    outs = {"fa3": out}
    for page in PAGE_SIZES:
        psets, table = paged_sets(torch, sets, page)
        res, pout, pname = run_fa3(torch, lib, args, psets, causal, scale, page_table=table)
        record(torch, row, f"fa3_paged{page}", res, pout, f, pname)
        outs[f"fa3_paged{page}"] = pout
        if pout is not None and out is not None:  # the same math as contiguous: agreement is information
            row.setdefault("paged_vs_contiguous_rel_err", {})[str(page)] = rel_err(torch, pout, out)
        del psets
    dense_check(torch, row, sets[0], outs, causal, scale)
    return row


def quantize_e4m3(torch, x):
    """x [b, s, h, d] -> (e4m3 x / scale, scale float32 [b, h]): one scale per (batch, head), amax -> 448."""
    amax = x.abs().amax(dim=(1, 3)).float().clamp_min(1e-12)
    scale = amax / 448.0
    q = (x.float() / scale[:, None, :, None]).to(torch.float8_e4m3fn)
    return q, scale.contiguous()


def extra_fp8(torch, lib, args, l2, dtype, d, causal, seqlen):
    """fa3's e4m3 forward on the sweep's inputs quantized per (batch, head), vs fa3 and cuDNN in bf16."""
    shape = shape_of(args, d, causal, seqlen)
    b, h = shape["batch"], shape["heads"]
    row = new_extra_row("fp8", f"d{d} {seqlen // 1024}k{' causal' if causal else ''}", d=d, d_v=d, causal=causal,
                        seqlen=seqlen, batch=b, heads=h)
    scale, f = 1.0 / math.sqrt(d), attn_flops(b, h, seqlen, seqlen, d, d, causal)
    sets = make_input_sets(torch, shape, dtype, l2)
    plain_fa3_and_cudnn(torch, lib, args, row, sets, causal, scale, f)
    fp8_sets, block_sets = [], []
    for st in sets:
        q8, qb = {}, {}
        for name in ("q", "k", "v"):
            q8[name], q8[name + "_descale"] = quantize_e4m3(torch, st[name])
            qb[name], qb[name + "_block"] = fa3_ctypes.quantize_fp8(lib, st[name], FP8_BLOCK, hadamard=name != "v",
                                                                   seed=FP8_SEED)
        fp8_sets.append(q8)
        block_sets.append(qb)
    s0 = sets[0]
    del sets
    stream = torch.cuda.current_stream().cuda_stream
    kept = {"inputs": [s0[n][0, :, :REF_HEADS] for n in ("q", "k", "v")], "outs": {}}
    capped = {}
    for key, qsets in (("fa3_fp8", fp8_sets), ("fa3_fp8_block", block_sets), ("fa3_fp8_cap", fp8_sets)):
        outs8 = [torch.empty(s["q"].shape, dtype=torch.bfloat16, device="cuda") for s in qsets]
        if key != "fa3_fp8_block":
            params = [fa3_ctypes.fwd_params(lib, s["q"], s["k"], s["v"], o, causal=causal, softmax_scale=scale,
                                            softcap=SOFTCAP if key == "fa3_fp8_cap" else 0.0,
                                            q_descale=s["q_descale"], k_descale=s["k_descale"],
                                            v_descale=s["v_descale"]) for s, o in zip(qsets, outs8)]
        else:
            params = [fa3_ctypes.fwd_params(lib, s["q"], s["k"], s["v"], o, causal=causal, softmax_scale=scale,
                                            block_descales={n: (s[n + "_block"], FP8_BLOCK) for n in "qkv"})
                      for s, o in zip(qsets, outs8)]
        try:
            kname = fa3_ctypes.kernel_name(lib, params[0])
            res, out8 = measure(torch, args, [lambda p=p: fa3_ctypes.run_forward(lib, p, stream) for p in params])
            out8 = outs8[0] if res["error"] is None else None
        except ERRORS as e:
            res, out8, kname = {"ms": None, "tflops": None, "reps": 0, "error": error_text(e)}, None, None
        record(torch, row, key, res, out8, f, kname)
        if out8 is not None:  # against float64 attention on the bf16 values (input quantization included)
            (capped if key == "fa3_fp8_cap" else kept["outs"])[key] = out8[0, :, :REF_HEADS]
        del params, outs8
    if kept["outs"]:
        row["rel_err_vs_fp64"].update(reference_check(torch, kept, causal, scale))
    if capped:
        row["rel_err_vs_fp64"].update(reference_check(torch, {"inputs": kept["inputs"], "outs": capped}, causal,
                                                      scale, softcap=SOFTCAP))
    return row


EXTRA_RUNNERS = {"softcap": extra_softcap, "hdim192": extra_hdim192, "varlen": extra_varlen, "paged": extra_paged,
                 "fp8": extra_fp8, "sinks": extra_sinks}


def extra_cases(section, args):
    """The argument tuples of one section's rows (after torch, lib, args, l2, dtype), in print order."""
    if section in ("softcap", "sinks"):
        return [(d, c, s) for d in SOFTCAP_HDIMS for c in args.causals for s in EXTRA_SEQLENS]
    if section == "hdim192":
        return [(c, s) for c in args.causals for s in EXTRA_SEQLENS]
    if section == "paged":
        return [(d, c, s) for d in PAGED_HDIMS for c in args.causals for s in EXTRA_SEQLENS]
    if section == "fp8":
        return [(d, c, s) for d in FP8_HDIMS for c in args.causals for s in EXTRA_SEQLENS]
    return [(d, c) for d in VARLEN_HDIMS for c in args.causals]


def extra_problems(row):
    """What fails an extra row: fa3 refused or failed, a NaN in any output, fa3 off float64 by > MAX_REL_ERR."""
    where = f"extras {row['section']} {row['case']}"
    out = [f"{where}: {EXTRA_LABELS[k]} failed: {res['error'][:300]}"
           for k, res in row["impls"].items() if k.startswith("fa3") and res["error"]]
    out += [f"{where}: NaN in {EXTRA_LABELS[k]}'s output" for k, nan in row["nan"].items() if nan]
    out += [f"{where}: {EXTRA_LABELS[k]} rel err vs float64 {e:.3e}" for k, e in row["rel_err_vs_fp64"].items()
            if k.startswith("fa3") and not (math.isfinite(e) and e <= (FP8_MAX_REL_ERR if "fp8" in k else MAX_REL_ERR))]
    row["ok"] = not out
    return out


def print_extra_header(section):
    spec = EXTRA_SPECS[section]
    goals = ", ".join(f"{name} >= {goal:.2f}" for _, _, goal, name in spec["ratios"] if goal)
    print(f"\n## {spec['title']}")
    print(f"# TFLOP/s = 2*pairs*(d_qk+d_v)/t (causal: visible pairs); goals: {goals}; "
          f"err = worst fa3 ||fa3-ref||/||ref|| vs float64")
    cols = " ".join(f"{name:>8}" for _, name in spec["columns"])
    rats = " ".join(f"{name:>9}" for *_, name in spec["ratios"])
    print(f"{'case':<15} {'b':>3} {'h':>3} | {cols} | {rats} | {'err':>8} {'':4} | kernel")


def print_extra_row(row):
    spec = EXTRA_SPECS[row["section"]]
    cols = " ".join(fmt(row["impls"].get(key, {}).get("tflops"), "8.1f") for key, _ in spec["columns"])
    rats = " ".join(fmt(ratio(row, num, den), "9.2f") for num, den, *_ in spec["ratios"])
    errs = [e for key, e in row["rel_err_vs_fp64"].items() if key.startswith("fa3")]
    worst = max(errs, key=nan_high) if errs else None
    kernels = sorted(set(row["kernels"].values()))
    kernel = kernels[0] if len(kernels) == 1 else \
        ", ".join(f"{EXTRA_LABELS[k]}: {v}" for k, v in row["kernels"].items()) or "-"
    print(f"{row['case']:<15} {row['batch']:>3} {row['heads']:>3} | {cols} | {rats} | {fmt(worst, '8.2e')} "
          f"{'ok' if row['ok'] else 'FAIL':4} | {kernel}", flush=True)
    print_row_problems(row, EXTRA_LABELS)


def print_extras_summary(rows):
    """One line per ratio of each section: geometric mean, worst case, how many rows meet the goal."""
    print("\n# extras summary (TFLOP/s ratios over the rows where both ran)")
    print(f"{'section':<8} {'ratio':<46} {'n':>2} {'gmean':>6} {'min':>6} {'goal':>5} {'met':>5}  worst case")
    for section in EXTRA_SECTIONS:
        srows = [r for r in rows if r["section"] == section]
        if not srows:
            continue
        for num, den, goal, _ in EXTRA_SPECS[section]["ratios"]:
            vals = [(ratio(r, num, den), r["case"]) for r in srows]
            vals = [(x, case) for x, case in vals if x]
            what = f"{EXTRA_LABELS[num]} / {EXTRA_LABELS[den]}"
            if not vals:
                print(f"{section:<8} {what:<46} {0:>2} {'n/a':>6}")
                continue
            gm = math.exp(sum(math.log(x) for x, _ in vals) / len(vals))
            lo, lo_case = min(vals)
            met = f"{sum(x >= goal for x, _ in vals)}/{len(vals)}" if goal else "-"
            print(f"{section:<8} {what:<46} {len(vals):>2} {gm:6.2f} {lo:6.2f} {fmt(goal, '5.2f')} {met:>5}  {lo_case}")
    n_ok = sum(r["ok"] for r in rows)
    print(f"# extra rows without problems (fa3 ran, no NaN, fa3 within {MAX_REL_ERR:.0e} of float64): "
          f"{n_ok} of {len(rows)}")


def fp8_error_test(torch, lib):
    """FlashAttention-3's FP8 error test (its paper, section 4.3): Q, K, V ~ N(0, 1) + N(0, 100) x
    Bernoulli(0.001), d128, batch 2, 4096 tokens, 16 heads; RMSE of O against float64 attention (all
    heads of the first sequence), for fa3 in bf16 and in e4m3 by quantization step (the paper's Table 3
    as measured here): one scale per (batch, head) as FlashAttention-3's API has them, then
    fa3_quantize_fp8's blocks and its rotation of Q and K (incoherent processing). fa3_quantize_fp8
    takes 16-bit inputs: its rows start from the bf16 values (2^-9 relative, far below e4m3's 2^-4).
    Also times fa3_quantize_fp8 on a large tensor: bytes read + written over time."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    b, s, h, d = 2, 4096, 16, 128

    def outliers():
        x = torch.randn(b, s, h, d, device="cuda", generator=gen)
        big = torch.randn(b, s, h, d, device="cuda", generator=gen) * 10.0
        return x + big * (torch.rand(b, s, h, d, device="cuda", generator=gen) < 0.001)

    q, k, v = outliers(), outliers(), outliers()
    scale = 1.0 / math.sqrt(d)
    ref = attention_fp64(torch, q[0], k[0], v[0], False, scale)
    stream = torch.cuda.current_stream().cuda_stream
    result = {}
    qb, kb, vb = (t.to(torch.bfloat16) for t in (q, k, v))
    out = torch.empty_like(qb)
    fa3_ctypes.run_forward(lib, fa3_ctypes.fwd_params(lib, qb, kb, vb, out, softmax_scale=scale), stream)
    result["bf16"] = out
    (q8, qd), (k8, kd), (v8, vd) = (quantize_e4m3(torch, t) for t in (q, k, v))
    out8 = torch.empty_like(qb)
    p8 = fa3_ctypes.fwd_params(lib, q8, k8, v8, out8, softmax_scale=scale, q_descale=qd, k_descale=kd, v_descale=vd)
    fa3_ctypes.run_forward(lib, p8, stream)
    result["e4m3 per (batch, head)"] = out8
    # fa3_quantize_fp8: (block of Q, of K and V, rotate Q and K); a block of s tokens is one per (batch, head).
    steps = (("fa3 quantizer, per (batch, head)", s, s, False), ("+ blocks of 128 tokens", 128, 128, False),
             ("per (batch, head) + rotation", s, s, True), ("blocks of 128 + rotation", 128, 128, True),
             ("+ Q blocks of 16", 16, 128, True))
    for name, bq, bkv, rotate in steps:
        qq, qs = fa3_ctypes.quantize_fp8(lib, qb, bq, hadamard=rotate, seed=FP8_SEED)
        kq, ks = fa3_ctypes.quantize_fp8(lib, kb, bkv, hadamard=rotate, seed=FP8_SEED)
        vq, vs = fa3_ctypes.quantize_fp8(lib, vb, bkv)
        o = torch.empty_like(qb)
        pb = fa3_ctypes.fwd_params(lib, qq, kq, vq, o, softmax_scale=scale,
                                   block_descales={"q": (qs, bq), "k": (ks, bkv), "v": (vs, bkv)})
        fa3_ctypes.run_forward(lib, pb, stream)
        result[name] = o
    torch.cuda.synchronize()
    rmse = {name: float(((o[0].double() - ref) ** 2).mean().sqrt()) for name, o in result.items()}
    print("\n# FP8 error test (FlashAttention-3 section 4.3: N(0,1) + N(0,100) x Bernoulli(0.001), d128, b 2, "
          "s 4096, h 16): RMSE of O vs float64")
    for name, e in rmse.items():
        print(f"{name:<36} {e:.2e}")
    del q, k, v, qb, kb, vb, result
    # fa3_quantize_fp8's bandwidth: bf16 [4, 16k, 16, 128] in (256 MiB), e4m3 out, blocks of 128.
    x = torch.randn(4, 16384, 16, 128, device="cuda", dtype=torch.bfloat16)
    moved = x.numel() * 3 + x.numel() // (128 * 128) * 4  # 2 + 1 bytes per element, a float per block
    print("# fa3_quantize_fp8, bf16 [4, 16384, 16, 128] -> e4m3, blocks of 128 (bytes read + written / time)")
    for rotate in (False, True):
        for _ in range(3):
            fa3_ctypes.quantize_fp8(lib, x, 128, hadamard=rotate, seed=FP8_SEED)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        reps = 20
        start.record()
        for _ in range(reps):
            fa3_ctypes.quantize_fp8(lib, x, 128, hadamard=rotate, seed=FP8_SEED)
        end.record()
        torch.cuda.synchronize()
        ms = start.elapsed_time(end) / reps
        tbs = moved / (ms * 1e-3) / 1e12
        rmse[f"quantize TB/s{' rotated' if rotate else ''}"] = tbs
        print(f"{'rotated' if rotate else 'plain':<36} {ms:.3f} ms  {tbs:.2f} TB/s")
    return rmse


def run_extras(torch, lib, args, l2):
    """The sections of args.extras, one table each, then their summary.  Returns (rows, problems)."""
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    rows, problems = [], []
    for section in args.extras:
        print_extra_header(section)
        for case in extra_cases(section, args):
            row = EXTRA_RUNNERS[section](torch, lib, args, l2, dtype, *case)
            problems += extra_problems(row)
            rows.append(row)
            print_extra_row(row)
            torch.cuda.empty_cache()
        if section == "fp8":
            try:
                rows.append({"section": "fp8_error_test", "rmse": fp8_error_test(torch, lib), "ok": True})
            except ERRORS as e:
                problems.append(f"fp8 error test: {error_text(e)}")
    print_extras_summary([r for r in rows if r["section"] in EXTRA_SECTIONS])
    return rows, problems


# ------------------------------------------------------------------------------------- sweep ----

def run_sweep(torch, lib, args, l2):
    """The main sweep: one table row per (d, causal, seqlen), a float64 check per (d, causal).
    Returns (rows, float64 checks, problems)."""
    rows, checks, problems = [], [], []
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
                # The float64 check below sees one seqlen per (d, causal); the peers see every row.
                problems += [f"d={d} causal={int(causal)} seqlen={seqlen}: fa3 vs {LABELS[i]} rel err {e:.3e} "
                             f"> {PEER_MAX_REL_ERR:.0e}" for i, e in row["rel_err_vs"].items()
                             if not (math.isfinite(e) and e <= PEER_MAX_REL_ERR)]
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
    return rows, checks, problems


# -------------------------------------------------------------------------------------- main ----

def open_gpu(args, prog):
    """(torch, fa3 library or None, its path) for a benchmark script, or None after saying why not
    (no CUDA device, or fa3 in args.impls and its library does not load)."""
    import torch
    if not torch.cuda.is_available():
        print(f"{prog}: no CUDA device visible", file=sys.stderr)
        return None
    lib, lib_path = None, None
    if "fa3" in args.impls:
        try:
            lib = fa3_ctypes.load(args.lib)
            lib_path = lib._name
        except (OSError, RuntimeError) as e:
            print(f"{prog}: {e}", file=sys.stderr)
            return None
    return torch, lib, lib_path


def main(argv=None):
    args = parse_args(argv)
    opened = open_gpu(args, "compare.py")
    if opened is None:
        return 2
    torch, lib, lib_path = opened

    env = environment(torch, args, lib_path)
    l2 = l2_bytes(env)
    torch.set_grad_enabled(False)
    rows, checks, problems = [], [], []
    if args.only_extras:
        print(env_line(env))
    else:
        print_header(env, args)
        rows, checks, problems = run_sweep(torch, lib, args, l2)
        print_summary(rows)
    bwd_rows = []
    if args.bwd and lib is not None and not args.only_extras:
        import compare_bwd  # noqa: E402  (it imports this module)
        bargs = compare_bwd.parse_args([])
        for name in ("hdims", "seqlens", "causals", "dtype", "tokens", "hidden", "warmup_ms", "rep", "timer"):
            setattr(bargs, name, getattr(args, name))
        print("\n## backward, the same shapes (TFLOP/s = 2.5 x forward FLOPs)")
        compare_bwd.print_header()
        bwd_rows, bwd_problems = compare_bwd.run_sweep(torch, lib, bargs, l2)
        problems += bwd_problems
    extras = []
    if args.extras:
        extras, extra_problems = run_extras(torch, lib, args, l2)
        problems += extra_problems
    for p in problems:
        print(f"PROBLEM: {p}")
    if args.json:
        data = {"environment": env, "config": {k: v for k, v in vars(args).items()},
                "rows": rows, "float64_checks": checks, "problems": problems}
        if args.bwd:
            data["bwd_rows"] = bwd_rows
        if args.extras:
            data["extras"] = {"softcap": SOFTCAP, "seqlens": list(EXTRA_SEQLENS), "varlen_lengths": varlen_lengths(),
                              "varlen_seed": VARLEN_SEED, "flops": "2*pairs*(d_qk + d_v), causal pairs counted exactly",
                              "rows": extras}
        with open(args.json, "w") as f:
            json.dump(data, f, indent=1)
        print(f"# wrote {args.json}")
    if args.png and rows:
        sections = [{"rows": rows, "impls": args.impls, "labels": LABELS, "colors": COLORS, "what": "forward"}]
        if bwd_rows:
            import compare_bwd  # noqa: E402
            sections.append(compare_bwd.plot_section(bwd_rows))
        plot_sections(sections, args, env, args.png)
        print(f"# wrote {args.png}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
