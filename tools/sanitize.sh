#!/usr/bin/env bash
# The CPU build and its tests under AddressSanitizer or
# UndefinedBehaviorSanitizer (ThreadSanitizer: tools/tsan.sh; the CUDA
# plugin on the emulator under AddressSanitizer: tools/simt-asan.sh).
#
#   bash tools/sanitize.sh address   [BUILD_DIR]   (default build-asan; ~30 minutes on 2 cores)
#   bash tools/sanitize.sh undefined [BUILD_DIR]   (default build-ubsan; ~45 minutes, emulator suites included)
#
# address: every test but the emulator suites (tools/simt-asan.sh covers the
# plugin). Leak checking is off (gRPC and Abseil keep their singletons), and
# a failed allocation returns null as it does without the tool, so the tests
# of allocation failures run. The one test that bounds the server's memory
# (a slow reader) runs apart without the freed-memory quarantine, which
# would hold up to 256 MiB by design.
# undefined: float-to-int overflow included, and the first report aborts the
# program, so a test with undefined behaviour fails.
# Exit 0 when every test passed.
set -euo pipefail
cd "$(dirname "$0")/.."
kind=${1:-}
case "$kind" in
  address)
    build=${2:-build-asan}
    flags="-fsanitize=address -fno-omit-frame-pointer"
    ;;
  undefined)
    build=${2:-build-ubsan}
    flags="-fsanitize=undefined,float-cast-overflow -fno-sanitize-recover=all -fno-omit-frame-pointer"
    ;;
  *)
    echo "usage: tools/sanitize.sh address|undefined [BUILD_DIR]" >&2
    exit 2
    ;;
esac
mkdir -p "$build"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DWM_BUILD_CUDA=OFF -DCMAKE_CXX_FLAGS="$flags" \
  -DCMAKE_C_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=$kind" -DCMAKE_MODULE_LINKER_FLAGS="-fsanitize=$kind" \
  -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=$kind" > "$build/configure.log"
cmake --build "$build" -j"$(nproc)"
export OMP_WAIT_POLICY=passive
cd "$build"
if [ "$kind" = address ]; then
  ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1 \
    ctest -j"$(nproc)" --timeout 900 --output-on-failure -E "simt|Simt|ASlowReader"
  ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1:quarantine_size_mb=0 \
    ctest --timeout 900 --output-on-failure -R ASlowReader
else
  UBSAN_OPTIONS=print_stacktrace=1 ctest -j"$(nproc)" --timeout 900 --output-on-failure
fi
