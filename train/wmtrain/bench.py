"""Training-step throughput on random data, to choose the batch size and whether to compile.

/usr/bin/python3 -m wmtrain.bench --config configs/default.json --batches 32,64,128 [--compile]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from .config import load_config
from .model import CLDiT, clip_mask


def bench_one(cfg, batch: int, n: int, compile_: bool, steps: int, device) -> dict:
    torch.manual_seed(0)
    model = CLDiT(cfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    fwd = torch.compile(model) if compile_ else model
    mask = clip_mask(n, cfg.tokens, cfg.frames_per_block, cfg.window_frames, cfg.sink_frames).to(device)
    x = torch.randn(batch, n, cfg.tokens, cfg.patch_dim, device=device)
    sig = torch.rand(batch, n, device=device)
    act = torch.zeros(batch, n, cfg.action_dim, device=device)
    pos = torch.arange(n, device=device)[None].expand(batch, n)
    amp = device.type == "cuda"

    def step():
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            y = fwd(x, sig, act, pos, mask=mask)
        loss = (y.float() - x).pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    t0 = time.time()
    step()
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    first = time.time() - t0
    for _ in range(2):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.time()
    for _ in range(steps):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    dt = (time.time() - t0) / steps
    out = {"batch": batch, "clip_frames": n, "compile": compile_, "first_step_s": round(first, 2),
           "ms_per_step": round(dt * 1000, 2), "frames_per_s": round(batch * n / dt, 1)}
    if device.type == "cuda":
        out["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--batches", default="32,64")
    ap.add_argument("--clip-frames", type=int, default=0)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--modes", default="eager", help="comma-separated: eager, compile")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args(argv)
    cfg = load_config(a.config)
    n = a.clip_frames or 2 * (cfg.window_frames + cfg.sink_frames)
    device = torch.device(a.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    for b in [int(v) for v in a.batches.split(",")]:
        for c in [m == "compile" for m in a.modes.split(",")]:
            try:
                print(json.dumps(bench_one(cfg, b, n, c, a.steps, device)), flush=True)
            except Exception as e:  # noqa: BLE001 - report and go on
                print(json.dumps({"batch": b, "compile": c, "error": repr(e)[:300]}), flush=True)
            if device.type == "cuda":
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
