#!/usr/bin/env bash
# Builds the safetensors header fuzz target with clang (libFuzzer + ASan + UBSan), apart from
# the main build, and runs it for TESSERA_FUZZ_SECONDS (default 30) on the seed corpus.
# Exit 0: nothing found; 77: clang++-14 is absent (ctest SKIP); other: a crash or build failure.
# Usage: run_fuzz.sh <repo root> <build dir>
set -euo pipefail
src=$(cd "$1" && pwd)
out="$2/fuzz"
cxx="${TESSERA_FUZZ_CXX:-clang++-14}"
seconds="${TESSERA_FUZZ_SECONDS:-30}"
if ! command -v "$cxx" >/dev/null 2>&1; then
  echo "fuzz: $cxx not found; skipping"
  exit 77
fi
mkdir -p "$out/corpus" "$out/artifacts"
bin="$out/safetensors_header_fuzz"
sources=("$src/tests/fuzz/safetensors_header_fuzz.cpp" "$src/src/io/safetensors_header.cpp"
         "$src/src/runtime/dtype.cpp")
stale=0
[ -x "$bin" ] || stale=1
for f in "${sources[@]}" "$src/src/io/safetensors.h" "$src/src/runtime/dtype.h" "$0"; do
  [ "$f" -nt "$bin" ] && stale=1
done
if [ "$stale" = 1 ]; then
  echo "fuzz: building $bin"
  "$cxx" -std=c++20 -O1 -g -fno-omit-frame-pointer \
    -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
    -I"$src/src" "${sources[@]}" -o "$bin.tmp"
  mv "$bin.tmp" "$bin"
fi
echo "fuzz: running for ${seconds}s"
# The first corpus folder receives new inputs; the seeds and malformed fixtures are read only.
"$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=8192 \
  -dict="$src/tests/fuzz/safetensors.dict" -artifact_prefix="$out/artifacts/" \
  -print_final_stats=1 \
  "$out/corpus" "$src/tests/fuzz/corpus" "$src/tests/fixtures/malformed"
