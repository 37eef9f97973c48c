#!/usr/bin/env python3
"""Summarise ncu's per-instruction warp-stall samples of one kernel.

    ncu --section SourceCounters --section WarpStateStats -o rep <app>
    ncu --import rep.ncu-rep --page source --csv --print-source sass > rep.csv
    tools/ncu-stalls.py rep.csv [--top 40]

Prints the instructions with the most samples (address, SASS, samples, main stall reasons), then
the totals per stall reason: where the warps of a kernel wait, without the ncu GUI."""
import argparse
import csv
import re
import sys


def num(x):
    try:
        return float(str(x).replace(",", ""))
    except ValueError:
        return 0.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=40)
    a = ap.parse_args()
    rows = list(csv.reader(open(a.csv, newline="")))
    hi = next(i for i, r in enumerate(rows) if any(c.strip() == "Source" for c in r))
    head = rows[hi]
    body = [r for r in rows[hi + 1:] if len(r) == len(head)]
    col = {h: i for i, h in enumerate(head)}
    total_col = next((h for h in head if h.startswith("Warp Stall Sampling (All")), None)
    if total_col is None:
        print("columns:", head)
        return 1
    reasons = [h for h in head if re.match(r"^stall_|^smsp__pcsamp_warps_issue_stalled_", h) and "not_issued" not in h]
    if not reasons:  # newer ncu: one column per reason with a readable name
        reasons = [h for h in head if h not in (total_col,) and "Stall" in h and "Sampling" not in h]
    total = sum(num(r[col[total_col]]) for r in body) or 1.0
    print(f"{len(body)} instructions, {total:.0f} samples; reason columns: {len(reasons)}")
    body.sort(key=lambda r: -num(r[col[total_col]]))
    addr = col.get("Address", 0)
    for r in body[: a.top]:
        s = num(r[col[total_col]])
        top = sorted(((num(r[col[h]]), h) for h in reasons), reverse=True)[:3]
        why = ", ".join(f"{h.replace('smsp__pcsamp_warps_issue_stalled_', '')}={v:.0f}" for v, h in top if v > 0)
        print(f"{r[addr]:>8} {100 * s / total:5.1f}%  {r[col['Source']].strip()[:60]:60s} {why}")
    print("-- by reason")
    agg = sorted(((sum(num(r[col[h]]) for r in body), h) for h in reasons), reverse=True)
    for v, h in agg[:12]:
        print(f"{100 * v / total:5.1f}%  {h}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
