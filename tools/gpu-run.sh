#!/usr/bin/env bash
# The H200 device run of the CUDA backend, from the repo root, after
# `source .gpu/env.sh` (tools/gpu-check.sh prepares .gpu/ and prints the call).
# Stages, in this order, each under its own time limit and all under one
# budget, each continuing whatever the one before did; results are rewritten
# after every stage so that a cut-off run still returns what it measured:
#   info        nvidia-smi
#   wgmma       backend_ops_tests: the plain wgmma attention kernel's parity
#               cases alone (fp16 and KIVI-2 caches; the span formats' wait for `span`)
#   overlap     the same for the overlapped wgmma kernel, the default for
#               64-query tiles; if its cases fail or crash, every later stage
#               runs with WM_CUDA_ATTENTION=mma (the plain wgmma kernel serves
#               head_dim 128 only)
#   ws          the same for the warp-specialised kernel (attention_ws.cuh), the
#               default for 128-query tiles at head_dim 128
#   ws_tma      its build that copies whole key tiles by TMA (not a default):
#               the TMA timings below run only where these cases passed
#   parity      backend_ops_tests: every other op, CPU vs CUDA     -> $OUT/parity.json
#   span        QVG-2 / QuantWM-2: the device coder's codes against the CPU's,
#               also with the coder split between host and device ("span.coder":
#               the whole coder on the host, the host's k-means with the device's
#               token codes), the auto choice's checks and fallback, attention
#               over their pages on every kernel             -> $OUT/parity_span.json
#   e2e         backend_ops_tests: whole sessions, CPU vs CUDA PSNR (the span
#               formats with the auto choice: what a server does by default)
#   e2e_span_host  the span formats' sessions again with WM_CUDA_SPAN_CODER=host
#   memcheck    compute-sanitizer memcheck on the smoke test (every kernel once, the
#               quantized formats' write passes and decoders too)
#   racecheck   compute-sanitizer racecheck on the same
#   attention   wm_attention_bench (JSON lines), every kernel
#   attention_stages  the overlapped kernel with 3, 4 and 5 K/V stages, ping-pong or not
#   attention_ws  the warp-specialised kernel with 3 and 4 stages, 64 and 128 keys a step
#   attention_ws_ablate  the default 128-query kernel (by cp.async and by TMA, 64 and 128
#               keys a step) at 2640 queries over 64k cached tokens whole, with its loads
#               alone and with its consumers alone ("attention.ws_ablate"): which half sets its time
#   attention_ws_tma  its TMA build against its cp.async build at 2640 queries, and with
#               5 and 6 stages (the TMA build only)
#   torch_attn  ../shared/research/torch_attn.py, same machine, same call
#   mg2         wm_mg2_bench (Matrix-Game-2 shapes, sessions x window)
#   torch_mg2   ../shared/research/torch_mg2_step.py
#   mg2_overlap, mg2_stages  the forward with the overlapped kernel for 128-query
#               tiles (and with its fastest stages, where not the default)
#   serving     tools/serving_capacity.sh: wmserve --device cuda on the default
#               model with --device_graphs=false (every op of every pass issued),
#               how many players hold 20 frames/s with p99 < 100 ms
#   serving_graphs  the same with --device_graphs (the default)
#   attention_kivi2  wm_attention_bench over KIVI-2 caches (64-query blocks; CUDA.md, "KIVI-2 pages")
#   attention_quantwm2  the same over QuantWM-2 caches (CUDA.md, "Span pages")
#   mg2_quantwm2  wm_mg2_bench over QuantWM-2 caches (1 and 8 sessions, window 6):
#               span attention, and the write pass with the device coder
#   audit_probe  wm_attention_bench --probe=1: audit mode's drift probe of one
#               Matrix-Game-2 call, QuantWM-2 against fp16, on the device and on the host
#   mg2_invariant  wm_mg2_bench with every session batch-invariant (8 sessions,
#               window 6): what per-session GEMMs and attention launches cost
#   mg2_ws128   the forward with the warp-specialised kernel at 128 keys a step
#   mg2_ws_tma  the same with whole key tiles copied by TMA, at the stages and keys a step
#               that timed fastest in attention_ws_tma
#   ncu_ws64, ncu_ws128, ncu_ws_tma  Nsight Compute's counters for one
#               warp-specialised launch (64 and 128 keys a step, 64 by TMA)
#               at 2640 queries over 16k cached tokens
#   ncu_sass    the default 128-query kernel's launch instruction by instruction: its
#               SASS with the warp-state samples taken at each instruction
#               ($OUT/ws-sass.csv; tools/ncu_sass_hotspots.py prints the hot spots)
#   ncu_split   each kernel's duration for a 64-query block over 64k cached
#               tokens (input conversion, split attention, combine)
# $OUT gets gpu-check.log (every stage's output), results.json (everything
# parsed, with the PyTorch ratios), parity.json, parity_span.json, the
# servers' logs and ws-sass.csv (at most 8 files come back from a device call).
# WM_GPU_STAGES="parity e2e" runs only the stages named (a rerun after a fix).
# WM_GPU_STAGES=tma names the stages that decide the warp-specialised kernel's
# default (cp.async or TMA, its stages and keys a step), the forward's rate
# beside PyTorch's and where the default kernel's warps wait (ncu_sass), within
# one call: what the whole script's 500 s reaches only late, after the
# correctness stages and the serving runs.
set -u
if [ "${WM_GPU_STAGES:-}" = tma ]; then
  WM_GPU_STAGES="info ws ws_tma attention_ws_ablate attention_ws_tma torch_attn mg2 torch_mg2 mg2_ws_tma ncu_sass ncu_ws_tma"
