#!/usr/bin/env bash
# The CUDA plugin on the kernel emulator (docs/CUDA.md) under
# AddressSanitizer: every kernel's global memory accesses and the plugin's
# host code checked on the CPU, the emulator's counterpart of the GPU run's
# compute-sanitizer memcheck. Leak checking is off: a launch the emulator
# fails on purpose (SimtChecks) abandons its threads' stacks.
#
#   bash tools/simt-asan.sh [BUILD_DIR]     (default build-asan; ~45 minutes on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-asan}
asan="-fsanitize=address -fno-omit-frame-pointer"
mkdir -p "$build"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DWM_BUILD_CUDA=OFF -DCMAKE_CXX_FLAGS="$asan" \
  -DCMAKE_EXE_LINKER_FLAGS=-fsanitize=address -DCMAKE_MODULE_LINKER_FLAGS=-fsanitize=address \
  -DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=address > "$build/configure.log"
cmake --build "$build" -j"$(nproc)" --target simt_attention_tests backend_ops_simt_tests
export ASAN_OPTIONS=detect_leaks=0 OMP_WAIT_POLICY=passive
"$build/tests/engine/simt_attention_tests" --gtest_brief=1
"$build/tests/engine/backend_ops_simt_tests" --gtest_brief=1
