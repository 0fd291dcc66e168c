"""The parity fixture (tests/golden/parity/): a small random model and every intermediate of one session.

cd train && /usr/bin/python3 -m wmtrain.golden --out ../tests/golden/parity

The session (seed 1234, 6 blocks of 2 frames, window 3, sink 1) is computed
in float64 from the float32 weights and stored as F32. The same session is
also run in float32 and the largest differences are printed, which tells
how much of the parity tolerance fp32 arithmetic alone uses.
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np
import torch

from .config import parse_config
from .export import export_model
from .model import CLDiT, unpatchify
from .safetensors import load_file, save_file
from .sample import Session

SEED = 1234
BLOCKS = 6
WEIGHT_SEED = 20240611
LAYER_BLOCKS = (0, 4)  # blocks whose per-layer residual streams are stored

CONFIG = {
    "format": "wmserve-cldit",
    "version": 1,
    "name": "golden-parity",
    "frame": {"channels": 3, "height": 16, "width": 16, "patch": 4, "decoder": "pixels"},
    "dim": 64, "layers": 2, "heads": 2, "head_dim": 32, "ffn": 128,
    "freq_dim": 32, "norm_eps": 1e-6,
    "rope": {"theta": 10000.0, "t_pairs": 6, "h_pairs": 5, "w_pairs": 5},
    "actions": {"keys": ["W", "A", "S", "D"], "mouse": ["yaw", "pitch"], "mouse_scale": 10.0, "mouse_limit": 45.0},
    "sampling": {"frames_per_block": 2, "sigmas": [1.0, 0.6, 0.3]},
    "cache": {"window_frames": 3, "sink_frames": 1},
}

# raw actions per frame: W, A, S, D bits then yaw, pitch (exact in float32)
ACTIONS = np.array([
    [0, 0, 0, 0, 0.0, 0.0],
    [1, 0, 0, 0, 0.0, 0.0],
    [1, 1, 0, 0, 5.5, 0.0],
    [0, 0, 1, 0, -12.25, 3.0],
    [0, 0, 0, 1, 0.0, -7.5],
    [1, 0, 0, 1, 30.0, 0.0],
    [0, 1, 0, 0, -44.5, 10.0],
    [0, 0, 0, 0, 2.0, -2.0],
    [1, 1, 1, 1, 0.0, 0.0],
    [0, 1, 0, 1, 15.0, 15.0],
    [1, 0, 1, 0, -3.75, 0.5],
    [0, 0, 0, 0, 0.0, 0.0],
], dtype=np.float32)


def random_weights(model: CLDiT, seed: int = WEIGHT_SEED) -> None:
    """seeded weights at a scale where every path matters (non-zero gates, modulation, head)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith("modulation"):
                p.copy_(0.2 * torch.randn(p.shape, generator=g))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
            else:  # [out, in]
                p.copy_(torch.randn(p.shape, generator=g) / np.sqrt(p.shape[1]))


def run_session(model: CLDiT, actions: np.ndarray = ACTIONS, seed: int = SEED, blocks: int = BLOCKS) -> dict:
    """name -> float64 numpy array of every fixture tensor, computed in the model's dtype."""
    cfg = model.cfg
    b = cfg.frames_per_block
    sess = Session(model, nb=1)
    out = {"actions": actions.astype(np.float64)}
    frames = []
    for blk in range(blocks):
        acts = actions[None, blk * b:(blk + 1) * b]
        noise = sess.noise([seed], b, exact=True)  # [1, B, T, P]
        records, vels = [], []
        x = sess.denoise(noise, acts, records=records, velocities=vels)
        wrec = {}
        sess.write(x, acts, record=wrec)
        out[f"block{blk}.noise"] = noise[0].reshape(b * cfg.tokens, cfg.patch_dim)
        out[f"block{blk}.cond"] = records[0]["cond"][0]
        out[f"block{blk}.write.cond"] = wrec["cond"][0]
        for i, v in enumerate(vels):
            out[f"block{blk}.step{i}.velocity"] = v[0].reshape(b * cfg.tokens, cfg.patch_dim)
        if blk in LAYER_BLOCKS:
            for l in range(cfg.layers):
                out[f"block{blk}.step0.layer{l}"] = records[0][f"layer{l}"][0].reshape(b * cfg.tokens, cfg.dim)
                out[f"block{blk}.write.layer{l}"] = wrec[f"layer{l}"][0].reshape(b * cfg.tokens, cfg.dim)
        frames.append(unpatchify(x[0], cfg.patch, cfg.height, cfg.width, cfg.channels))
        out[f"block{blk}.cache_frames"] = torch.tensor(sess.cache.frame_indices(), dtype=torch.float64)
    out["frames"] = torch.cat(frames, dim=0)
    return {k: (v.double().cpu().numpy() if torch.is_tensor(v) else np.asarray(v, dtype=np.float64))
            for k, v in out.items()}


def build(out_dir: str) -> dict:
    """writes config.json, model.safetensors and expected.safetensors; returns f32-vs-f64 max differences."""
    cfg = parse_config(CONFIG)
    torch.manual_seed(0)
    model = CLDiT(cfg)
    random_weights(model)
    model = model.float().eval()
    export_model(model.state_dict(), cfg, out_dir, metadata={"weights": "random", "weight_seed": WEIGHT_SEED})
    ref = run_session(_copy(model, torch.float64))
    f32 = run_session(_copy(model, torch.float32))
    order = ["actions", "frames"] + sorted(k for k in ref if k not in ("actions", "frames") and not k.endswith("cache_frames"))
    save_file({k: ref[k].astype(np.float32) for k in order}, os.path.join(out_dir, "expected.safetensors"),
              metadata={"session_seed": SEED, "blocks": BLOCKS, "computed_in": "float64",
                        "generator": "train/wmtrain/golden.py"})
    diffs = {}
    for k in order:
        cat = k.split(".")[-1] if "." in k else k
        cat = "layer" if cat.startswith("layer") else cat
        d = float(np.abs(ref[k] - f32[k]).max())
        diffs[cat] = max(diffs.get(cat, 0.0), d)
    diffs["max_abs_value"] = float(max(np.abs(ref[k]).max() for k in order))
    cache_trace = {f"block{b}": ref[f"block{b}.cache_frames"].astype(int).tolist() for b in range(BLOCKS)}
    return {"f32_vs_f64_max_abs_diff": diffs, "cache_after_block": cache_trace}


def _copy(model: CLDiT, dtype) -> CLDiT:
    m = CLDiT(model.cfg)
    m.load_state_dict(model.state_dict())
    return m.to(dtype).eval().requires_grad_(False)


def check(out_dir: str, atol: float = 1e-6) -> float:
    """recomputes the fixture from the stored weights; returns the largest difference to expected.safetensors."""
    from .export import load_model_dir
    model = load_model_dir(out_dir, dtype=torch.float64)
    ref = run_session(model)
    exp = load_file(os.path.join(out_dir, "expected.safetensors"))
    worst = 0.0
    for k, v in exp.items():
        worst = max(worst, float(np.abs(v.astype(np.float64) - ref[k].astype(np.float32).astype(np.float64)).max()))
    return worst


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description="write the engine parity fixture")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "..", "tests", "golden", "parity"))
    ap.add_argument("--check", action="store_true", help="recompute and compare instead of writing")
    a = ap.parse_args(argv)
    if a.check:
        print(json.dumps({"max_abs_diff": check(a.out)}))
        return
    info = build(a.out)
    print(json.dumps(info, indent=2))


if __name__ == "__main__":
    main()
