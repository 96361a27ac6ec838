#!/usr/bin/env bash
# Sets up, builds and runs the whole test suite: the Release build, then the same suite under
# AddressSanitizer + UndefinedBehaviorSanitizer. Set TESSERA_SKIP_SANITIZE=1 to skip the second.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
"$root/scripts/build.sh" "$root/build"
(cd "$root/build" && ctest --output-on-failure -j"$(nproc)")
if [ "${TESSERA_SKIP_SANITIZE:-0}" != "1" ]; then
  "$root/scripts/build.sh" "$root/build-asan" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DTESSERA_SANITIZE=ON -DTESSERA_BUILD_BENCH=OFF
  # Fuzzing and the multi-process tensor-parallel runs (OpenMPI is not instrumented) already ran in
  # the Release suite; ASan/UBSan covers the rest here. A test entry that
  # fails here runs once more, and fails CI only if it fails again: oneDNN 2.6 (not instrumented)
  # reads past a heap block while creating a bf16 convolution in about 1 run of 35 under ASan's
  # allocator (docs/decisions/0013-sanitizer-rerun.md). The Release pass never reruns.
  (cd "$root/build-asan" && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
    LSAN_OPTIONS=suppressions=$root/tests/lsan_suppressions.txt \
    ctest --output-on-failure -j"$(nproc)" -E '^fuzz|^tensor_parallel_mpi|^TensorParallelLaunch' \
    --repeat until-pass:2)
fi
echo "tests: all passed"
