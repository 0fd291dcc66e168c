#!/usr/bin/env bash
# End-to-end serving cost of each KV-cache format (docs/PERFORMANCE.md,
# "KV-cache formats"): one wmserve on the default model, wmbench with N
# sessions per format; frames/s, latency and the server-reported KV bytes.
#   bash tools/bench_formats.sh [build dir] [sessions] [frames]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
sessions=${2:-4}
frames=${3:-24}
out=${OUT:-out/bench_formats}
mkdir -p "$out"
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
# and spin briefly between a step's loops, as wmserve chooses for itself (server/wmserve_main.cc)
export GOMP_SPINCOUNT=${GOMP_SPINCOUNT:-10000}
rm -f "$out/ports.json"
"$build/server/wmserve" --model models/default --host 127.0.0.1 --port 0 --metrics_port 0 \
  --port_file "$out/ports.json" --idle_ttl_s 0 >"$out/wmserve.log" 2>&1 &
server=$!
trap 'kill -TERM $server 2>/dev/null || true; wait $server 2>/dev/null || true' EXIT
for _ in $(seq 1 600); do [ -s "$out/ports.json" ] && break; sleep 0.1; done
port=$(sed -n 's/.*"port": \([0-9]*\).*/\1/p' "$out/ports.json")
target=127.0.0.1:$port
"$build/clients/wmhealth" --server "$target" --service wmserve.v1.admit --wait_s 60 >/dev/null
"$build/clients/wmbench" --server "$target" --sessions 1 --frames 3 >/dev/null
for f in fp16 kivi2 qvg2 quantwm2; do
  "$build/clients/wmbench" --server "$target" --sessions "$sessions" --frames "$frames" --format "$f" --json \
    >"$out/$f.json"
  echo "bench_formats: $f $(tr -d ' \n' <"$out/$f.json" | grep -oE '"frames_per_second":[0-9.]+|"p50[a-z_]*":[0-9.]+|"kv[a-z_]*":[0-9.]+' | tr '\n' ' ')"
done
