#!/usr/bin/env bash
# train/gpu_train.sh OUT MINUTES
#
# The default model's training run on one GPU, end to end:
#   1. simulator dataset into $WM_DATA (default /tmp/wmdata): `wmsim dataset`,
#      1000 episodes x 256 frames (3 GB, ~6 s with 16 threads; reused if a
#      complete one is already there);
#   2. trains configs/default.json for MINUTES minutes of training loop with
#      torch.compile (its ~25 s count inside MINUTES; eager if it fails);
#      wall time is about MINUTES + 1 min (data, start-up, final evaluation
#      and export come on top);
#   3. writes into OUT:
#        default/config.json, default/model.safetensors   the model (F32, EMA or
#                                     better raw weights, see summary.json)
#        default/model.safetensors.part0, .part1          the same file in < 16 MiB
#                                     pieces: cat part0 part1 > model.safetensors
#        train_log.jsonl, summary.json, gpu_train.log
#      The model is exported every 60 s while training, so a run that is
#      killed still leaves the latest model in OUT/default.
#
# Environment (all optional): WM_PYTHON, WM_DATA, WM_EPISODES, WM_FRAMES,
# WM_DATA_SEED, WM_THREADS, WM_BATCH, WM_LR, WM_COMPILE (1; 0 = eager), WM_EXTRA (more
# trainer flags), WMSIM (the simulator binary; default: wmsim on PATH after
# sourcing .gpu/env.sh, else .gpu/bin/wmsim).
set -uo pipefail

if [ $# -ne 2 ]; then
  echo "usage: train/gpu_train.sh OUT MINUTES" >&2
  exit 2
fi
mkdir -p "$1" || exit 2
OUT=$(cd "$1" && pwd)
MINUTES=$2
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
exec > >(tee -a "$OUT/gpu_train.log") 2>&1
t_start=$(date +%s)
say() { echo "[gpu_train $(($(date +%s) - t_start))s] $*"; }

# python with torch: the GPU image's python3, else Debian's
PY=${WM_PYTHON:-}
if [ -z "$PY" ]; then
  for cand in python3 /usr/bin/python3; do
    if "$cand" -c "import torch, numpy" 2>/dev/null; then PY=$cand; break; fi
  done
fi
[ -n "$PY" ] || { say "error: no python with torch and numpy"; exit 1; }
say "python: $PY ($("$PY" -c 'import torch; print(torch.__version__, torch.cuda.is_available())'))"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv,noheader

DATA=${WM_DATA:-/tmp/wmdata}
EPISODES=${WM_EPISODES:-1000}
FRAMES=${WM_FRAMES:-256}
THREADS=${WM_THREADS:-16}
DATA_KIND=wmsim
if [ ! -f "$DATA/dataset.json" ]; then
  [ -f "$ROOT/.gpu/env.sh" ] && source "$ROOT/.gpu/env.sh"
  WMSIM=${WMSIM:-$(command -v wmsim || echo "$ROOT/.gpu/bin/wmsim")}
  rm -rf "$DATA"
  if [ -x "$WMSIM" ]; then
    say "dataset: $WMSIM dataset --episodes $EPISODES --frames $FRAMES --threads $THREADS -> $DATA"
    timeout 300 "$WMSIM" dataset --seed "${WM_DATA_SEED:-1}" --episodes "$EPISODES" --frames "$FRAMES" \
      --out "$DATA" --threads "$THREADS" --width 64 --height 64 || { say "wmsim failed (rc $?)"; rm -rf "$DATA"; }
  else
    say "wmsim not found at '$WMSIM'"
  fi
  if [ ! -f "$DATA/dataset.json" ]; then
    # keeps the pipeline testable; a model trained on this is NOT the simulator's world model
    say "WARNING: falling back to the synthetic dataset (moving squares), not the simulator"
    DATA_KIND=synthetic
    (cd "$HERE" && "$PY" -m wmtrain.data "$DATA" --episodes 200 --frames 256 --size 64) || exit 1
  fi
else
  say "dataset: reusing $DATA"
fi
say "dataset ready ($DATA_KIND): $(du -sh "$DATA" | cut -f1)"

COMPILE=()
[ "${WM_COMPILE:-1}" = "1" ] && COMPILE=(--compile)
cd "$HERE" || exit 1
# shellcheck disable=SC2086
"$PY" -u -m wmtrain.train --config configs/default.json --data "$DATA" --out "$OUT" \
  --export-dir "$OUT/default" --ckpt /tmp/wm_ckpt.pt --split-mib 15 --export-every-s 60 \
  --minutes "$MINUTES" --batch "${WM_BATCH:-64}" --lr "${WM_LR:-5e-4}" --warmup 200 \
  --ckpt-every 1000000 --ckpt-every-s 120 --log-every 50 \
  --holdout 8 --eval-clips 16 --eval-horizons 1,8,32 --eval-sigmas "1;1,0.5;1,0.75,0.5,0.25" \
  --export-best "${COMPILE[@]}" ${WM_EXTRA:-}
rc=$?
if [ "$DATA_KIND" = synthetic ] && [ -f "$OUT/summary.json" ]; then
  "$PY" - "$OUT/summary.json" <<'EOF'
import json, sys
p = sys.argv[1]
s = json.load(open(p))
s["WARNING"] = "trained on the synthetic fallback dataset, not on wmsim"
json.dump(s, open(p, "w"), indent=2)
EOF
fi
say "done (trainer rc $rc); OUT:"
ls -la "$OUT" "$OUT/default" 2>/dev/null
exit $rc
