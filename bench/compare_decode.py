#!/usr/bin/env python3
"""fa3 decoding (few queries per sequence, a long KV cache) vs PyTorch SDPA's cuDNN and FLASH
(FlashAttention-2) backends, on the same tensors in one process.

The grid: batch 1/8/64, s_q 1/4 queries per sequence, 4k/32k/128k keys, heads q:kv 32:8 (GQA) and
32:32, head dim 128, bf16; K/V contiguous and paged (pages of 16 and 256 rows, shuffled).  A case
whose K+V would need more than --max-gb of GPU memory is skipped (a paged copy needs a pool of its
own next to the contiguous K/V).

  python3 bench/compare_decode.py                               # the whole grid, table on stdout
  python3 bench/compare_decode.py --quick --json decode.json
  python3 bench/compare_decode.py --batch 8 --keys 32k --heads 32:8 --pages 0 --impls fa3,cudnn
  python3 bench/compare_decode.py --splits 1                    # fa3 without split-KV
  python3 bench/compare_decode.py --batch 64 --keys 4k --heads 32:32 --sq 1 --pages 0 --splits 0,1,3,4,8
                                                                # a row per split count (peers timed once)

Rows: fa3 non-causal for every case; for s_q > 1 also fa3 causal, bottom-right aligned (query i
sees keys <= i + keys - s_q: speculative decoding).  The SDPA peers run on the contiguous tensors
only (SDPA has no paged KV cache) and unmasked: SDPA's is_causal is top-left aligned, not the same
mask for s_q > 1.  enable_gqa=True where the head counts differ.

Metric: TB/s = bytes of K and V read (b * keys * h_kv * d * 2 * element size) / time.  Ratios:
fa3/cuDNN and fa3/FA2 on the contiguous non-causal rows; paged rows vs fa3 contiguous of the same
case; s_q 4 rows vs fa3 s_q 1 of the same (b, keys, heads, pages).  Timing as compare.py (--timer:
do_bench by default, L2 flushed before every timed call; events: back-to-back calls), inputs rotated
over enough sets (>= 3x L2 together) where one set's K+V is smaller than that.

Correctness (input set 0, outside timing): every output vs a float32 reference softmax(scale QK^T) V
(a query head attends to kv head q_head // (h_q / h_kv)), error = max|o - ref| / max|ref|; fa3 rows
above 1e-2 (or NaN, or failing) are PROBLEMs and the exit status is 1.  A host-cost line times
back-to-back fa3_forward calls through ctypes (and one SDPA call) on a tiny problem.
"""
import argparse
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare  # noqa: E402  (needs the path above)
import fa3_ctypes  # noqa: E402

IMPLS = ("fa3", "cudnn", "fa2")
LABELS = {"fa3": "fa3", "cudnn": "cuDNN (SDPA)", "fa2": "FA2 (SDPA flash)"}
PEERS = ("cudnn", "fa2")
DEFAULT_GRID = {"batch": [1, 8, 64], "sq": [1, 4], "keys": [4096, 32768, 131072], "heads": [(32, 8), (32, 32)],
                "pages": [0, 16, 256]}
QUICK_GRID = {"batch": [1, 64], "sq": [1, 4], "keys": [4096, 131072], "heads": [(32, 8)], "pages": [0, 256]}
ROTATE_L2 = 3              # rotate input sets until they hold >= ROTATE_L2 x L2 of K+V
REF_CHUNK_BYTES = 1 << 30  # fp32 K+V of one reference chunk (batch elements x kv heads)
BIG_READ = 256e6           # the target: >= GOAL_TBPS on reads of K+V >= 256 MB
GOAL_TBPS = 4.0
HOST_SHAPE = {"batch": 1, "sq": 1, "keys": 128, "hq": 8, "hkv": 8, "d": 128}


# --------------------------------------------------------------------------------- arguments ----