fi
OUT=${OUT:-/tmp/wm-gpu-out}
mkdir -p "$OUT"
raw=$(mktemp -d /tmp/wm-gpu-raw.XXXXXX)
log="$OUT/gpu-check.log"
budget=${WM_GPU_BUDGET_S:-500}
start=$(date +%s)
: > "$log"
echo "stage,rc,seconds,limit" > "$raw/stages.csv"
export PYTHONUNBUFFERED=1
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-16}
# the CPU backend's OpenMP workers must sleep between loops: spinning, they
# starve OpenBLAS's threads and the CUDA host thread (docs/PERFORMANCE.md)
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}

# the PyTorch scripts get the machine's own libraries, not the bundle's
py_ld=$(printf '%s' "${LD_LIBRARY_PATH:-}" | tr ':' '\n' | grep -v '/\.gpu/' | paste -sd: -)

ncu=""
for c in "$(command -v ncu 2>/dev/null)" /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu; do
  if [ -n "$c" ] && [ -x "$c" ]; then ncu=$c; break; fi
done
sanitizer=""
for c in "$(command -v compute-sanitizer 2>/dev/null)" /usr/local/cuda/bin/compute-sanitizer \
         /usr/local/cuda/compute-sanitizer/compute-sanitizer /opt/nvidia/compute-sanitizer/compute-sanitizer; do
  if [ -n "$c" ] && [ -x "$c" ]; then sanitizer=$c; break; fi
done

results() {
  python3 tools/gpu_results.py "$raw" "$OUT/results.json" .gpu/BUILD_INFO >> "$raw/results.log" 2>&1 || true
}

