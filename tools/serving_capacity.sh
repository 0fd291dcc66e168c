#!/usr/bin/env bash
# How many concurrent players one wmserve holds at a frame rate and a latency
# bound: starts wmserve, then runs wmbench with fixed-rate pacing for a
# ladder of session counts (doubling, then bisecting between the last count
# that held and the first that did not). A count "holds" when every session
# ran without error, the slowest session saw >= FPS_FLOOR x FPS frames/s and
# the p99 action-to-frame latency (client clock) is under P99_MS.
#
#   tools/serving_capacity.sh BIN_DIR [wmserve flags...]
#     BIN_DIR holds wmserve, wmbench, wmhealth (build dirs: pass build and the
#     script looks in build/server and build/clients too).
#   env: MODEL (models/default), FPS (20), P99_MS (100), SECONDS_PER_RUN (4),
#        LADDER ("1 2 4 8 16 32 64 128"), BISECT (3 steps), FPS_FLOOR (0.97),
#        OUT (out/capacity), BUDGET_S (whole run, 0: none)
# One JSON line per run (wmbench's fields + "holds") and a final line
#   {"bench": "serving_capacity", "max_sessions": N, ...}
# on stdout; wmserve's log in $OUT/wmserve.log. Exit 0 unless the server
# could not start.
#
#   bash tools/serving_capacity.sh build --device cuda
set -uo pipefail
cd "$(dirname "$0")/.."
bin=${1:?usage: serving_capacity.sh BIN_DIR [wmserve flags...]}
shift
find_bin() {
  local c
  for c in "$bin/$1" "$bin/server/$1" "$bin/clients/$1"; do
    [ -x "$c" ] && { echo "$c"; return; }
  done
  echo "serving_capacity: no $1 under $bin" >&2
  exit 2
}
wmserve=$(find_bin wmserve)
wmbench=$(find_bin wmbench)
wmhealth=$(find_bin wmhealth)
model=${MODEL:-models/default}
fps=${FPS:-20}
p99_ms=${P99_MS:-100}
secs=${SECONDS_PER_RUN:-4}
ladder=${LADDER:-1 2 4 8 16 32 64 128}
bisect=${BISECT:-3}
floor=${FPS_FLOOR:-0.97}
out=${OUT:-out/capacity}
budget=${BUDGET_S:-0}
mkdir -p "$out"
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
# and spin briefly between a step's loops, as wmserve chooses for itself (server/wmserve_main.cc)
export GOMP_SPINCOUNT=${GOMP_SPINCOUNT:-10000}
t_start=$(date +%s)
frames=$(python3 -c "print(max(2, round($fps * $secs)))")
top=0
for n in $ladder; do [ "$n" -gt "$top" ] && top=$n; done

rm -f "$out/ports.json"
"$wmserve" --model "$model" --host 127.0.0.1 --port 0 --metrics_port -1 --port_file "$out/ports.json" \
  --max_sessions 0 --max_sessions_per_client 0 --max_connections_per_client 0 --client_connection_rate 0 \
  --client_prompt_rate 0 \
  --max_batch "$top" --idle_ttl_s 0 --park_ttl_s 0 \
  "$@" >"$out/wmserve.log" 2>&1 &
server=$!
trap 'kill -TERM $server 2>/dev/null; wait $server 2>/dev/null' EXIT
trap 'exit 143' TERM INT
for _ in $(seq 1 600); do
  [ -s "$out/ports.json" ] && break
  kill -0 $server 2>/dev/null || break
  sleep 0.1
done
if [ ! -s "$out/ports.json" ]; then
  echo "serving_capacity: wmserve did not start:" >&2
  tail -20 "$out/wmserve.log" >&2
  exit 1
fi
port=$(sed -n 's/.*"port": *\([0-9]*\).*/\1/p' "$out/ports.json")
target=127.0.0.1:$port
"$wmhealth" --server "$target" --service wmserve.v1.admit --wait_s 60 >/dev/null ||
  { echo "serving_capacity: wmserve is not serving" >&2; exit 1; }
head -5 "$out/wmserve.log" >&2

# the first step at each new batch size grows the engine's buffers: do the
# largest batch once before measuring
"$wmbench" --server "$target" --sessions "$top" --frames 3 >/dev/null 2>&1 || true

over_budget() { [ "$budget" -gt 0 ] && [ $(($(date +%s) - t_start)) -ge "$budget" ]; }

# run N: prints the run's JSON line, returns 0 when N sessions hold
run() {
  local n=$1 f="$out/run_$1.json"
  "$wmbench" --server "$target" --sessions "$n" --frames "$frames" --pacing realtime --fps "$fps" \
    --json --server_pid "$server" >"$f" 2>"$out/run_$n.err"
  python3 - "$f" "$fps" "$p99_ms" "$floor" <<'EOF'
import json, sys
path, fps, p99_ms, floor = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
try:
    j = json.load(open(path))
except ValueError:
    print(json.dumps({"bench": "serving_run", "error": "wmbench gave no result"}))
    sys.exit(1)
holds = (j["errors"] == 0 and j["session_fps"]["min"] >= floor * fps
         and j["action_to_frame_ms"]["p99"] < p99_ms)
line = {"bench": "serving_run", "sessions": j["sessions"], "fps": fps, "holds": holds,
        "session_fps_min": round(j["session_fps"]["min"], 2),
        "frames_per_second": round(j["frames_per_second"], 1),
        "p50_ms": round(j["action_to_frame_ms"]["p50"], 2), "p99_ms": round(j["action_to_frame_ms"]["p99"], 2),
        "server_model_ms_mean": round(j["server_model_ms_mean"], 3),
        "server_queue_ms_mean": round(j["server_queue_ms_mean"], 3),
        "deadline_missed_frames": j["deadline_missed_frames"], "dropped_frames": j["dropped_frames"],
        "errors": j["errors"], "error_messages": j["error_messages"][:3],
        "kv_cache_bytes_per_session": j["kv_cache_bytes_per_session"]}
print(json.dumps(line))
sys.exit(0 if holds else 1)
EOF
}

best=0
fail=0
for n in $ladder; do
  over_budget && break
  if run "$n"; then best=$n; else fail=$n; break; fi
done
# bisect between the last count that held and the first that did not
step=0
while [ "$fail" -gt 0 ] && [ $((fail - best)) -gt 1 ] && [ "$step" -lt "$bisect" ]; do
  over_budget && break
  mid=$(((best + fail) / 2))
  if run "$mid"; then best=$mid; else fail=$mid; fi
  step=$((step + 1))
done
python3 -c "import json, sys; print(json.dumps({'bench': 'serving_capacity', 'model': sys.argv[1], 'fps': float(sys.argv[2]),
  'p99_ms_bound': float(sys.argv[3]), 'max_sessions': int(sys.argv[4]), 'first_failing': int(sys.argv[5]) or None,
  'ladder_top': int(sys.argv[6]), 'server_args': sys.argv[7]}))" \
  "$model" "$fps" "$p99_ms" "$best" "$fail" "$top" "$*"
exit 0