def heads_list(text):
    """"32:8,32:32" -> [(32, 8), (32, 32)] (q heads : kv heads)."""
    out = []
    for item in text.split(","):
        hq, _, hkv = item.strip().partition(":")
        out.append((int(hq), int(hkv or hq)))
    return out


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=compare.int_list, default=None, help="batch sizes (default 1,8,64)")
    ap.add_argument("--sq", type=compare.int_list, default=None, help="queries per sequence (default 1,4)")
    ap.add_argument("--keys", type=compare.int_list, default=None,
                    help="keys per sequence, k = 1024 (default 4k,32k,128k)")
    ap.add_argument("--heads", type=heads_list, default=None, help="q:kv head counts (default 32:8,32:32)")
    ap.add_argument("--pages", type=compare.int_list, default=None,
                    help="KV layouts: 0 = contiguous, else the page size (default 0,16,256)")
    ap.add_argument("--d", type=int, default=128, help="head dim (default 128)")
    ap.add_argument("--dtype", choices=("bf16", "fp16"), default="bf16")
    ap.add_argument("--quick", action="store_true",
                    help="batch 1,64, s_q 1,4, keys 4k,128k, heads 32:8, pages 0,256 (explicit flags still win)")
    ap.add_argument("--splits", type=compare.int_list, default=[0],
                    help="fa3's num_splits: 0 = automatic (default), 1 = no split, > 1 = that many key splits; "
                         "a list gives an fa3 row per value (the peers run once, their figures on every row)")
    ap.add_argument("--max-gb", type=float, default=20.0,
                    help="skip a case whose K+V (with a paged pool: both copies) exceeds this many GB (default 20)")
    ap.add_argument("--impls", default=",".join(IMPLS), help="subset of fa3,cudnn,fa2")
    ap.add_argument("--timer", choices=("do_bench", "events"), default="do_bench",
                    help="as compare.py: do_bench (median, L2 flushed before every call; events when triton is "
                         "missing) or events (back-to-back calls, CUDA events around each)")
    ap.add_argument("--warmup-ms", type=float, default=50.0, help="warm-up time per implementation and row")
    ap.add_argument("--rep", type=int, default=100, help="timed calls per row with --timer events (median)")
    ap.add_argument("--host-calls", type=int, default=2000,
                    help="back-to-back calls of the host-cost line (0: no host-cost line)")
    ap.add_argument("--json", default=None, metavar="PATH", help="write all rows and the environment here")
    ap.add_argument("--lib", default=None, metavar="PATH", help="libfa3.so (default $FA3_LIB or build/release)")
    args = ap.parse_args(argv)
    grid = QUICK_GRID if args.quick else DEFAULT_GRID
    for name, default in grid.items():
        if getattr(args, name) is None:
            setattr(args, name, list(default))
    args.sq = sorted(set(args.sq))  # s_q 1 first: the s_q > 1 rows' ratios refer to it
    args.impls = [i.strip() for i in args.impls.split(",") if i.strip()]
    unknown = [i for i in args.impls if i not in IMPLS]
    if unknown or not args.impls:
        ap.error(f"--impls: unknown {unknown}; choose from {','.join(IMPLS)}")
    bad = [f"{hq}:{hkv}" for hq, hkv in args.heads if hq < 1 or hkv < 1 or hq % hkv]
    if bad:
        ap.error(f"--heads: q heads must be a multiple of kv heads, got {bad}")
    if min(args.batch + args.sq + args.keys) < 1 or min(args.pages) < 0 or args.d < 1:
        ap.error("--batch, --sq, --keys, --d must be >= 1 and --pages >= 0")
    if min(args.keys) < max(args.sq):
        ap.error("--keys must be >= --sq (a causal row would have queries that see no key)")
    if min(args.splits) < 0:
        ap.error("--splits must be >= 0 (0 = automatic)")
    if args.rep < 1:
        ap.error("--rep must be >= 1")
    return args


# ----------------------------------------------------------------------------------- shapes ----

def kv_label(keys):
    return f"{keys // 1024}k" if keys % 1024 == 0 else str(keys)


def case_label(row):
    return (f"b{row['batch']} {kv_label(row['keys'])} sq{row['sq']} {row['hq']}:{row['hkv']}"
            f"{' causal' if row['causal'] else ''}")


def pages_label(pages):
    return "all" if pages is None else "contig" if pages == 0 else str(pages)


def kv_bytes(b, keys, hkv, d, elem):
    """The bytes the kernel must read: K and V, once."""
    return b * keys * hkv * d * 2 * elem