# stage NAME LIMIT_S COMMAND...: output to $raw/NAME.out and the log
# libraries gpu-check.sh compressed to fit the 64 MiB transfer
for z in .gpu/lib/*.xz .gpu/bin/*.xz; do
  [ -e "$z" ] || continue
  if [ ! -e "${z%.xz}" ]; then
    xz -d -k "$z" 2>/dev/null ||
      python3 -c "import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], 'wb'))" "$z" "${z%.xz}" ||
      echo "cannot inflate $z" | tee -a "$log"
    case "$z" in .gpu/bin/*) chmod +x "${z%.xz}" 2>/dev/null || true ;; esac
  fi
done

stage() {
  local name=$1 limit=$2
  shift 2
  local now left t rc t0 t1
  if [ -n "${WM_GPU_STAGES:-}" ] && [[ " $WM_GPU_STAGES " != *" $name "* ]]; then
    return  # not asked for this time
  fi
  now=$(date +%s)
  left=$((budget - (now - start)))
  if [ "$left" -lt 15 ]; then
    echo "=== $name: skipped, ${left}s of the budget left" | tee -a "$log"
    echo "$name,skipped,0,0" >> "$raw/stages.csv"
    return
  fi
  t=$((limit < left ? limit : left))
  echo "=== $name (limit ${t}s, $((now - start))s into the run): $*" | tee -a "$log"
  t0=$(date +%s.%N)
  timeout --kill-after=5 "$t" "$@" > "$raw/$name.out" 2>&1
  rc=$?
  t1=$(date +%s.%N)
  cat "$raw/$name.out" >> "$log"
  local secs
  secs=$(python3 -c "print(round($t1 - $t0, 1))" 2>/dev/null || echo 0)
  echo "=== $name: rc=$rc in ${secs}s$([ $rc -eq 124 ] || [ $rc -eq 137 ] && echo ' (TIMED OUT)')" | tee -a "$log"
  echo "$name,$rc,$secs,$t" >> "$raw/stages.csv"
  results
}

stage info 10 bash -c 'nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.sm,clocks.max.sm,power.draw --format=csv; cat .gpu/BUILD_INFO; echo "sanitizer: '"${sanitizer:-none}"'"; ldd .gpu/bin/libwm_cuda.so | grep -E "cublas|cudart|not found"'
# the newest kernels first and alone: a fault in one must not take the rest of the report with it
# (the span formats' cases wait for the span stage: their references are the CPU coder's codes, so a
# coder fault fails them on every kernel, and must not send every later stage to mma.sync)
span_cases='*qvg2*:*quantwm2*:*mixed_span*:CudaSpan.*'
stage wgmma 25 .gpu/bin/backend_ops_tests --gtest_filter="*kernel2*:-$span_cases" --gtest_output=json:"$raw/parity_wgmma.json"
stage overlap 25 .gpu/bin/backend_ops_tests --gtest_filter="*kernel3*:-$span_cases" --gtest_output=json:"$raw/parity_overlap.json"
stage ws 25 .gpu/bin/backend_ops_tests --gtest_filter="*kernel4*:-$span_cases:*ws_tma1*" \
  --gtest_output=json:"$raw/parity_ws.json"
# its TMA build apart (not a default yet): a fault there must not stop the cp.async build's timings
stage ws_tma 25 .gpu/bin/backend_ops_tests --gtest_filter="*ws_tma1*:-$span_cases" \
  --gtest_output=json:"$raw/parity_ws_tma.json"
failed() {  # the stage ran and did not pass
  grep -q "^$1," "$raw/stages.csv" && ! grep -q "^$1,0," "$raw/stages.csv"
}
passed() { grep -q "^$1,0," "$raw/stages.csv"; }
if [ -z "${WM_CUDA_ATTENTION:-}" ]; then
  # the plain wgmma kernel is built for head_dim 128 only (64, the default model's, runs the
  # overlapped one): when the overlapped kernel fails, only mma.sync is safe for every stage
  if failed overlap; then
    export WM_CUDA_ATTENTION=mma
  elif failed wgmma; then
    export WM_CUDA_ATTENTION=overlap
  fi
  if [ -n "${WM_CUDA_ATTENTION:-}" ]; then
    echo "=== a wgmma kernel failed its parity cases: later stages use WM_CUDA_ATTENTION=$WM_CUDA_ATTENTION" | tee -a "$log"
  fi
fi
echo "attention_kernel=${WM_CUDA_ATTENTION:-auto}" > "$raw/attention_kernel.txt"
attention_kernels=all
[ "${WM_CUDA_ATTENTION:-}" = mma ] && attention_kernels=mma
# two stages, so that a hang or a crash in one still leaves the other's report
stage parity 60 .gpu/bin/backend_ops_tests --gtest_filter="-CudaEndToEnd.*:*kernel2*:*kernel3*:*kernel4*:$span_cases" \
  --gtest_output=json:"$OUT/parity.json"
# QVG-2 / QuantWM-2 on the device: the coder's codes against the CPU's, bit for bit (CudaSpan.*; one case
# also with one warp per job, "span.threads"), and attention over their pages on every kernel
stage span 90 .gpu/bin/backend_ops_tests --gtest_filter="$span_cases" --gtest_output=json:"$OUT/parity_span.json"
stage e2e 120 env OMP_NUM_THREADS=8 .gpu/bin/backend_ops_tests --gtest_filter='CudaEndToEnd.*' --gtest_output=json:"$raw/parity_e2e.json"
# the same span sessions coded on the host: how far the device coder alone takes them from the CPU's
stage e2e_span_host 60 env OMP_NUM_THREADS=8 WM_CUDA_SPAN_CODER=host .gpu/bin/backend_ops_tests \
  --gtest_filter='CudaEndToEnd.SpanSessionsMatchTheCpu' --gtest_output=json:"$raw/parity_e2e_span_host.json"
if [ -n "$sanitizer" ]; then
  for tool in memcheck racecheck; do
    stage "$tool" 45 "$sanitizer" --tool "$tool" --error-exitcode 7 --print-limit 30 \
      .gpu/bin/backend_ops_tests --gtest_filter='CudaSanitizerSmoke.*:CudaKvCache.Batched*'
  done
else
  echo "=== memcheck, racecheck: no compute-sanitizer found" | tee -a "$log"
fi
stage attention 50 .gpu/bin/wm_attention_bench --kernel=$attention_kernels
# the overlapped kernel with 3, 4 and 5 K/V stages ("attention.stages"), its warpgroups in ping-pong or not
[ "$attention_kernels" = all ] &&
  stage attention_stages 50 .gpu/bin/wm_attention_bench --kernel=overlap --stages=3,4,5 --pingpong=0,1
# the warp-specialised kernel (the default for 128-query tiles at head_dim 128), where its parity cases passed
[ "$attention_kernels" = all ] && passed ws &&
  stage attention_ws 60 .gpu/bin/wm_attention_bench --kernel=ws --stages=3,4 --pingpong=0,1 --ws_keys=64,128
# the same kernel whole, with its loads alone and with its consumers alone (outputs wrong in the last two):
# near the loads' time it waits on memory, near the consumers' on its own path, near their sum on both in turn
[ "$attention_kernels" = all ] && passed ws &&
  stage attention_ws_ablate 30 .gpu/bin/wm_attention_bench --kernel=ws --queries=2640 --cached=65536 \
    --ws_keys=64,128 --ws_tma="$(passed ws_tma && echo 0,1 || echo 0)" --ws_ablate=0,1,2
# and its TMA build against its cp.async build at Matrix-Game-2's 2640 queries, side by side: the defaults
# (4 stages of 64 keys, 3 of 128, ping-pong) by both, and the TMA build's deeper rings, 5 and 6 stages of 64
[ "$attention_kernels" = all ] && passed ws && passed ws_tma &&
  stage attention_ws_tma 60 .gpu/bin/wm_attention_bench --kernel=ws --queries=2640 --stages=0,5,6 --ws_keys=64,128 \
    --ws_tma=0,1
stage torch_attn 45 env LD_LIBRARY_PATH="$py_ld" python3 .gpu/torch_attn.py
stage mg2 110 .gpu/bin/wm_mg2_bench --config=configs/mg2-shape.json
# PyTorch's forward right after ours, so that a short budget cannot drop the ratio's other half
stage torch_mg2 80 env LD_LIBRARY_PATH="$py_ld" python3 .gpu/torch_mg2_step.py
# the forward with the overlapped kernel, the default for 128-query tiles until 2026-12-04 (3 stages,
# ping-pong; mg2 runs the warp-specialised one there: 4 stages of 64 keys), and with the overlapped
# kernel's stage count and ping-pong setting that timed fastest at 2640 queries, where not 3 and on
[ "$attention_kernels" = all ] &&
  stage mg2_overlap 80 env WM_CUDA_ATTENTION=overlap .gpu/bin/wm_mg2_bench --config=configs/mg2-shape.json \
    --sessions=1,8
best=$(python3 tools/gpu_results.py --best-stages "$raw/attention_stages.out" 2>/dev/null || true)
if [ "$attention_kernels" = all ] && [ -n "$best" ] && [ "$best" != "3 1" ]; then
  stage mg2_stages 80 env WM_CUDA_ATTENTION=overlap WM_CUDA_ATTENTION_STAGES="${best% *}" \
    WM_CUDA_ATTENTION_PINGPONG="${best#* }" .gpu/bin/wm_mg2_bench --config=configs/mg2-shape.json --sessions=1,8
fi
# 6 s a step: with 3 s the same kernels gave 30 to 52 sessions in three runs
stage serving 90 env BUDGET_S=70 SECONDS_PER_RUN=6 OUT="$raw/capacity" LADDER="1 2 4 8 16 32 64 128 256" \
  bash tools/serving_capacity.sh .gpu/bin --device cuda --device_graphs=false --kv_budget_bytes 8589934592 \
  --encoder_threads 6 --threads 4
cp "$raw/capacity/wmserve.log" "$OUT/serving-wmserve.log" 2>/dev/null
# the same with each step's denoising passes run from a recorded CUDA graph
stage serving_graphs 90 env BUDGET_S=70 SECONDS_PER_RUN=6 OUT="$raw/capacity_graphs" \
  LADDER="1 2 4 8 16 32 64 128 256" bash tools/serving_capacity.sh .gpu/bin --device cuda --device_graphs \
  --kv_budget_bytes 8589934592 --encoder_threads 6 --threads 4
cp "$raw/capacity_graphs/wmserve.log" "$OUT/serving-graphs-wmserve.log" 2>/dev/null
# KIVI-2 caches on the attention kernels (CUDA.md, "KIVI-2 pages"): after the measurements
stage attention_kivi2 30 .gpu/bin/wm_attention_bench --format=kivi2 --queries=64 --reps=10
# the span benchmarks time the device's coder: pinned, so that the auto choice's checks (a host coding
# each) neither fall in the timings nor move the coder to the host
stage attention_quantwm2 30 env WM_CUDA_SPAN_CODER=device .gpu/bin/wm_attention_bench --format=quantwm2 \
  --queries=64 --reps=10
# Matrix-Game-2 shapes over QuantWM-2 caches: span attention and the device coder's write pass
stage mg2_quantwm2 60 env WM_CUDA_SPAN_CODER=device .gpu/bin/wm_mg2_bench --config=configs/mg2-shape.json --format=quantwm2 --sessions=1,8 \
  --windows=6 --reps=2 --blocks=2
# audit mode's drift probe of one Matrix-Game-2 attention call (48 samples) at window 6 and 60, QuantWM-2
# against its fp16 shadow: on the device (kv_probe.cuh) and the host's reconstruct-and-rank, side by side
stage audit_probe 45 env WM_CUDA_SPAN_CODER=device .gpu/bin/wm_attention_bench --format=quantwm2 --queries=2640 --cached=5280,52800 --probe=1 \
  --reps=3
# batch-invariant sessions beside mg2's B=8 W=6 row
stage mg2_invariant 45 .gpu/bin/wm_mg2_bench --config=configs/mg2-shape.json --sessions=8 --windows=6 --batch_invariant=1
# the warp-specialised kernel with 128 keys a step (3 stages, S one m64n128k16 per 16 channels since
# 2026-12-05), its default before 2026-12-04
[ "$attention_kernels" = all ] && passed ws &&
  stage mg2_ws128 80 env WM_CUDA_ATTENTION=ws WM_CUDA_ATTENTION_WS_KEYS=128 \
    .gpu/bin/wm_mg2_bench --config=configs/mg2-shape.json --sessions=1,8
# the warp-specialised kernel with whole key tiles copied by TMA (2026-12-05: not yet the default), with
# the stages and keys a step of its fastest row in attention_ws_tma (else 4 stages of 64 keys)
best_tma=$(python3 tools/gpu_results.py --best-ws-tma "$raw/attention_ws_tma.out" 2>/dev/null || echo "4 64")
[ "$attention_kernels" = all ] && passed ws && passed ws_tma &&
  stage mg2_ws_tma 80 env WM_CUDA_ATTENTION=ws WM_CUDA_ATTENTION_WS_TMA=1 WM_CUDA_ATTENTION_STAGES="${best_tma% *}" \
    WM_CUDA_ATTENTION_WS_KEYS="${best_tma#* }" .gpu/bin/wm_mg2_bench --config=configs/mg2-shape.json --sessions=1,8
# last, so that they are what a short budget drops: hardware counters. First one launch of the
# default 128-query kernel (2640 queries over 16k cached tokens) instruction by instruction, where
# its warps wait ($OUT/ws-sass.csv, the hot spots in the log)
if [ -n "$ncu" ] && passed ws; then
  stage ncu_sass 50 bash tools/ncu_sass.sh "$ncu" "$raw" "$OUT/ws-sass.csv" \
    .gpu/bin/wm_attention_bench --kernel=ws --cached=16384 --queries=2640 --reps=1
fi
# where the 128-query tiles' kernel's time goes, at the Matrix-Game-2 shape (one launch, hardware
# counters): the warp-specialised kernel with 64 keys a step (their default), then with 128
if [ -n "$ncu" ] && [ "$attention_kernels" = all ] && passed ws; then
  for keys in 64 128; do
    stage "ncu_ws$keys" 50 "$ncu" --clock-control none -k regex:attention_ws --launch-skip 2 --launch-count 1 \
      --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats \
      --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
      .gpu/bin/wm_attention_bench --kernel=ws --ws_keys=$keys --cached=16384 --queries=2640 --reps=1
  done
  passed ws_tma && stage ncu_ws_tma 50 "$ncu" --clock-control none -k regex:attention_ws --launch-skip 2 --launch-count 1 \
    --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats \
    --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
    .gpu/bin/wm_attention_bench --kernel=ws --ws_tma=1 --cached=16384 --queries=2640 --reps=1
fi
# where a split 64-query block's time goes: the first two calls' three kernels each
if [ -n "$ncu" ]; then
  stage ncu_split 40 "$ncu" --clock-control none -k regex:attention --launch-count 6 --section SpeedOfLight \
    .gpu/bin/wm_attention_bench --cached=65536 --queries=64 --reps=1
fi

results
echo "=== done in $(( $(date +%s) - start ))s; summary:" | tee -a "$log"
python3 tools/gpu_results.py --summary "$OUT/results.json" 2>&1 | tee -a "$log"
cat "$raw/results.log" 2>/dev/null | tail -5
rm -rf "$raw"
