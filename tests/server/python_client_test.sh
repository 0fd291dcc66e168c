#!/usr/bin/env bash
# The Python client example against a real wmserve; skipped (exit 77) when
# python3-grpcio or the stub generators are missing.
set -euo pipefail
wmserve=$1; wmckpt=$2; src=$3
py=/usr/bin/python3
$py -c "import grpc" 2>/dev/null || { echo "python3-grpcio not installed: skipped"; exit 77; }
command -v grpc_python_plugin >/dev/null && command -v protoc >/dev/null || { echo "no protoc/grpc_python_plugin: skipped"; exit 77; }
dir=$(mktemp -d)
trap 'kill -KILL $pid 2>/dev/null || true; rm -rf "$dir"' EXIT
"$wmckpt" init --config "$src/configs/tiny-test.json" --seed 1 --out "$dir/model" >/dev/null
"$wmserve" --model "$dir/model" --host 127.0.0.1 --port 0 --metrics_port -1 --port_file "$dir/ports.json" \
  --threads 1 > "$dir/server.log" 2>&1 &
pid=$!
for _ in $(seq 1 300); do [ -s "$dir/ports.json" ] && break; sleep 0.05; done
port=$(sed -n 's/.*"port": \([0-9]*\).*/\1/p' "$dir/ports.json")
$py "$src/clients/python/wmclient.py" --server "127.0.0.1:$port" --frames 8 --out "$dir/frames"
ls "$dir/frames" | grep -c jpg | grep -qx 8
kill -TERM $pid
wait $pid
