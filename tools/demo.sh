#!/usr/bin/env bash
# The README's run command: installs the dependencies, builds, starts wmserve
# on the default model in the background, waits until it admits sessions,
# plays a short scripted session with wmplay (tools/demo_actions.txt), prints
# where the frames are and the latency summary, and stops the server.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)" --target wmserve wmplay wmhealth wmckpt

model=models/default
if [ ! -f "$model/model.safetensors" ]; then
  # no trained model in this checkout: a seeded random one of the same shape
  model=build/random-default
  [ -f "$model/model.safetensors" ] ||
    ./build/tools/wmckpt init --config configs/default.json --seed 1 --out "$model" >/dev/null
  echo "demo: models/default is missing; serving random weights ($model): the frames will be noise"
fi

out=out/demo
rm -rf "$out"
mkdir -p "$out"
# any free ports: the server writes the ones it got to ports.json. It
# chooses OpenMP's wait policy itself where the environment does not (a
# brief spin, then sleep: docs/API.md)
./build/server/wmserve --model "$model" --host 127.0.0.1 --port 0 --metrics_port 0 \
  --port_file "$out/ports.json" >"$out/wmserve.log" 2>&1 &
server=$!
trap 'kill -KILL $server 2>/dev/null || true' EXIT
for _ in $(seq 1 600); do
  [ -s "$out/ports.json" ] && break
  if ! kill -0 $server 2>/dev/null; then
    echo "demo: wmserve did not start:" >&2
    cat "$out/wmserve.log" >&2
    exit 1
  fi
  sleep 0.1
done
port=$(sed -n 's/.*"port": \([0-9]*\).*/\1/p' "$out/ports.json")
metrics_port=$(sed -n 's/.*"metrics_port": \([0-9-]*\).*/\1/p' "$out/ports.json")
./build/clients/wmhealth --server "127.0.0.1:$port" --service wmserve.v1.admit --wait_s 60 >/dev/null
echo "demo: wmserve is up on 127.0.0.1:$port (metrics: http://127.0.0.1:$metrics_port/metrics)"

./build/clients/wmplay --headless --script tools/demo_actions.txt --out "$out/frames" \
  --server "127.0.0.1:$port" --seed 1

kill -TERM $server
wait $server
trap - EXIT
echo "demo: frames in $out/frames/ (frame_*.jpg), summary in $out/frames/summary.json, server log in $out/wmserve.log"
