#!/usr/bin/env bash
# One command for the H200: (re)build if needed, GPU tests, SASS/ptxas checks, sanitizers,
# benchmark + ablation, compare.py against cuDNN/FA2 in one process; logs/JSON/PNG to $OUT;
# a short summary table last.
#
#   tools/gpu-check.sh [all|tests|bench|compare|bwd|decode|sanitize|python|pip]...   (default: all)
#
# On another machine, carrying a build made here (no rebuild there):
#   cmake --workflow --preset release && tools/pack-build.sh      # here
#   FA3_BUILD=build/carry tools/gpu-check.sh                     # there, build/carry copied along
# Environment: OUT (default ./out), FA3_BUILD (default build/release), TEST_FILTER (gtest filter),
# COMPARE_ARGS (extra compare.py flags, default --quick), BWD_ARGS (extra compare_bwd.py flags),
# BENCH_ARGS (extra fa3-bench flags), DECODE_ARGS (extra compare_decode.py flags),
# SANITIZE_FILTER / SANITIZE_TOOLS / SANITIZE_RANDOM_CASES / SANITIZE_TIMEOUT (the sanitizer step).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
BUILD=${FA3_BUILD:-build/release}
mkdir -p "$OUT"
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(all)
want() { for s in "${steps[@]}"; do [ "$s" = all ] || [ "$s" = "$1" ] && return 0; done; return 1; }
summary=()
note() { summary+=("$(printf '%-22s %s' "$1" "$2")"); }
failed=()  # steps whose exit status was not 0: the script's own exit status is 1 then

if [ -f "$BUILD/fa3-carry.tar.xz" ] && [ ! -f "$BUILD/libfa3.so" ]; then  # tools/pack-build.sh's archive
  python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" "$BUILD/fa3-carry.tar.xz" "$BUILD"
fi
if [ ! -f "$BUILD/libfa3.so" ]; then
  echo "== building (no carried build found in $BUILD)"
  cmake --workflow --preset release > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv,noheader \
  | tee "$OUT/gpu.txt"

if want tests && [ ! -x "$BUILD/fa3_tests" ]; then
  note "gpu tests" "not built (GoogleTest missing when $BUILD was configured)"
elif want tests; then
  echo "== GPU tests"
  # The binary's status is kept (a crash or a timeout leaves no PASSED/FAILED line); the log is
  # filtered afterwards, so that a long excerpt cannot stop the tests through a closed pipe.
  timeout ${TEST_TIMEOUT:-420} "$BUILD/fa3_tests" --gtest_filter="${TEST_FILTER:-*}" > "$OUT/tests.log" 2>&1
  rc=$?
  grep -E "^\[  (FAILED|  OK|PASSED|SKIPPED) |Failure|error|seed|Expected|Which is|rel_fro" "$OUT/tests.log" | head -150
  note "gpu tests" "rc=$rc $(grep -cE '^\[  SKIPPED \]' "$OUT/tests.log") skipped; $(grep -E '^\[  PASSED|^\[  FAILED  \] [0-9]+ test' "$OUT/tests.log" | tr '\n' ' ')"
  [ $rc -eq 0 ] || failed+=("gpu tests")
  sass=$(cuobjdump --dump-sass "$BUILD/libfa3.so" 2>/dev/null)
  note "SASS" "HGMMA $(grep -c HGMMA <<<"$sass"), local ld/st $(grep -cE 'LDL|STL' <<<"$sass")"
fi

if want sanitize; then
  # Small configurations of every path: zero tiles, zero-length sequences, and a few dozen random
  # configurations (softcap, varlen, head-dim pairs, masks, strides) of the randomised test.
  echo "== compute-sanitizer (small configs)"
  filter=${SANITIZE_FILTER:-'FwdGpu.RowsWithoutKeysAndNoLse:FwdGpu.CombineNeverReadsEmptySplits:FwdGpu.ZeroLengthSequences:FwdGpu.Fp8SmallCases:FwdRandomGpu.*:HopperPrims.*:BwdGpu.UnequalLengthsGqaWindows:BwdGpu.VarlenSequsedAndEmptySequences:BwdRandomGpu.*'}
  for tool in ${SANITIZE_TOOLS:-memcheck racecheck synccheck initcheck}; do
    FA3_RANDOM_CASES=${SANITIZE_RANDOM_CASES:-24} FA3_BWD_RANDOM_CASES=${SANITIZE_RANDOM_CASES:-24} timeout ${SANITIZE_TIMEOUT:-150} compute-sanitizer --tool $tool \
      --error-exitcode 9 "$BUILD/fa3_tests" --gtest_filter="$filter" > "$OUT/sanitize-$tool.log" 2>&1
    rc=$?
    note "sanitizer $tool" "rc=$rc $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitize-$tool.log" | tail -1)"
    [ $rc -eq 0 ] || failed+=("sanitizer $tool")
  done
fi

