#!/usr/bin/env bash
# Device-side profiling of the forward (or, with BENCH_ARGS=--bwd, the backward) kernel on a few
# shapes: per-instruction stall samples and a few whole-kernel metrics (tensor pipe, issue, per-SM
# active-cycle spread, shared-memory traffic), summaries last.
#   run(command="FA3_BUILD=build/carry tools/profile-once.sh", carry=["build/carry"])  (tools/pack-build.sh)
# Environment: SHAPES ("hdim:seqlen:causal ..."), BENCH_ARGS (more fa3-bench flags: --dtype e4m3), OUT, QUICK=1 (metrics only, no stall samples),
# KEEP_SRC=1 (keep the per-instruction CSVs, e.g. to sum samples over address ranges), KERNEL (regex;
# fwd_kernel, or bwd_kernel with --bwd in BENCH_ARGS), SKIP (launches of it to skip; 1, or 2 with
# --bwd: fa3-bench alternates the backward's default and deterministic launches, so 2 samples the
# default one).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}; B=${FA3_BUILD:-build/release}; mkdir -p "$OUT"
kernel=${KERNEL:-fwd_kernel}; skip=${SKIP:-1}
if [[ " ${BENCH_ARGS:-} " == *" --bwd "* ]]; then kernel=${KERNEL:-bwd_kernel}; skip=${SKIP:-2}; fi
sections="--section SourceCounters --section WarpStateStats --section SpeedOfLight --section LaunchStats"
[ "${QUICK:-0}" = 1 ] && sections="--section SpeedOfLight"
for shape in ${SHAPES:-128:1024:1 128:8192:1 128:8192:0}; do
  IFS=: read -r d s c <<<"$shape"; tag="d${d}_s${s}_c${c}"
  args="--hdim $d --seqlen $s --causal $c --warmup 1 --iters 2 ${BENCH_ARGS:-}"
  timeout 200 ncu --clock-control none -k regex:$kernel --launch-skip $skip --launch-count 1 \
    $sections \
    --metrics lts__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_bytes.sum.per_second,l1tex__m_xbar2l1tex_read_bytes.sum.per_second,sm__cycles_active.min,sm__cycles_active.avg,sm__cycles_active.max,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed,sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,lts__t_sector_hit_rate.pct,dram__throughput.avg.pct_of_peak_sustained_elapsed,gpc__cycles_elapsed.max,sm__cycles_elapsed.avg.per_second,l1tex__data_pipe_lsu_wavefronts_mem_shared.avg.pct_of_peak_sustained_elapsed,l1tex__data_bank_reads.avg.pct_of_peak_sustained_elapsed,l1tex__data_bank_writes.avg.pct_of_peak_sustained_elapsed \
    -o "$OUT/$tag" -f "$B/fa3-bench" $args > "$OUT/$tag.log" 2>&1
  ncu --import "$OUT/$tag.ncu-rep" --page raw --csv > "$OUT/$tag.raw.csv" 2>&1
  if [ "${QUICK:-0}" != 1 ]; then
    ncu --import "$OUT/$tag.ncu-rep" --page source --csv --print-source sass > "$OUT/$tag.src.csv" 2>&1
    python3 tools/ncu-stalls.py "$OUT/$tag.src.csv" --top 45 > "$OUT/$tag.stalls.txt" 2>&1
  fi
  python3 - "$OUT/$tag.raw.csv" > "$OUT/$tag.metrics.txt" <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
h = rows[0]; v = rows[2] if len(rows) > 2 else []
for i, name in enumerate(h):
    if i < len(v):
        print(f"{name} = {v[i]}")
PY
done
rm -f "$OUT"/*.ncu-rep "$OUT"/*.raw.csv "$OUT"/*.log
[ "${KEEP_SRC:-0}" = 1 ] || rm -f "$OUT"/*.src.csv
for f in "$OUT"/*.metrics.txt; do echo "=== $f"; grep -E "time_duration|sm__cycles_active.(min|avg|max)|hmma_cycles_active.avg.pct|hit_rate|dram__throughput.avg|sm__cycles_elapsed.avg.per_second|lts__throughput|lts__t_bytes|xbar2l1tex|data_bank|mem_shared|issue_active" "$f"; done
