#!/usr/bin/env bash
# Serving benchmarks (docs/PERFORMANCE.md, "Serving"): wmbench against a
# local wmserve for 1, 2, 4, 8 sessions, per-action and realtime pacing, the
# server's RSS, and the same work through the engine alone (wmgen).
#   bash tools/bench_serving.sh [build dir] [threads]
# Needs a build with wmserve, wmbench, wmgen, wmckpt. Results: out/bench/*.json
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
threads=${2:-1}
frames=${FRAMES:-30}
rt_fps=${RT_FPS:-5}
out=${OUT:-out/bench}
mkdir -p "$out"
# OpenMP workers sleep when idle (this machine is shared: spinning is ruinous)
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
# and spin briefly between a step's loops, as wmserve chooses for itself (server/wmserve_main.cc)
export GOMP_SPINCOUNT=${GOMP_SPINCOUNT:-10000}
model=models/default
if [ ! -f "$model/model.safetensors" ]; then
  model=$out/random-default
  [ -f "$model/model.safetensors" ] || "$build/tools/wmckpt" init --config configs/default.json --seed 1 --out "$model" >/dev/null
fi
# the engine alone: one session, the same number of frames, same threads
# (run before and after the server, to bracket the machine's load)
awk -v n="$frames" 'BEGIN { for (i = 0; i < n; i++) print (i % 2 ? "W 5 0" : "WA -5 1") }' >"$out/script.txt"
wmgen() {
  "$build/tools/wmgen" --model "$model" --seed 1 --threads "$threads" --script "$out/script.txt" \
    --out "$out/wmgen" >"$out/wmgen_$1.json"
  echo "bench: wmgen ($1): $(grep -E '"frames_per_second"|"model_seconds"' "$out/wmgen_$1.json" | tr -d ' \n')"
}
wmgen before
rm -f "$out/ports.json"
"$build/server/wmserve" --model "$model" --host 127.0.0.1 --port 0 --metrics_port 0 --threads "$threads" \
  --port_file "$out/ports.json" --idle_ttl_s 0 >"$out/wmserve.log" 2>&1 &
server=$!
trap 'kill -TERM $server 2>/dev/null || true; wait $server 2>/dev/null || true' EXIT
for _ in $(seq 1 600); do [ -s "$out/ports.json" ] && break; sleep 0.1; done
port=$(sed -n 's/.*"port": \([0-9]*\).*/\1/p' "$out/ports.json")
target=127.0.0.1:$port
"$build/clients/wmhealth" --server "$target" --service wmserve.v1.admit --wait_s 60 >/dev/null
echo "bench: wmserve pid $server on $target, model $model, threads $threads, rss $(grep VmRSS /proc/$server/status)"
# warm up
"$build/clients/wmbench" --server "$target" --sessions 1 --frames 5 >/dev/null
for n in 1 2 4 8; do
  "$build/clients/wmbench" --server "$target" --sessions "$n" --frames "$frames" --json --server_pid "$server" \
    >"$out/per_action_$n.json" || true
  echo "bench: per_action $n: $(grep -E '"frames_per_second"|"p50"|"p99"' "$out/per_action_$n.json" | tr -d ' \n')"
  "$build/clients/wmbench" --server "$target" --sessions "$n" --frames "$frames" --pacing realtime --fps "$rt_fps" \
    --json --server_pid "$server" >"$out/realtime_$n.json" || true
  echo "bench: realtime $n: $(grep -E '"frames_per_second"|"p50"|"p99"|deadline' "$out/realtime_$n.json" | tr -d ' \n')"
done
kill -TERM $server
wait $server
trap - EXIT
wmgen after