if want bench; then
  echo "== fa3-bench"
  timeout 300 "$BUILD/fa3-bench" ${BENCH_ARGS:-} --json "$OUT/bench.json" 2>&1 | tee "$OUT/bench.log"
  timeout 120 "$BUILD/fa3-bench" --ablation 2>&1 | tee "$OUT/ablation.log"
fi

if want compare; then
  echo "== compare.py (fa3 vs cuDNN vs FA2, one process)"
  PYTHONUNBUFFERED=1 timeout 420 python3 bench/compare.py --lib "$BUILD/libfa3.so" ${COMPARE_ARGS:---quick} \
    --json "$OUT/compare.json" --png "$OUT/compare.png" 2>&1 | tee "$OUT/compare.log"
  note "compare.py" "exit ${PIPESTATUS[0]}"
fi

if want bwd; then
  echo "== compare_bwd.py (fa3 backward vs cuDNN vs FA2, one process)"
  PYTHONUNBUFFERED=1 timeout 420 python3 bench/compare_bwd.py --lib "$BUILD/libfa3.so" ${BWD_ARGS:-} \
    --json "$OUT/compare_bwd.json" --png "$OUT/compare_bwd.png" 2>&1 | tee "$OUT/compare_bwd.log"
  note "compare_bwd.py" "exit ${PIPESTATUS[0]}"
fi

if want decode; then
  echo "== compare_decode.py (fa3 decoding vs cuDNN vs FA2, one process)"
  PYTHONUNBUFFERED=1 timeout 420 python3 bench/compare_decode.py --lib "$BUILD/libfa3.so" ${DECODE_ARGS:-} \
    --json "$OUT/compare_decode.json" 2>&1 | tee "$OUT/compare_decode.log"
  note "compare_decode.py" "exit ${PIPESTATUS[0]}"
fi

if want python; then
  # The Python package's tests (CPU and GPU parts) on the carried or built _C.so, then the host
  # cost of a call from PyTorch.
  lib="$BUILD/_C.so"; [ -f "$lib" ] || lib="$BUILD/python/fa3/_C.so"
  if [ ! -f "$lib" ]; then
    note "python tests" "no _C.so in $BUILD (torch was not importable when it was configured)"
  else
    echo "== python package tests"
    PYTHONPATH=python FA3_TORCH_LIB="$lib" timeout ${PYTEST_TIMEOUT:-600} python3 -m pytest -q -p no:cacheprovider -rs \
      ${PYTEST_ARGS:-} python/tests > "$OUT/pytest.log" 2>&1
    rc=$?
    tail -40 "$OUT/pytest.log"
    note "python tests" "rc=$rc $(tail -1 "$OUT/pytest.log")"
    [ $rc -eq 0 ] || failed+=("python tests")
    PYTHONPATH=python FA3_TORCH_LIB="$lib" timeout 120 python3 bench/torch_overhead.py --lib "$BUILD/libfa3.so" \
      --json "$OUT/torch_overhead.json" 2>&1 | tee "$OUT/torch_overhead.log"
  fi
fi

if want pip; then
  # The README's install command, timed, into a scratch folder; then the installed package's import.
  echo "== pip install --no-build-isolation ."
  start=$(date +%s)
  python3 -m pip install --no-build-isolation --no-deps --no-cache-dir --target /tmp/fa3-pip . \
    > "$OUT/pip.log" 2>&1
  rc=$?
  note "pip install" "rc=$rc in $(( $(date +%s) - start )) s on $(nproc) cores"
  PYTHONPATH=/tmp/fa3-pip python3 -c "import fa3, torch; q = torch.randn(1, 64, 2, 64, device='cuda', dtype=torch.bfloat16); print('installed fa3:', fa3._ops.library_path(), fa3.flash_attn_func(q, q, q).shape)" \
    2>&1 | tee -a "$OUT/pip.log" | tail -2
fi

echo
echo "================ summary ================"
[ -f "$OUT/gpu.txt" ] && echo "gpu: $(cat "$OUT/gpu.txt")"
for line in "${summary[@]}"; do echo "$line"; done
[ -f "$OUT/ablation.log" ] && tail -4 "$OUT/ablation.log"
[ -f "$OUT/compare.log" ] && grep -E "^ *(64|96|128|192|256) " "$OUT/compare.log" | head -40
[ -f "$OUT/compare.log" ] && sed -n '/extras summary/,$p' "$OUT/compare.log" | head -30
[ -f "$OUT/torch_overhead.log" ] && cat "$OUT/torch_overhead.log"
[ -f "$OUT/compare_decode.log" ] && sed -n '/^# summary/,$p' "$OUT/compare_decode.log" | head -30
[ -f "$OUT/compare_bwd.log" ] && grep -E "^ *(64|96|128|192|256) |geometric|PROBLEM" "$OUT/compare_bwd.log" | head -40
if [ ${#failed[@]} -gt 0 ]; then
  echo "FAILED: ${failed[*]}"
  exit 1
fi
exit 0
