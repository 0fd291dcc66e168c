"""Model directory writer and reader: config.json + model.safetensors (docs/MODEL_FORMAT.md)."""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os

import numpy as np
import torch

from .config import ConfigError, ModelConfig, load_config, parse_config
from .model import CLDiT
from .safetensors import load_file, save_file


def expected_shapes(cfg: ModelConfig) -> dict:
    """name -> shape of every tensor the format requires, in document order."""
    d, hd, f, p, a = cfg.dim, cfg.heads * cfg.head_dim, cfg.ffn, cfg.patch_dim, cfg.action_dim
    s = {
        "patch_embed.weight": [d, p], "patch_embed.bias": [d],
        "time_embed.0.weight": [d, cfg.freq_dim], "time_embed.0.bias": [d],
        "time_embed.2.weight": [d, d], "time_embed.2.bias": [d],
        "action_embed.0.weight": [d, a], "action_embed.0.bias": [d],
        "action_embed.2.weight": [d, d], "action_embed.2.bias": [d],
        "cond_proj.weight": [6 * d, d], "cond_proj.bias": [6 * d],
    }
    for l in range(cfg.layers):
        b = f"blocks.{l}."
        s[b + "modulation"] = [6, d]
        for n in ("q", "k", "v"):
            s[b + f"attn.{n}.weight"] = [hd, d]
            s[b + f"attn.{n}.bias"] = [hd]
        s[b + "attn.q_norm.weight"] = [cfg.head_dim]
        s[b + "attn.k_norm.weight"] = [cfg.head_dim]
        s[b + "attn.o.weight"] = [d, hd]
        s[b + "attn.o.bias"] = [d]
        s[b + "ffn.0.weight"] = [f, d]
        s[b + "ffn.0.bias"] = [f]
        s[b + "ffn.2.weight"] = [d, f]
        s[b + "ffn.2.bias"] = [d]
    s["head.modulation"] = [2, d]
    s["head.weight"] = [p, d]
    s["head.bias"] = [p]
    return s


def check_state(cfg: ModelConfig, tensors: dict) -> None:
    """raises ValueError unless `tensors` holds exactly the required names and shapes."""
    want = expected_shapes(cfg)
    missing = [n for n in want if n not in tensors]
    extra = [n for n in tensors if n not in want]
    if missing or extra:
        raise ValueError(f"tensor names differ: missing {missing[:5]}, extra {extra[:5]}")
    for n, shp in want.items():
        if list(tensors[n].shape) != shp:
            raise ValueError(f"{n}: shape {list(tensors[n].shape)}, want {shp}")


def export_model(state: dict, cfg: ModelConfig, out_dir: str, dtype: str = "F32", metadata: dict | None = None,
                 split_bytes: int = 0) -> str:
    """writes out_dir/config.json and out_dir/model.safetensors; returns the weights' path.

    split_bytes > 0 also writes model.safetensors.part0, .part1, ... of at
    most that many bytes each, so a transfer with a per-file size limit can
    carry the exact file (`cat` the parts; export_info gives its sha256)."""
    check_state(cfg, state)
    os.makedirs(out_dir, exist_ok=True)
    tensors = {n: state[n].detach().float().cpu().numpy() if torch.is_tensor(state[n]) else np.asarray(state[n])
               for n in expected_shapes(cfg)}
    md = {"format": "wmserve-cldit", "version": "1"}
    md.update({str(k): str(v) for k, v in (metadata or {}).items()})
    path = os.path.join(out_dir, "model.safetensors")
    # both files under temporary names first, renamed into place only once
    # both are whole: a failure (a full disk, say) leaves the model the
    # directory held, never new weights beside the old config
    weights_tmp, config_tmp = f"{path}.tmp{os.getpid()}", os.path.join(out_dir, f"config.json.tmp{os.getpid()}")
    try:
        save_file(tensors, weights_tmp, dtype=dtype, metadata=md)
        with open(config_tmp, "w", encoding="utf-8") as f:
            f.write(cfg.to_json())
    except BaseException:
        for t in (weights_tmp, config_tmp):
            if os.path.exists(t):
                os.remove(t)
        raise
    os.replace(config_tmp, os.path.join(out_dir, "config.json"))
    os.replace(weights_tmp, path)
    if split_bytes > 0:
        with open(path, "rb") as f:
            blob = f.read()
        n = 0
        for n, off in enumerate(range(0, len(blob), split_bytes)):
            part = f"{path}.part{n}"
            with open(part + ".tmp", "wb") as g:
                g.write(blob[off:off + split_bytes])
            os.replace(part + ".tmp", part)
        k = n + 1
        while os.path.exists(f"{path}.part{k}"):  # stale parts of a larger earlier file
            os.remove(f"{path}.part{k}")
            k += 1
    return path


def export_info(path: str) -> dict:
    """size and sha256 of an exported file, for logs (checks joined parts)."""
    with open(path, "rb") as f:
        blob = f.read()
    return {"bytes": len(blob), "sha256": hashlib.sha256(blob).hexdigest()}


