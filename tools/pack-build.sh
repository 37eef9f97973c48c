#!/usr/bin/env bash
# Packs what the GPU scripts need from a build (libfa3.so, fa3_tests, fa3-bench, the Python package's
# _C.so; binaries stripped)
# into one xz archive in a folder of its own, for carrying to a GPU machine: each binary holds every
# kernel instantiation (~34 MB apiece, ~2.5 MB compressed). gpu-check.sh unpacks it there (Python's
# tarfile, so no xz binary is needed). Then:  FA3_BUILD=build/carry tools/gpu-check.sh ...
#   tools/pack-build.sh [build dir, default build/release] [out dir, default build/carry]
set -euo pipefail
cd "$(dirname "$0")/.."
src=${1:-build/release}
dst=${2:-build/carry}
rm -rf "$dst" && mkdir -p "$dst"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
cp -L "$src/libfa3.so" "$stage/libfa3.so"
# The Python package's operators, when torch was there to build them.
[ -f "$src/python/fa3/_C.so" ] && cp "$src/python/fa3/_C.so" "$stage/_C.so" && strip "$stage/_C.so"
for exe in fa3_tests fa3-bench; do
  if [ -x "$src/$exe" ]; then cp "$src/$exe" "$stage/" && strip "$stage/$exe"; fi
done
tar -C "$stage" -cf - . | xz -T2 -6 > "$dst/fa3-carry.tar.xz"
du -sh "$dst"
