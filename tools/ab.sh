#!/usr/bin/env bash
# A/B on the H200 in one call: runs several fa3-bench binaries in alternation (ROUNDS rounds) on the
# same flags and prints one line of TFLOP/s per binary and round, then the per-shape means.
#   BENCHES="A:build/carry_a/fa3-bench B:build/carry/fa3-bench" ROUNDS=2 tools/ab.sh --hdim 64 --causal 1
# (a command with arguments: commas for spaces, "B:env,FOO=1,build/carry/fa3-bench").
set -u
BENCHES=${BENCHES:-"A:build/carry_a/fa3-bench B:build/carry/fa3-bench"}
tmp=$(mktemp)
for r in $(seq 1 "${ROUNDS:-2}"); do
  for entry in $BENCHES; do
    name=${entry%%:*}; cmd=${entry#*:}
    ${cmd//,/ } "$@" 2>&1 | awk -v n="$name" -v r="$r" '$1 ~ /^[0-9]+$/ && NF > 8 {
      printf "%s %s d%s-c%s-s%s %s\n", n, r, $1, $2, $3, $NF }' >> "$tmp"
  done
done
python3 - "$tmp" <<'PY'
import sys, collections
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
names = list(dict.fromkeys(r[0] for r in rows)); shapes = list(dict.fromkeys(r[2] for r in rows))
val = collections.defaultdict(list)
for n, r, s, t in rows:
    val[(n, s)].append(float(t))
print(f"{'shape':>16} " + " ".join(f"{n:>18}" for n in names) + "   (TFLOP/s per round; mean / first)")
for s in shapes:
    base = sum(val[(names[0], s)]) / max(1, len(val[(names[0], s)]))
    cells = []
    for n in names:
        v = val[(n, s)]; m = sum(v) / max(1, len(v))
        cells.append(f"{'/'.join(f'{x:.0f}' for x in v)} {m / base:5.3f}")
    print(f"{s:>16} " + " ".join(f"{c:>18}" for c in cells))
PY
rm -f "$tmp"
