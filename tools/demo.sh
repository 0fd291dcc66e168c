#!/usr/bin/env bash
# The main job: installs, builds, and plays a short scripted session on the
# default model, then prints where the frames are.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)" --target wmgen wmckpt
model=models/default
if [ ! -f "$model/model.safetensors" ]; then
  model=build/random-default
  ./build/tools/wmckpt init --config configs/default.json --seed 1 --out "$model"
fi
out=out/demo
rm -rf "$out"
./build/tools/wmgen --model "$model" --seed 1 --script tools/demo_actions.txt --out "$out"
echo "frames written to $out/"
