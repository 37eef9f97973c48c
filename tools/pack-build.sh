#!/usr/bin/env bash
# Copies what the GPU scripts need from a build (libfa3.so, fa3_tests, fa3-bench; binaries stripped)
# into one small folder, for carrying to a GPU machine (the whole build folder, object files
# included, is ~60 MB). Then:  FA3_BUILD=build/carry tools/gpu-check.sh ...
#   tools/pack-build.sh [build dir, default build/release] [out dir, default build/carry]
set -euo pipefail
cd "$(dirname "$0")/.."
src=${1:-build/release}
dst=${2:-build/carry}
rm -rf "$dst" && mkdir -p "$dst"
cp -L "$src/libfa3.so" "$dst/libfa3.so"
for exe in fa3_tests fa3-bench; do
  if [ -x "$src/$exe" ]; then cp "$src/$exe" "$dst/" && strip "$dst/$exe"; fi
done
du -sh "$dst"