def load_model_dir(model_dir: str, device="cpu", dtype=torch.float32) -> CLDiT:
    """reads a model directory with the project's own reader and checks every name and shape."""
    cfg = load_config(os.path.join(model_dir, "config.json"))
    tensors = load_file(os.path.join(model_dir, "model.safetensors"), as_float32=True)
    check_state(cfg, tensors)
    model = CLDiT(cfg)
    model.load_state_dict({n: torch.from_numpy(np.ascontiguousarray(a)) for n, a in tensors.items()}, strict=True)
    return model.to(device=device, dtype=dtype).eval()


CHECKPOINT_KEYS = ("model", "ema", "opt", "step", "elapsed", "sampler", "gen", "config")


class CheckpointError(ValueError):
    """a checkpoint that cannot be read, or that wmtrain.train did not write."""


def load_checkpoint(path: str) -> dict:
    """a trainer checkpoint, checked: every key, its config, and both weight sets' names and shapes.

    It is a pickle (RNG states and arguments ride along, and torch 1.13's
    weights-only reader refuses their floats), so load only checkpoints you
    made; a damaged or foreign file is a CheckpointError naming it."""
    try:
        with open(path, "rb"):
            pass
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read it: {e.strerror or e}") from None
    try:
        try:
            ck = torch.load(path, map_location="cpu", weights_only=False)
        except TypeError:  # a torch without weights_only
            ck = torch.load(path, map_location="cpu")
    except Exception as e:  # noqa: BLE001 - torch's reader raises many kinds on a damaged file
        raise CheckpointError(f"{path}: damaged, or not a checkpoint ({type(e).__name__}: {str(e)[:200]})") from None
    if not isinstance(ck, dict):
        raise CheckpointError(f"{path}: not a wmtrain checkpoint (it holds a {type(ck).__name__})")
    missing = [k for k in CHECKPOINT_KEYS if k not in ck]
    if missing:
        raise CheckpointError(f"{path}: not a wmtrain checkpoint (no {', '.join(missing)})")
    try:
        cfg = parse_config(ck["config"])
    except ConfigError as e:
        raise CheckpointError(f"{path}: its config: {e}") from None
    for name in ("model", "ema"):
        st = ck[name]
        if not isinstance(st, dict) or not all(torch.is_tensor(v) for v in st.values()):
            raise CheckpointError(f"{path}: '{name}' is not a set of tensors")
        try:
            check_state(cfg, st)
        except ValueError as e:
            raise CheckpointError(f"{path}: '{name}' does not fit its config: {e}") from None
    step = ck["step"]
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise CheckpointError(f"{path}: step {step!r} is not a count")
    return ck


def state_from_checkpoint(path: str, use_ema: bool = True) -> tuple:
    ck = load_checkpoint(path)
    cfg = parse_config(ck["config"])
    return (ck["ema"] if use_ema else ck["model"]), cfg, ck


def _non_negative(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(v) or v < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number >= 0")
    return v


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="wmtrain.export", description="export a training checkpoint as a wmserve model directory")
    ap.add_argument("--ckpt", required=True, help="checkpoint written by wmtrain.train")
    ap.add_argument("--out", required=True, help="model directory to write")
    dt = ap.add_mutually_exclusive_group()
    dt.add_argument("--f16", action="store_true", help="store F16 instead of F32")
    dt.add_argument("--bf16", action="store_true", help="store BF16 instead of F32")
    ap.add_argument("--raw", action="store_true", help="export the raw weights instead of the EMA")
    ap.add_argument("--name", help="model name to put in config.json")
    ap.add_argument("--sigmas", help="comma-separated sampling sigmas to put in config.json")
    ap.add_argument("--split-mib", type=_non_negative, default=0, help="also write parts of at most this many MiB")
    a = ap.parse_args(argv)
    if os.path.exists(a.out) and not os.path.isdir(a.out):
        ap.error(f"--out {a.out}: exists and is not a directory")
    try:
        state, cfg, ck = state_from_checkpoint(a.ckpt, use_ema=not a.raw)
    except CheckpointError as e:
        ap.error(f"--ckpt {e}")
    doc = json.loads(cfg.to_json())
    if a.name is not None:
        doc["name"] = a.name
    if a.sigmas is not None:
        try:
            doc["sampling"]["sigmas"] = [float(s) for s in a.sigmas.split(",")]
        except ValueError:
            ap.error(f"--sigmas {a.sigmas!r}: not a comma-separated list of numbers")
    try:
        cfg = parse_config(doc)
    except ConfigError as e:
        ap.error(str(e))
    dtype = "F16" if a.f16 else "BF16" if a.bf16 else "F32"
    try:
        path = export_model(state, cfg, a.out, dtype=dtype,
                            metadata={"step": ck["step"], "weights": "raw" if a.raw else "ema"},
                            split_bytes=int(a.split_mib * 1024 * 1024))
    except OSError as e:
        ap.error(f"--out {a.out}: cannot write the model: {e.strerror or e}")
    print(json.dumps({"exported": path, "dtype": dtype, "step": ck["step"]}))


if __name__ == "__main__":
    main()
