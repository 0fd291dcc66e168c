"""Model directory writer and reader: config.json + model.safetensors (docs/MODEL_FORMAT.md); trainer checkpoints."""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import math
import os
import pickletools
import zipfile

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


# what load_checkpoint returns and write_checkpoint takes
CHECKPOINT_KEYS = ("model", "ema", "opt", "step", "elapsed", "sampler", "gen", "config")
CHECKPOINT_FORMAT = "wmtrain-checkpoint"
CHECKPOINT_VERSION = 2
# the file's top level, and the entries of its JSON part ("meta")
FILE_KEYS = ("format", "version", "model", "ema", "opt_state", "gen", "meta")
META_KEYS = ("step", "elapsed", "sampler", "config", "opt_param_groups", "opt_state_plain")
# the globals the pickle of a checkpoint names: the tensors' rebuild function and the OrderedDict of its
# (empty) hooks; besides them only "torch <dtype>Storage"
PICKLE_GLOBALS = ("torch._utils _rebuild_tensor_v2", "collections OrderedDict")
# opcodes that fetch a callable by other means than GLOBAL, which a checkpoint never holds
PICKLE_REFUSED_OPS = ("STACK_GLOBAL", "INST", "OBJ", "EXT1", "EXT2", "EXT4")
MAX_PICKLE_BYTES = 64 << 20


class CheckpointError(ValueError):
    """a checkpoint that cannot be read, or that wmtrain.train did not write."""


def write_checkpoint(path: str, ck: dict) -> None:
    """writes ck (the dict load_checkpoint returns) as a file that torch.load(..., weights_only=True) reads.

    The pickle holds tensors, dicts, str and int only (torch 1.13's
    weights-only reader refuses Python floats): the weights ("model"), the
    EMA ("ema"), the optimiser's per-parameter tensors ("opt_state": index
    -> step, exp_avg, exp_avg_sq), the torch.Generator state ("gen"), and
    one JSON string ("meta") with the rest: step, elapsed seconds, the
    sampler's numpy RNG state, the config, the optimiser's param_groups,
    any per-parameter optimiser value that is not a tensor, and the
    arguments. Written under a temporary name and renamed into place."""
    opt_state, opt_plain = {}, {}
    for i, st in ck["opt"]["state"].items():
        opt_state[i] = {k: v for k, v in st.items() if torch.is_tensor(v)}
        plain = {k: v for k, v in st.items() if not torch.is_tensor(v)}
        if plain:
            opt_plain[str(i)] = plain
    meta = {"step": ck["step"], "elapsed": ck["elapsed"], "sampler": ck["sampler"], "config": ck["config"],
            "opt_param_groups": ck["opt"]["param_groups"], "opt_state_plain": opt_plain, "args": ck.get("args", {})}
    doc = {"format": CHECKPOINT_FORMAT, "version": CHECKPOINT_VERSION, "model": ck["model"], "ema": ck["ema"],
           "opt_state": opt_state, "gen": ck["gen"], "meta": json.dumps(meta)}
    tmp = path + ".tmp"
    torch.save(doc, tmp)
    os.replace(tmp, path)


def _scan_pickle(path: str) -> tuple:
    """(globals named, strings) of a checkpoint's pickle, read opcode by opcode without running it.

    Raises CheckpointError for a file that is not a torch zip archive with
    one whole pickle, and for a TorchScript archive (which torch.load hands
    to torch.jit.load, weights_only or not, in torch before 2.6)."""
    try:
        with zipfile.ZipFile(path) as z:
            infos = z.infolist()
            records = [i.filename.partition("/")[2] for i in infos]  # names below the archive's folder
            if any(r == "constants.pkl" or r.startswith("code/") for r in records):
                raise CheckpointError(f"{path}: a TorchScript archive, not a checkpoint")
            # torch writes every record stored: a compressed one could inflate far past the file's own size
            packed = [i.filename for i in infos if i.compress_type != zipfile.ZIP_STORED]
            if packed:
                raise CheckpointError(f"{path}: not a checkpoint (compressed record {packed[0][:100]!r}; torch stores "
                                      "its records uncompressed)")
            pkl = [i for i, r in zip(infos, records) if r == "data.pkl"]
            if len(pkl) != 1:
                raise CheckpointError(f"{path}: damaged, or not a checkpoint (no data.pkl in the archive)")
            if pkl[0].file_size > MAX_PICKLE_BYTES:
                raise CheckpointError(f"{path}: not a checkpoint (its pickle is {pkl[0].file_size} bytes)")
            data = z.read(pkl[0])
    except CheckpointError:
        raise
    except (OSError, zipfile.BadZipFile, EOFError) as e:
        raise CheckpointError(f"{path}: damaged, or not a checkpoint ({type(e).__name__}: {str(e)[:200]})") from None
    names, strings = set(), set()
    try:
        for op, arg, _ in pickletools.genops(data):
            if op.name == "GLOBAL" or op.name in PICKLE_REFUSED_OPS:
                names.add(arg if op.name == "GLOBAL" else op.name)
            elif isinstance(arg, str):
                strings.add(arg)
    except Exception as e:  # noqa: BLE001 - pickletools raises several kinds on a damaged pickle
        raise CheckpointError(f"{path}: damaged, or not a checkpoint (its pickle: {str(e)[:200]})") from None
    return names, strings


def _allowed_global(name: str) -> bool:
    mod, _, attr = name.partition(" ")
    return name in PICKLE_GLOBALS or (mod == "torch" and attr.endswith("Storage") and attr.isidentifier())


