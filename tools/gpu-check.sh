#!/usr/bin/env bash
# Prepares the one H200 device run of the CUDA backend (docs/CUDA.md), on
# THIS machine: builds the plugin, the parity suite and the benchmarks, runs
# the host-side tests, bundles everything with ../shared/tools/gpu-bundle.sh
# into .gpu/ (git-ignored), copies the PyTorch anchor scripts beside it, and
# prints the device command. The device side is tools/gpu-run.sh.
#
#   tools/gpu-check.sh            (JOBS=2 by default; WM_SHARED=../shared;
#                                  WM_GPU_SKIP_EMULATOR=1 skips the emulator suites)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
build=${WM_GPU_BUILD_DIR:-build-cuda}
shared=${WM_SHARED:-$root/../shared}
jobs=${JOBS:-2}

grep -qxF '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude

echo "== configure and build ($build, -j$jobs)"
mkdir -p "$build"
# portable host code (WM_NATIVE off): the bundle runs on the device machine's CPU, not this one's
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DWM_BUILD_CUDA=ON -DWM_NATIVE=OFF > "$build/configure.log" 2>&1 ||
  { tail -30 "$build/configure.log"; exit 1; }
targets=(wm_cuda backend_ops_tests wm_attention_bench wm_mg2_bench wmserve wmbench wmhealth
         wm_fake_plugin_noentry wm_fake_plugin_badabi wm_fake_plugin_badsize wm_fake_plugin_nodevice
         simt_attention_tests backend_ops_simt_tests)
cmake --build "$build" -j"$jobs" --target "${targets[@]}"
plugin="$build/cuda/libwm_cuda.so"
[ -f "$plugin" ] || { echo "the CUDA plugin was not built: is nvcc at /usr/local/cuda/bin?"; exit 1; }

echo "== host-side tests (the CUDA ones skip here without a GPU)"
"$build/tests/engine/backend_ops_tests" --gtest_brief=1 > "$build/host-tests.log" 2>&1 ||
  { tail -40 "$build/host-tests.log"; echo "host tests failed: fix before spending device time"; exit 1; }
grep -E "^\[  (PASSED|SKIPPED|FAILED) " "$build/host-tests.log" || true

echo "== the plugin on the kernel emulator (docs/CUDA.md): the whole parity suite, no GPU (about 3 minutes)"
# WM_GPU_SKIP_EMULATOR=1: the suites just passed on this build (ctest runs them too)
emulated=(simt_attention_tests backend_ops_simt_tests)
[ "${WM_GPU_SKIP_EMULATOR:-0}" = 1 ] && { echo "(skipped: WM_GPU_SKIP_EMULATOR=1)"; emulated=(); }
for t in "${emulated[@]}"; do
  OMP_WAIT_POLICY=passive "$build/tests/engine/$t" --gtest_brief=1 > "$build/$t.log" 2>&1 ||
    { tail -40 "$build/$t.log"; echo "$t failed on the emulator: fix before spending device time"; exit 1; }
  grep -E "^\[  (PASSED|SKIPPED|FAILED) " "$build/$t.log" || true
done

echo "== bundle into .gpu/"
# the engine dlopens OpenBLAS (engine/blas.h), so no binary names it: bundle it by name,
# the OpenMP build where it is installed (its threads are the CPU backend's own)
openblas=/usr/lib/$(gcc -print-multiarch)/openblas-openmp/libopenblas.so.0
[ -f "$openblas" ] || openblas=$(ldconfig -p | awk '/libopenblas\.so\.0 / && !f {print $NF; f = 1}')  # reads it all: no SIGPIPE
[ -n "$openblas" ] || { echo "libopenblas.so.0 not found (tools/install-deps.sh)"; exit 1; }
bash "$shared/tools/gpu-bundle.sh" .gpu "$plugin" "$build/tests/engine/backend_ops_tests" \
  "$build/bench/wm_attention_bench" "$build/bench/wm_mg2_bench" "$build"/tests/engine/libwm_fake_plugin_*.so \
  "$build/server/wmserve" "$build/clients/wmbench" "$build/clients/wmhealth" "$openblas"
mv .gpu/bin/libopenblas.so.0 .gpu/lib/
# debug info is most of the size and useless there (the plugin keeps -lineinfo for the sanitizer)
strip --strip-debug .gpu/bin/* .gpu/lib/* 2>/dev/null || true
# the checkout travels too (the trained checkpoint alone is 28 MB): files over
# 2 MB (OpenBLAS: 36 MB -> 4 MB; the plugin, mostly kernels: 20 MB -> 2.4 MB)
# travel xz-compressed, tools/gpu-run.sh inflates them first
find .gpu/lib .gpu/bin -type f -size +2M ! -name '*.xz' -print0 | xargs -0 -r xz -9 -T"$jobs"
cp "$shared/research/torch_attn.py" "$shared/research/torch_mg2_step.py" .gpu/
{
  echo "commit=$(git rev-parse HEAD 2>/dev/null || echo unknown)"
  echo "dirty_files=$(git status --porcelain 2>/dev/null | wc -l)"
  echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "nvcc=$(/usr/local/cuda/bin/nvcc --version | tail -1)"
} > .gpu/BUILD_INFO
cat .gpu/BUILD_INFO

# what travels: tracked + untracked-not-ignored files, plus the carried .gpu (limit 64 MiB)
tree_bytes=$(git ls-files -co --exclude-standard -z | xargs -0 -r stat -c %s 2>/dev/null | awk '{s+=$1} END {print s+0}')
gpu_bytes=$(du -sb .gpu | awk '{print $1}')
total=$(( (tree_bytes + gpu_bytes) / 1048576 ))
echo "== travels: working tree $((tree_bytes / 1048576)) MiB + .gpu $((gpu_bytes / 1048576)) MiB = ${total} MiB (limit 64)"
[ "$total" -lt 62 ] || { echo "too big to travel"; exit 1; }

cat <<'EOF'

== ready. On the GPU machine, from the repository root with .gpu/ copied beside it (about 8 minutes;
   results in $OUT, else /tmp/wm-gpu-out: gpu-check.log, results.json, parity.json, parity_span.json):
   source .gpu/env.sh && bash tools/gpu-run.sh
   (WM_GPU_BUDGET_S=500 by default; each stage also has its own limit;
    WM_GPU_STAGES="parity e2e" runs only the stages named)
EOF
