#!/usr/bin/env bash
# The host side of the public API under AddressSanitizer and UndefinedBehaviorSanitizer, on any
# machine (no GPU needed): the API's host sources (validation, dispatch, workspace and split plans,
# the append's and combine's host parts) compiled with the sanitizers and linked with a release
# build's kernel instantiations (device code and launch stubs, not instrumented), then the
# validation tests and the argument fuzzer (tests/test_api_fuzz.cpp) run; any sanitizer report
# fails the run.
#   tools/host-sanitize.sh [release build dir, default build/release]
#   FA3_FUZZ_TRIALS=N: trials per starting call (default here 20000)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build/release}
objs=$build/CMakeFiles/fa3_objects.dir
[ -d "$objs/instantiations" ] || { echo "no kernel objects in $objs: build the release preset first" >&2; exit 2; }
out=$build/host-sanitize
mkdir -p "$out"
san=(-fsanitize=address -fsanitize=undefined -fno-sanitize-recover=all -fno-omit-frame-pointer -g -O1)
nvcc_san=()
for f in "${san[@]}"; do nvcc_san+=("-Xcompiler=$f"); done
inc="-Iinclude -I. -I$build"
cuda_flags="-gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -std=c++17"
# The library's own sources, as the build lists them (its objects outside instantiations/), and
# the two host-side test files.
mapfile -t sources < <(cd "$objs" && find src -name '*.o' | sed 's/\.o$//' | sort)
sources+=(tests/test_validation.cpp tests/test_api_fuzz.cpp)
built=()
for f in "${sources[@]}"; do
  [ -f "$f" ] || continue  # (an object left from a source since removed)
  o=$out/$(echo "$f" | tr / _).o
  case $f in
    *.cu) nvcc $cuda_flags "${nvcc_san[@]}" $inc -c "$f" -o "$o" ;;
    *) g++ -std=c++17 "${san[@]}" $inc -c "$f" -o "$o" ;;
  esac
  built+=("$o")
done
g++ "${san[@]}" -o "$out/host_tests" "${built[@]}" "$objs"/instantiations/*.o \
  -lgtest_main -lgtest -L"${CUDA_HOME:-/usr/local/cuda}/lib64" -lcudart_static -ldl -lrt -lpthread
export FA3_FUZZ_TRIALS=${FA3_FUZZ_TRIALS:-20000}
# (detect_leaks=0: the CUDA runtime's own allocations at exit are not fa3's)
ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1 "$out/host_tests" --gtest_brief=1
