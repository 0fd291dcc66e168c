#!/usr/bin/env bash
# The Python client example against a real wmserve; skipped (exit 77) when
# python3-grpcio or the stub generators are missing.
set -euo pipefail
wmserve=$1; wmckpt=$2; src=$3
py=/usr/bin/python3
$py -c "import grpc" 2>/dev/null || { echo "python3-grpcio not installed: skipped"; exit 77; }
command -v grpc_python_plugin >/dev/null && command -v protoc >/dev/null || { echo "no protoc/grpc_python_plugin: skipped"; exit 77; }
dir=$(mktemp -d)
pid=
trap 'kill -KILL $pid 2>/dev/null || true; rm -rf "$dir"' EXIT
# serve MODEL LOG [FLAGS...]: starts wmserve on MODEL in the background; sets pid and port
serve() {
  local model=$1 out=$2
  shift 2
  rm -f "$dir/ports.json"
  "$wmserve" --model "$model" --host 127.0.0.1 --port 0 --port_file "$dir/ports.json" --threads 1 "$@" > "$out" 2>&1 &
  pid=$!
  for _ in $(seq 1 300); do [ -s "$dir/ports.json" ] && break; sleep 0.05; done
  port=$(sed -n 's/.*"port": \([0-9]*\).*/\1/p' "$dir/ports.json")
}
"$wmckpt" init --config "$src/configs/tiny-test.json" --seed 1 --out "$dir/model" >/dev/null
serve "$dir/model" "$dir/server.log" --metrics_port 0
metrics_port=$(sed -n 's/.*"metrics_port": \([0-9]*\).*/\1/p' "$dir/ports.json")
$py "$src/clients/python/wmclient.py" --server "127.0.0.1:$port" --frames 8 --out "$dir/frames"
ls "$dir/frames" | grep -c jpg | grep -qx 8

# a failure is one line on stderr naming it and a non-zero exit, never a traceback
expect_failure() {  # SAYS ARGS...
  local says=$1
  shift
  if $py "$src/clients/python/wmclient.py" "$@" > "$dir/stdout.txt" 2> "$dir/stderr.txt"; then
    echo "wmclient $*: exit 0"; exit 1
  fi
  if [ "$(wc -l < "$dir/stderr.txt")" != 1 ] || ! grep -q "^wmclient: .*$says" "$dir/stderr.txt"; then
    echo "wmclient $*: wanted one line saying '$says', got:"; cat "$dir/stderr.txt"; exit 1
  fi
}
touch "$dir/a_file"
expect_failure "cannot reach wmserve at 127.0.0.1:1" --server 127.0.0.1:1 --frames 2
expect_failure "cannot reach wmserve at 127.0.0.1:$metrics_port" --server "127.0.0.1:$metrics_port" --frames 2
expect_failure "--token_file $dir/nonexistent: No such file" --server "127.0.0.1:$port" --token_file "$dir/nonexistent"
expect_failure "--out $dir/a_file: File exists" --server "127.0.0.1:$port" --out "$dir/a_file"
expect_failure "--frames must be at least 1" --server "127.0.0.1:$port" --frames -3
kill -TERM $pid
wait $pid

# a model that ships prompts/: the prompt takes index 0, the first frame is 1
cp -r "$dir/model" "$dir/model_prompts"
mkdir "$dir/model_prompts/prompts"
cp "$dir/frames/frame_00000.jpg" "$dir/model_prompts/prompts/start_1.jpg"
serve "$dir/model_prompts" "$dir/server_prompts.log" --metrics_port -1
$py "$src/clients/python/wmclient.py" --server "127.0.0.1:$port" --frames 3 --out "$dir/frames_prompts"
[ "$(ls "$dir/frames_prompts" | tr '\n' ' ')" = "frame_00001.jpg frame_00002.jpg frame_00003.jpg " ]
kill -TERM $pid
wait $pid

# a model of 3 frames per block: an action brings a block of 3 frames, so 7
# frames take 3 actions (the client used to expect a frame per action)
sed 's/"frames_per_block": 1/"frames_per_block": 3/; s/"window_frames": 4/"window_frames": 6/' \
  "$src/configs/tiny-test.json" > "$dir/block3.json"
grep -q '"frames_per_block": 3' "$dir/block3.json"
"$wmckpt" init --config "$dir/block3.json" --seed 1 --out "$dir/model_block3" >/dev/null
serve "$dir/model_block3" "$dir/server_block3.log" --metrics_port -1
$py "$src/clients/python/wmclient.py" --server "127.0.0.1:$port" --frames 7 --out "$dir/frames_block3" > "$dir/block3.txt"
grep -q "3 frame(s) per block" "$dir/block3.txt"
ls "$dir/frames_block3" | grep -c jpg | grep -qx 7
kill -TERM $pid
wait $pid

# and over mutual TLS, with certificates from a CA made here, and an API token
command -v openssl >/dev/null || { echo "no openssl: the TLS part is skipped"; exit 0; }
(
  cd "$dir"
  o() { openssl "$@" 2>>openssl.log; }
  o req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 -subj /CN=test-ca -keyout ca.key -out ca.pem
  o req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj /CN=localhost -keyout server.key -out server.csr
  printf 'subjectAltName=IP:127.0.0.1\n' > san.ext
  o x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -extfile san.ext -out server.pem
  o req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj /CN=player -keyout client.key -out client.csr
  o x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -out client.pem
)
echo "player 0123456789abcdef0123" > "$dir/tokens"
echo "0123456789abcdef0123" > "$dir/token"
chmod 600 "$dir/tokens" "$dir/token"
serve "$dir/model" "$dir/server_tls.log" --metrics_port -1 --tls_cert "$dir/server.pem" --tls_key "$dir/server.key" \
  --tls_client_ca "$dir/ca.pem" --auth_tokens "$dir/tokens"
$py "$src/clients/python/wmclient.py" --server "127.0.0.1:$port" --frames 4 --out "$dir/frames_tls" --tls_ca "$dir/ca.pem" \
  --tls_cert "$dir/client.pem" --tls_key "$dir/client.key" --token_file "$dir/token"
grep -q '"user":"player"' "$dir/server_tls.log"
ls "$dir/frames_tls" | grep -c jpg | grep -qx 4
kill -TERM $pid
wait $pid