def n_input_sets(one_set, l2):
    """One set when its K+V outgrows ROTATE_L2 x L2, else enough sets that the rotation's other sets
    (read in between) hold ROTATE_L2 x L2: each call's K/V come from HBM."""
    return 1 if one_set >= ROTATE_L2 * l2 else -(-ROTATE_L2 * l2 // one_set) + 1


def make_decode_sets(torch, case, dtype, n_sets):
    """n_sets independent (q [b, s_q, h_q, d], k / v [b, keys, h_kv, d]) sets, random normal, with the
    [b, h, s, d] views SDPA takes (the same memory, no copies)."""
    b, sq, keys, hq, hkv, d = (case[n] for n in ("batch", "sq", "keys", "hq", "hkv", "d"))
    gen = torch.Generator(device="cuda").manual_seed(0)  # same inputs on every run
    sets = []
    for _ in range(n_sets):
        q = torch.randn(b, sq, hq, d, dtype=dtype, device="cuda", generator=gen)
        k, v = (torch.randn(b, keys, hkv, d, dtype=dtype, device="cuda", generator=gen) for _ in range(2))
        sets.append({"q": q, "k": k, "v": v, "qt": q.transpose(1, 2), "kt": k.transpose(1, 2),
                     "vt": v.transpose(1, 2)})
    return sets


# ---------------------------------------------------------------------------- implementations ----

def sdpa_calls(torch, sets, gqa, scale):
    """Unmasked SDPA on each set's [b, h, s, d] views; enable_gqa where the head counts differ."""
    sdpa = torch.nn.functional.scaled_dot_product_attention
    kw = {"enable_gqa": True} if gqa else {}

    def call(s):
        try:
            return sdpa(s["qt"], s["kt"], s["vt"], scale=scale, **kw)
        except TypeError as e:  # a torch without enable_gqa: a refusal, not a crash
            raise RuntimeError(f"scaled_dot_product_attention: {compare.error_text(e)}") from None
    return [lambda s=s: call(s) for s in sets]


def run_peer(torch, args, impl, sets, gqa, scale):
    """One SDPA backend pinned ("cudnn" or "fa2") on every set.  Returns (result, O of set 0 as
    [b, s_q, h_q, d] or None)."""
    with torch.nn.attention.sdpa_kernel(compare.sdpa_backend(torch, impl)):
        res, out = compare.measure(torch, args, sdpa_calls(torch, sets, gqa, scale))
    return res, (None if out is None else out.transpose(1, 2))


def finish(res, nbytes):
    """TB/s and µs in place of compare.measure's TFLOP/s."""
    res.pop("tflops", None)
    res["tbps"] = nbytes / (res["ms"] * 1e-3) / 1e12 if res["ms"] else None
    res["us"] = res["ms"] * 1e3 if res["ms"] else None
    return res


# ------------------------------------------------------------------------------- correctness ----

def reference_errors(torch, q, k, v, outs, scale, budget=REF_CHUNK_BYTES):
    """max|o - ref| / max|ref| of every output against softmax(scale QK^T) V in float32.

    q [b, s_q, h_q, d], k / v [b, keys, h_kv, d]; outs {key: (causal, O [b, s_q, h_q, d])}.  Causal is
    bottom-right aligned (query i sees keys j <= i + keys - s_q).  Query head i attends to kv head
    i // g (g = h_q / h_kv): the g query heads of a kv head are one matmul against it, as if its K and V
    were repeated g times.  Chunks of batch elements x kv heads keep the fp32 K+V under `budget` bytes.
    """
    b, sq, hq, d = q.shape
    keys, hkv = k.shape[1], k.shape[2]
    g = hq // hkv
    per = keys * d * 4 * 2  # fp32 K and V of one (batch element, kv head)
    hc = max(1, min(hkv, budget // per))
    bc = max(1, min(b, budget // (per * hc)))
    hidden = torch.arange(keys, device=q.device)[None, :] > \
        (torch.arange(sq, device=q.device)[:, None] + (keys - sq))  # [s_q, keys]: True = masked
    causals = sorted({c for c, _ in outs.values()})
    diff = {key: 0.0 for key in outs}
    peak = {c: 0.0 for c in causals}
    for b0 in range(0, b, bc):
        b1 = min(b, b0 + bc)
        for h0 in range(0, hkv, hc):
            h1 = min(hkv, h0 + hc)
            n, m = b1 - b0, h1 - h0
            kk, vv = (t[b0:b1, :, h0:h1].float().permute(0, 2, 1, 3) for t in (k, v))  # [n, m, keys, d]
            qq = q[b0:b1, :, h0 * g:h1 * g].float().reshape(n, sq, m, g, d).permute(0, 2, 3, 1, 4)
            s = (qq.reshape(n, m, g * sq, d) @ kk.transpose(-1, -2)) * scale  # [n, m, g*s_q, keys]
            for causal in causals:
                sc = s.view(n, m, g, sq, keys)
                if causal:
                    sc = sc.masked_fill(hidden, float("-inf"))
                p = torch.softmax(sc, dim=-1).view(n, m, g * sq, keys)
                ref = (p @ vv).view(n, m, g, sq, d).permute(0, 3, 1, 2, 4).reshape(n, sq, m * g, d)
                peak[causal] = max(peak[causal], ref.abs().max().item())
                for key, (c, o) in outs.items():
                    if c == causal:
                        e = (o[b0:b1, :, h0 * g:h1 * g].float() - ref).abs().max().item()
                        diff[key] = max(diff[key], e, key=compare.nan_high)
            del kk, vv, qq, s
    return {key: (diff[key] / peak[c] if peak[c] else math.nan) for key, (c, _) in outs.items()}


# ----------------------------------------------------------------------------------- one case ----

def new_row(case, pages, causal, nbytes, n_sets, splits):
    return dict(case, pages=pages, causal=causal, kv_bytes=nbytes, n_input_sets=n_sets, num_splits=splits,
                impls={}, fa3_kernel=None, rel_err_vs_ref={}, nan={}, ratios={}, skipped=None)


def record(torch, row, impl, res, out, nbytes, outs, key):
    """Stores one run in a row; its set-0 output goes to `outs` (for the reference check) under key."""
    row["impls"][impl] = finish(res, nbytes)
    if out is not None:
        row["nan"][impl] = compare.has_nan(torch, out)
        outs[key] = (row["causal"], out, row, impl)


def skip_row(case, pages, nbytes, splits, why):
    """One line for what is not run: the whole case (pages None) or one paged layout of it."""
    row = new_row(case, pages, False, nbytes, 0, splits)
    row["skipped"] = why
    return row


def too_big(need, what, cap_gb):
    return f"skipped: {need / 1e9:.3g} GB ({what}) > --max-gb {cap_gb:g}"


def row_specs(args, case, fa3_on):
    """The (pages, causal) rows of one case: fa3's on every layout (causal too for s_q > 1); without
    fa3 only the contiguous non-causal row, where the peers run."""
    if not fa3_on:
        return [(0, False)] if 0 in args.pages else []
    causals = [False, True] if case["sq"] > 1 else [False]
    return [(p, c) for p in args.pages for c in causals]


def run_case(torch, lib, args, l2, dtype, case):
    """Every row of one (batch, s_q, keys, heads) case: contiguous fa3 (non-causal, and causal for
    s_q > 1) with the SDPA peers on the non-causal row, then fa3 on each paged copy; the reference
    check of set 0 last.  Returns the rows, in print order."""
    elem = torch.empty((), dtype=dtype).element_size()
    nbytes = kv_bytes(case["batch"], case["keys"], case["hkv"], case["d"], elem)
    cap = args.max_gb * 1e9
    specs = row_specs(args, case, "fa3" in args.impls and lib is not None)
    if not specs:
        return []
    if nbytes > cap:
        return [skip_row(case, None, nbytes, args.splits[0], too_big(nbytes, "K+V", args.max_gb))]
    n_sets = n_input_sets(nbytes, l2)
    sets = make_decode_sets(torch, case, dtype, n_sets)
    scale = 1.0 / math.sqrt(case["d"])
    gqa = case["hq"] != case["hkv"]
    rows, outs, copies = [], {}, []  # copies: (row, row whose peer figures it shows)
    for pages in dict.fromkeys(p for p, _ in specs):  # in --pages order
        causals = [c for p, c in specs if p == pages]
        if pages and nbytes * 2 > cap:  # the paged pool sits next to the contiguous K/V it is copied from
            why = too_big(2 * nbytes, "K+V + paged pool", args.max_gb)
            rows.append(skip_row(case, pages, nbytes, args.splits[0], why))
            continue
        if pages and case["keys"] % pages:
            rows.append(skip_row(case, pages, nbytes, args.splits[0],
                                 f"skipped: keys {case['keys']} not a multiple of the page size"))
            continue
        psets, table = compare.paged_sets(torch, sets, pages) if pages else (sets, None)
        for causal in causals:
            first = None  # the row of the first split count: the peers run there
            for splits in args.splits:
                row = new_row(case, pages, causal, nbytes, n_sets, splits)
                tag = f"p{pages}{'c' if causal else ''}s{splits}"
                if "fa3" in args.impls and lib is not None:
                    res, out, kname = compare.run_fa3(torch, lib, args, psets, causal, scale, page_table=table,
                                                      num_splits=splits)
                    row["fa3_kernel"] = kname
                    record(torch, row, "fa3", res, out, nbytes, outs, f"fa3 {tag}")
                if pages == 0 and not causal and first is not None:
                    for impl in PEERS:
                        if impl in first["impls"]:
                            row["impls"][impl] = first["impls"][impl]
                            row["nan"][impl] = first["nan"].get(impl)
                    copies.append((row, first))
                elif pages == 0 and not causal:
                    for impl in PEERS:
                        if impl in args.impls:
                            res, out = run_peer(torch, args, impl, sets, gqa, scale)
                            record(torch, row, impl, res, out, nbytes, outs, f"{impl} {tag}")
                first = first or row
                rows.append(row)
        del psets, table
    if outs:
        s0 = sets[0]
        errs = reference_errors(torch, s0["q"], s0["k"], s0["v"], {k: (c, o) for k, (c, o, _, _) in outs.items()},
                                scale)
        for k, (_, _, row, impl) in outs.items():
            row["rel_err_vs_ref"][impl] = errs[k]
        for row, first in copies:
            for impl in PEERS:
                if impl in first["rel_err_vs_ref"]:
                    row["rel_err_vs_ref"][impl] = first["rel_err_vs_ref"][impl]
    del sets, outs
    torch.cuda.empty_cache()
    return rows


# ------------------------------------------------------------------------------------ ratios ----

def tbps(row, impl="fa3"):
    return (row or {}).get("impls", {}).get(impl, {}).get("tbps")


def div(a, b):
    return a / b if a and b else None


def add_ratios(row, index):
    """fa3/cuDNN and fa3/FA2 on contiguous non-causal rows; paged vs contiguous of the same case (and
    mask); s_q > 1 vs s_q 1 of the same (b, keys, heads, pages).  index: the rows so far, by key()."""
    r = row["ratios"]
    if row["pages"] == 0 and not row["causal"]:
        for impl in PEERS:
            r[f"fa3/{impl}"] = div(tbps(row), tbps(row, impl))
    if row["pages"]:
        r["paged/contig"] = div(tbps(row), tbps(index.get(key(row, pages=0))))
    if row["sq"] > 1:
        base = tbps(index.get(key(row, sq=1, causal=False)))
        r["causal/sq1" if row["causal"] else "sq/sq1"] = div(tbps(row), base)


def key(row, **change):
    r = dict(row, **change)
    return tuple(r[n] for n in ("batch", "sq", "keys", "hq", "hkv", "d", "pages", "causal", "num_splits"))


def notes(row):
    r, out = row["ratios"], []
    if r.get("paged/contig"):
        out.append(f"p/contig {r['paged/contig']:.2f}")
    if r.get("causal/sq1"):
        out.append(f"causal sq{row['sq']}/sq1 {r['causal/sq1']:.2f}")
    if r.get("sq/sq1"):
        out.append(f"sq{row['sq']}/sq1 {r['sq/sq1']:.2f}")
    return "; ".join(out)


# ------------------------------------------------------------------------------------ output ----

def cell(row, impl, spec, field="tbps"):
    """A number, "n/a" where the implementation refused or failed, "-" where it did not run."""
    if impl not in row["impls"]:
        width = int(spec.split(".")[0] or 0)
        return "-".rjust(width)
    return compare.fmt(row["impls"][impl].get(field), spec)


def ratio_cell(row, name, spec="9.2f"):
    if name not in row["ratios"]:
        return "-".rjust(int(spec.split(".")[0]))
    return compare.fmt(row["ratios"][name], spec)


def print_header(env, args):
    print(compare.env_line(env).replace("forward", "decode (forward, few queries, long KV cache)"))
    splits = ",".join("automatic" if s == 0 else str(s) for s in args.splits)
    print(f"# {args.dtype}, d {args.d}, timer {args.timer}, inputs rotated over >= {ROTATE_L2}x L2 of K+V; "
          f"TB/s = K+V bytes / t; fa3 num_splits {splits}; fa3 causal = bottom-right (query i sees keys "
          f"<= i + keys - s_q)")
    print("# peers: SDPA, contiguous K/V only, unmasked on every row (SDPA's is_causal is top-left aligned: not "
          "fa3's mask for s_q > 1), enable_gqa where h_q != h_kv; err = max|o-ref|/max|ref| vs fp32 (input set 0)")
    print(f"{'case':<25} {'pages':>6} | {'fa3 TB/s':>8} {'µs':>8} {'kernel/splits':<14} | {'cuDNN':>6} {'FA2':>6} | "
          f"{'fa3/cuDNN':>9} {'fa3/FA2':>9} | {'err':>8} | notes")


def print_row(row):
    label = case_label(row)
    if row["skipped"]:
        print(f"{label:<25} {pages_label(row['pages']):>6} | {row['skipped']}", flush=True)
        return
    err = row["rel_err_vs_ref"].get("fa3")
    splits = "auto" if row["num_splits"] == 0 else str(row["num_splits"])
    kernel = f"{row['fa3_kernel']}/{splits}" if row["fa3_kernel"] else "-"
    print(f"{label:<25} {pages_label(row['pages']):>6} | {cell(row, 'fa3', '8.2f')} {cell(row, 'fa3', '8.1f', 'us')} "
          f"{kernel:<14} | {cell(row, 'cudnn', '6.2f')} {cell(row, 'fa2', '6.2f')} | "
          f"{ratio_cell(row, 'fa3/cudnn')} {ratio_cell(row, 'fa3/fa2')} | {compare.fmt(err, '8.1e')} | {notes(row)}",
          flush=True)
    compare.print_row_problems(row, LABELS)


def summarize(rows):
    """Per (heads, s_q) group and over all rows: the worst ratios, and how many fa3 rows reading
    K+V >= BIG_READ reach GOAL_TBPS."""
    ran = [r for r in rows if not r["skipped"]]
    groups = {}
    for r in ran:
        groups.setdefault(f"{r['hq']}:{r['hkv']} sq{r['sq']}", []).append(r)
    if len(groups) > 1:
        groups["all"] = ran
    out = []
    for name, rs in groups.items():
        def worst(ratio):
            vals = [(r["ratios"][ratio], case_label(r) + (f" p{r['pages']}" if r["pages"] else ""))
                    for r in rs if r["ratios"].get(ratio)]
            return min(vals) if vals else (None, None)
        big = [tbps(r) for r in rs if r["kv_bytes"] >= BIG_READ and tbps(r)]
        out.append({"group": name, "fa3_rows": sum(1 for r in rs if tbps(r)),
                    **{f"min_{k}": worst(k)[0] for k in ("fa3/cudnn", "fa3/fa2", "paged/contig", "causal/sq1",
                                                        "sq/sq1")},
                    "worst_case": {k: worst(k)[1] for k in ("fa3/cudnn", "fa3/fa2", "paged/contig", "causal/sq1")},
                    "big_reads": len(big), "big_reads_at_goal": sum(x >= GOAL_TBPS for x in big)})
    return out


def print_summary(summary):
    print(f"\n# summary: minimum ratios (TB/s) per group; >= {GOAL_TBPS:g} TB/s = fa3 rows (contiguous and paged) "
          f"reading K+V >= {BIG_READ / 1e6:.0f} MB that reach it")
    print(f"{'group':<12} {'rows':>4} | {'fa3/cuDNN':>9} {'fa3/FA2':>9} {'p/contig':>9} {'causal/sq1':>10} "
          f"{'sq4/sq1':>8} | {'>= ' + format(GOAL_TBPS, 'g') + ' TB/s':>12}")
    for g in summary:
        f = compare.fmt
        print(f"{g['group']:<12} {g['fa3_rows']:>4} | {f(g['min_fa3/cudnn'], '9.2f')} {f(g['min_fa3/fa2'], '9.2f')} "
              f"{f(g['min_paged/contig'], '9.2f')} {f(g['min_causal/sq1'], '10.2f')} {f(g['min_sq/sq1'], '8.2f')} | "
              f"{str(g['big_reads_at_goal']) + '/' + str(g['big_reads']):>12}")


def row_problems(row):
    """What fails a row: fa3 refused or failed, a NaN in fa3's output, fa3 off the reference by > 1e-2."""
    res = row["impls"].get("fa3")
    if row["skipped"] or res is None:
        return []
    where = f"{case_label(row)} pages {pages_label(row['pages'])}"
    if res["error"]:
        return [f"{where}: fa3 failed: {res['error'][:300]}"]
    out = [f"{where}: NaN in fa3's output"] if row["nan"].get("fa3") else []
    e = row["rel_err_vs_ref"].get("fa3")
    if e is not None and not (math.isfinite(e) and e <= compare.MAX_REL_ERR):
        out.append(f"{where}: fa3 rel err vs fp32 {e:.3e} > {compare.MAX_REL_ERR:.0e}")
    return out


# --------------------------------------------------------------------------------- host cost ----

def per_call_us(torch, fn, calls, warmup=200):
    """µs per call of `calls` back-to-back calls, the GPU drained before the first and after the last."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def host_cost(torch, lib, args, dtype):
    """fa3_forward through ctypes (prepared params) and one SDPA call (default backend), on a tiny problem."""
    h = HOST_SHAPE
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(h["batch"], h["sq"], h["hq"], h["d"], dtype=dtype, device="cuda", generator=gen)
    k, v = (torch.randn(h["batch"], h["keys"], h["hkv"], h["d"], dtype=dtype, device="cuda", generator=gen)
            for _ in range(2))
    out = {"shape": dict(h), "calls": args.host_calls, "fa3_us": None, "sdpa_us": None, "errors": {}}
    if lib is not None and "fa3" in args.impls:
        try:
            o = torch.empty_like(q)
            p = fa3_ctypes.fwd_params(lib, q, k, v, o, num_splits=args.splits[0])
            stream = torch.cuda.current_stream().cuda_stream
            out["fa3_us"] = per_call_us(torch, lambda: fa3_ctypes.run_forward(lib, p, stream), args.host_calls)
        except compare.ERRORS as e:
            out["errors"]["fa3"] = compare.error_text(e)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    try:
        out["sdpa_us"] = per_call_us(torch, lambda: sdpa(qt, kt, vt), args.host_calls)
    except compare.ERRORS as e:
        out["errors"]["sdpa"] = compare.error_text(e)
    return out


def print_host_cost(hc):
    h = hc["shape"]
    what = {"fa3_us": "fa3_forward via ctypes", "sdpa_us": "SDPA (default backend)"}
    parts = [f"{name} {hc[k]:.1f} µs" if hc[k] is not None else f"{name} n/a" for k, name in what.items()]
    print(f"\n# host cost per call (b {h['batch']}, s_q {h['sq']}, keys {h['keys']}, heads {h['hq']}:{h['hkv']}, "
          f"d {h['d']}; {hc['calls']} back-to-back calls, synchronized before and after): " + ", ".join(parts))
    for impl, err in hc["errors"].items():
        print(f"#   {impl} n/a: {err[:300]}")


# -------------------------------------------------------------------------------------- main ----

def cases(args):
    """The grid's cases in print order; s_q innermost and ascending, so that s_q 1 precedes s_q 4."""
    for hq, hkv in args.heads:
        for b in args.batch:
            for keys in args.keys:
                for sq in args.sq:
                    yield {"batch": b, "sq": sq, "keys": keys, "hq": hq, "hkv": hkv, "d": args.d}


def main(argv=None):
    args = parse_args(argv)
    opened = compare.open_gpu(args, "compare_decode.py")
    if opened is None:
        return 2
    torch, lib, lib_path = opened
    if args.timer == "do_bench":
        try:
            import triton.testing  # noqa: F401
        except ImportError:
            print("# triton not found: --timer events", file=sys.stderr)
            args.timer = "events"

    env = compare.environment(torch, args, lib_path)
    l2 = compare.l2_bytes(env)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    torch.set_grad_enabled(False)
    print_header(env, args)
    rows, index, problems = [], {}, []
    for case in cases(args):
        for row in run_case(torch, lib, args, l2, dtype, case):
            if not row["skipped"]:
                add_ratios(row, index)
                index[key(row)] = row
            rows.append(row)
            print_row(row)
            problems += row_problems(row)
    hc = host_cost(torch, lib, args, dtype) if args.host_calls > 0 else None
    if hc:
        print_host_cost(hc)
    summary = summarize(rows)
    print_summary(summary)
    for p in problems:
        print(f"PROBLEM: {p}")
    if args.json:
        data = {"environment": env, "config": dict(vars(args)), "metric": "TB/s = K+V bytes / time",
                "rows": rows, "host_cost": hc, "summary": summary, "problems": problems}
        with open(args.json, "w") as f:
            json.dump(data, f, indent=1)
        print(f"# wrote {args.json}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