def _older_format(path: str) -> CheckpointError:
    return CheckpointError(f"{path}: a checkpoint of the older wmtrain format (a whole pickle), which cannot be read "
                           "safely: refused unread (docs/TRAINING.md says how to convert one you trust)")


def _tensors(v) -> bool:
    return isinstance(v, dict) and all(torch.is_tensor(t) for t in v.values())


def load_checkpoint(path: str) -> dict:
    """a trainer checkpoint, checked: every key, its config, and both weight sets' names and shapes.

    The file is read with torch.load(..., weights_only=True), and only after
    its pickle has been read opcode by opcode and found to name nothing but
    tensors, so that a file passed to --resume or --ckpt cannot run code;
    write_checkpoint describes the layout. A damaged or foreign file, one of
    the older (full pickle) format, and one holding any other object are a
    CheckpointError naming it."""
    try:
        with open(path, "rb"):
            pass
    except OSError as e:
        raise CheckpointError(f"{path}: cannot read it: {e.strerror or e}") from None
    if "weights_only" not in inspect.signature(torch.load).parameters:
        raise CheckpointError(f"{path}: torch {torch.__version__} cannot read a checkpoint safely (its torch.load has "
                              "no weights_only); use torch 1.13 or later")
    names, strings = _scan_pickle(path)
    if all(k in strings for k in CHECKPOINT_KEYS) and CHECKPOINT_FORMAT not in strings:
        raise _older_format(path)
    refused = sorted(n for n in names if not _allowed_global(n))
    if refused:
        raise CheckpointError(f"{path}: not a checkpoint: it holds Python objects ({', '.join(refused)[:200]}), "
                              "refused unread since loading them could run code")
    try:
        doc = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - torch's reader raises many kinds on a damaged file
        msg = str(e).split("WeightsUnpickler error:", 1)[-1].strip()  # without torch's advice to load it unsafely
        raise CheckpointError(f"{path}: damaged, or not a checkpoint ({type(e).__name__}: {msg[:200]})") from None
    if not isinstance(doc, dict):
        raise CheckpointError(f"{path}: not a wmtrain checkpoint (it holds a {type(doc).__name__})")
    missing = [k for k in FILE_KEYS if k not in doc]
    if missing:
        raise CheckpointError(f"{path}: not a wmtrain checkpoint (no {', '.join(missing)})")
    if doc["format"] != CHECKPOINT_FORMAT:
        raise CheckpointError(f"{path}: not a wmtrain checkpoint (format {doc['format']!r})")
    if doc["version"] != CHECKPOINT_VERSION:
        raise CheckpointError(f"{path}: checkpoint format version {doc['version']!r}, this wmtrain reads "
                              f"version {CHECKPOINT_VERSION}")
    try:
        meta = json.loads(doc["meta"]) if isinstance(doc["meta"], str) else None
    except ValueError as e:
        raise CheckpointError(f"{path}: its 'meta' is not JSON: {e}") from None
    if not isinstance(meta, dict) or any(k not in meta for k in META_KEYS):
        raise CheckpointError(f"{path}: its 'meta' is not an object with {', '.join(META_KEYS)}")
    opt_state = doc["opt_state"]
    if not isinstance(opt_state, dict) or not all(_tensors(st) for st in opt_state.values()):
        raise CheckpointError(f"{path}: 'opt_state' is not a set of tensors")
    groups, plain = meta["opt_param_groups"], meta["opt_state_plain"]
    if not isinstance(groups, list) or not all(isinstance(g, dict) for g in groups) or not isinstance(plain, dict):
        raise CheckpointError(f"{path}: its optimiser state is not a list of parameter groups")
    try:
        for i, st in plain.items():
            opt_state.setdefault(int(i), {}).update(st)
    except (ValueError, TypeError, AttributeError):
        raise CheckpointError(f"{path}: its optimiser state is damaged") from None
    # JSON has no tuples: a list in a parameter group other than its parameters was one (AdamW's betas)
    groups = [{k: tuple(v) if isinstance(v, list) and k != "params" else v for k, v in g.items()} for g in groups]
    if not torch.is_tensor(doc["gen"]):
        raise CheckpointError(f"{path}: 'gen' is not a tensor")
    ck = {"model": doc["model"], "ema": doc["ema"], "opt": {"state": opt_state, "param_groups": groups},
          "step": meta["step"], "elapsed": meta["elapsed"], "sampler": meta["sampler"], "gen": doc["gen"],
          "config": meta["config"], "args": meta.get("args", {})}
    try:
        cfg = parse_config(ck["config"])
    except ConfigError as e:
        raise CheckpointError(f"{path}: its config: {e}") from None
    for name in ("model", "ema"):
        st = ck[name]
        if not _tensors(st):
            raise CheckpointError(f"{path}: '{name}' is not a set of tensors")
        try:
            check_state(cfg, st)
        except ValueError as e:
            raise CheckpointError(f"{path}: '{name}' does not fit its config: {e}") from None
    step = ck["step"]
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise CheckpointError(f"{path}: step {step!r} is not a count")
    elapsed = ck["elapsed"]
    if not isinstance(elapsed, (int, float)) or isinstance(elapsed, bool) or not math.isfinite(elapsed) or elapsed < 0:
        raise CheckpointError(f"{path}: elapsed {elapsed!r} is not a number of seconds")
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
