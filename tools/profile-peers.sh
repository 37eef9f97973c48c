#!/usr/bin/env bash
# ncu on cuDNN's and fa3's forward kernels for the same inputs, one launch each (launch config:
# grid, block, registers, smem; duration, tensor pipe, DRAM, L2): to see how a peer tiles a shape.
#   run(command="FA3_BUILD=build/carry tools/profile-peers.sh", carry=["build/carry"])
# Environment: SHAPES ("hdim:seqlen:causal ...", 16k tokens, hidden 2048 as compare.py), OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}; B=${FA3_BUILD:-build/release}; mkdir -p "$OUT"
cat > "$OUT/peers_driver.py" <<'PY'
import sys, torch
sys.path.insert(0, "bench")
import fa3_ctypes
from torch.nn.attention import sdpa_kernel, SDPBackend
lib = fa3_ctypes.load(sys.argv[1])
d, s, c = (int(x) for x in sys.argv[2:5])
b, h = max(1, 16384 // s), 2048 // d
q, k, v = (torch.randn(b, s, h, d, dtype=torch.bfloat16, device="cuda") for _ in range(3))
o = torch.empty_like(q)
p = fa3_ctypes.fwd_params(lib, q, k, v, o, causal=bool(c))
st = torch.cuda.current_stream().cuda_stream
for impl in ("cudnn", "fa3"):
    for it in range(3):
        torch.cuda.nvtx.range_push(f"{impl}{it}")
        if impl == "fa3":
            fa3_ctypes.run_forward(lib, p, st)
        else:
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                                                 v.transpose(1, 2), is_causal=bool(c))
        torch.cuda.nvtx.range_pop()
torch.cuda.synchronize()
PY
metrics=launch__grid_size,launch__block_size,launch__registers_per_thread,launch__shared_mem_per_block_dynamic,launch__cluster_dim_x,launch__cluster_dim_y,gpu__time_duration.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct,smsp__issue_active.avg.pct_of_peak_sustained_active,sm__cycles_active.max,sm__cycles_active.avg,sm__cycles_elapsed.avg.per_second,sm__warps_active.avg.pct_of_peak_sustained_active
for shape in ${SHAPES:-64:512:1 64:1024:1 256:512:1}; do
  IFS=: read -r d s c <<<"$shape"; tag="peers_d${d}_s${s}_c${c}"
  timeout 300 ncu --clock-control none --nvtx --nvtx-include "cudnn2/" --nvtx-include "fa32/" --metrics $metrics --section WarpStateStats --section InstructionStats \
    --csv --page raw python3 "$OUT/peers_driver.py" "$B/libfa3.so" "$d" "$s" "$c" > "$OUT/$tag.csv" 2> "$OUT/$tag.err"
  echo "=== d=$d s=$s causal=$c"
  python3 - "$OUT/$tag.csv" <<'PY'
import csv, sys
lines = [l for l in open(sys.argv[1]) if l.startswith('"')]
rows = list(csv.reader(lines))
if len(rows) < 3: print(open(sys.argv[1]).read()[-2000:]); sys.exit()
h = rows[0]
keep = "launch__grid_size launch__block_size launch__registers_per_thread launch__shared_mem_per_block_dynamic".split()
def want(k):
    if k in keep or k.startswith(("gpu__time_duration.sum", "dram__bytes", "lts__t_sector_hit")):
        return True
    if k.startswith(("sm__pipe_tensor", "smsp__issue_active", "sm__cycles_active")) and ".avg" in k:
        return True
    if k.startswith("smsp__inst_executed.sum") or k == "smsp__inst_executed.avg.per_cycle_active":
        return True
    return "issue_stalled" in k and k.endswith("per_warp_active.pct")
for r in rows[2:]:
    rec = dict(zip(h, r))
    print(rec.get("Kernel Name", "?")[:90])
    for k in h:
        if want(k):
            print(f"   {k} = {rec[k]}")
PY
done
