#!/usr/bin/env bash
# What audit mode costs a server (docs/PERFORMANCE.md, "Audit mode"): one
# wmserve on the default model per setting, quantwm2, wmbench with 4
# concurrent per-action sessions x 40 frames, twice each: no audit, every
# session audited with the drift probes only (--audit_blocks 0), at the
# default (1/8 of the blocks made again against the shadow), and every block.
#   bash tools/bench_audit.sh [build dir]
# Prints frames/s and the audit gauges; files under out/bench_audit/.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
out=${OUT:-out/bench_audit}
mkdir -p "$out"
# OpenMP workers sleep when idle (this machine is shared: spinning is ruinous)
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
# and spin briefly between a step's loops, as wmserve chooses for itself (server/wmserve_main.cc)
export GOMP_SPINCOUNT=${GOMP_SPINCOUNT:-10000}

metrics() {  # port: the exposition, over plain HTTP/1.0 (no curl needed)
  exec 3<>"/dev/tcp/127.0.0.1/$1"
  printf 'GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&3
  cat <&3
  exec 3<&-
}

run() {  # name, wmserve flags...
  local name=$1
  shift
  rm -f "$out/ports.json"
  "$build/server/wmserve" --model models/default --host 127.0.0.1 --port 0 --metrics_port 0 \
    --port_file "$out/ports.json" --idle_ttl_s 0 --cache_format quantwm2 --session_log off "$@" \
    >"$out/$name.log" 2>&1 &
  local pid=$!
  for _ in $(seq 1 600); do [ -s "$out/ports.json" ] && break; sleep 0.1; done
  local port mport
  port=$(sed -n 's/.*"port": \([0-9]*\).*/\1/p' "$out/ports.json")
  mport=$(sed -n 's/.*"metrics_port": \([0-9]*\).*/\1/p' "$out/ports.json")
  "$build/clients/wmhealth" --server "127.0.0.1:$port" --service wmserve.v1.admit --wait_s 60 >/dev/null
  "$build/clients/wmbench" --server "127.0.0.1:$port" --sessions 1 --frames 5 >/dev/null  # warm up
  "$build/clients/wmbench" --server "127.0.0.1:$port" --sessions 4 --frames 40 --json >"$out/$name.json"
  sleep 1.5  # the audit gauges are refreshed about once a second
  metrics "$mport" | grep -E '^wm_shadow|^wm_token_selection' >"$out/$name.metrics" || true
  kill -TERM "$pid"
  wait "$pid" || true
  echo "bench_audit: $name: $(grep -E '"frames_per_second"|"p50"|"p99"' "$out/$name.json" | tr -d ' \n') $(tr '\n' ' ' <"$out/$name.metrics")"
}

for _ in 1 2; do
  run plain
  run probes --audit_fraction 1 --audit_blocks 0
  run default --audit_fraction 1
  run every_block --audit_fraction 1 --audit_blocks 1
done
