"""config.json of a cldit model: load, validate and write (docs/MODEL_FORMAT.md)."""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass
from typing import Any

FORMAT = "wmserve-cldit"
VERSION = 1
DECODERS = ("pixels", "latent_preview")
BIDI_CONTROLS = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


class ConfigError(ValueError):
    pass


def _need(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


def _int(d: dict, key: str, where: str, lo: int, hi: int | None = None) -> int:
    _need(key in d, f"{where}: missing '{key}'")
    v = d[key]
    _need(isinstance(v, int) and not isinstance(v, bool), f"{where}.{key}: must be an integer, got {v!r}")
    _need(v >= lo, f"{where}.{key}: must be >= {lo}, got {v}")
    if hi is not None:
        _need(v <= hi, f"{where}.{key}: must be <= {hi}, got {v}")
    return v


def _num(d: dict, key: str, where: str, lo: float | None = None, hi: float | None = None) -> float:
    _need(key in d, f"{where}: missing '{key}'")
    v = d[key]
    _need(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v),
          f"{where}.{key}: must be a finite number, got {v!r}")
    if lo is not None:
        _need(v >= lo, f"{where}.{key}: must be >= {lo}, got {v}")
    if hi is not None:
        _need(v <= hi, f"{where}.{key}: must be <= {hi}, got {v}")
    return float(v)


def _obj(d: dict, key: str) -> dict:
    _need(key in d, f"missing '{key}'")
    _need(isinstance(d[key], dict), f"'{key}' must be an object")
    return d[key]


@dataclass(frozen=True)
class ModelConfig:
    """a validated config.json; `raw` keeps the document as written."""

    raw: dict
    name: str
    channels: int
    height: int
    width: int
    patch: int
    decoder: str
    dim: int
    layers: int
    heads: int
    head_dim: int
    ffn: int
    freq_dim: int
    norm_eps: float
    rope_theta: float
    t_pairs: int
    h_pairs: int
    w_pairs: int
    keys: tuple
    mouse: tuple
    mouse_scale: float
    mouse_limit: float
    frames_per_block: int
    sigmas: tuple
    window_frames: int
    sink_frames: int

    # derived sizes (MODEL_FORMAT.md "Derived")
    @property
    def grid_h(self) -> int:
        return self.height // self.patch

    @property
    def grid_w(self) -> int:
        return self.width // self.patch

    @property
    def tokens(self) -> int:  # T
        return self.grid_h * self.grid_w

    @property
    def patch_dim(self) -> int:  # P
        return self.channels * self.patch * self.patch

    @property
    def action_dim(self) -> int:  # A
        return len(self.keys) + len(self.mouse)

    def to_json(self) -> str:
        return json.dumps(self.raw, indent=2) + "\n"


def parse_config(doc: Any) -> ModelConfig:
    """validates a parsed config.json exactly as MODEL_FORMAT.md states; raises ConfigError."""
    _need(isinstance(doc, dict), "config must be a JSON object")
    _need(doc.get("format") == FORMAT, f"format must be '{FORMAT}', got {doc.get('format')!r}")
    _need(doc.get("version") == VERSION and not isinstance(doc.get("version"), bool),
          f"version must be {VERSION}, got {doc.get('version')!r}")
    name = doc.get("name")
    _need(isinstance(name, str) and 0 < len(name.encode("utf-8", "surrogatepass")) <= 64,
          "name must be a non-empty string of <= 64 bytes of UTF-8")
    # the engine's rule: no C0 or C1 control, no bidirectional control
    _need(all(ord(ch) >= 0x20 and not 0x7f <= ord(ch) <= 0x9f for ch in name), "name must hold no control characters")
    _need(not any(ch in BIDI_CONTROLS for ch in name), "name must hold no bidirectional control characters")
    _need(not any(0xD800 <= ord(ch) <= 0xDFFF for ch in name), "name must hold no lone surrogate (not UTF-8)")

    fr = _obj(doc, "frame")
    channels = _int(fr, "channels", "frame", 1, 64)
    patch = _int(fr, "patch", "frame", 1, 32)
    height = _int(fr, "height", "frame", 1, 2048)
    width = _int(fr, "width", "frame", 1, 2048)
    _need(height % patch == 0 and width % patch == 0, "frame.height and frame.width must be multiples of patch")
    decoder = fr.get("decoder")
    _need(decoder in DECODERS, f"frame.decoder must be one of {DECODERS}, got {decoder!r}")
    if decoder == "pixels":
        _need(channels == 3, "frame.decoder 'pixels' needs channels = 3")
    else:
        _need(channels >= 3, "frame.decoder 'latent_preview' needs channels >= 3")

    dim = _int(doc, "dim", "config", 1, 16384)
    layers = _int(doc, "layers", "config", 1, 256)
    heads = _int(doc, "heads", "config", 1, 256)
    head_dim = _int(doc, "head_dim", "config", 2, 256)
    _need(head_dim % 2 == 0, "head_dim must be even")
    ffn = _int(doc, "ffn", "config", 1, 65536)
    freq_dim = _int(doc, "freq_dim", "config", 2, 4096)
    _need(freq_dim % 2 == 0, "freq_dim must be even")
    norm_eps = _num(doc, "norm_eps", "config", 1e-12, 1.0)
    _need(norm_eps > 0, "norm_eps must be > 0")

    rope = _obj(doc, "rope")
    theta = _num(rope, "theta", "rope", hi=1e9)
    _need(theta > 1, "rope.theta must be > 1")
    t_pairs = _int(rope, "t_pairs", "rope", 0)
    h_pairs = _int(rope, "h_pairs", "rope", 0)
    w_pairs = _int(rope, "w_pairs", "rope", 0)
    _need(t_pairs + h_pairs + w_pairs == head_dim // 2, "rope.t_pairs + h_pairs + w_pairs must equal head_dim / 2")

    act = _obj(doc, "actions")
    keys = act.get("keys")
    _need(isinstance(keys, list) and 1 <= len(keys) <= 32 and all(isinstance(k, str) and k for k in keys),
          "actions.keys must be a list of 1..32 non-empty names")
    # an action script line is KEYS MOUSE... *N # comment, and '-' means no key
    _need(all(len(k) == 1 and " " < k < "\x7f" and k not in "#-*" for k in keys),
          "actions.keys must be single printable ASCII characters other than space, #, - and *")
    _need(len(set(keys)) == len(keys), "actions.keys must be distinct")
    mouse = act.get("mouse")
    _need(isinstance(mouse, list) and len(mouse) <= 4 and all(isinstance(m, str) and m for m in mouse),
          "actions.mouse must be a list of 0..4 names")
    mouse_scale = _num(act, "mouse_scale", "actions", 1e-6, 1e6)
    _need(mouse_scale > 0, "actions.mouse_scale must be > 0")
    mouse_limit = _num(act, "mouse_limit", "actions", 1e-6, 1e6)
    _need(mouse_limit > 0, "actions.mouse_limit must be > 0")

    smp = _obj(doc, "sampling")
    fpb = _int(smp, "frames_per_block", "sampling", 1, 16)
    sigmas = smp.get("sigmas")
    _need(isinstance(sigmas, list) and 1 <= len(sigmas) <= 16, "sampling.sigmas must be a list of 1..16 numbers")
    _need(all(isinstance(s, (int, float)) and not isinstance(s, bool) and math.isfinite(s) for s in sigmas),
          "sampling.sigmas must be numbers")
    _need(float(sigmas[0]) == 1.0, "sampling.sigmas must start at 1")
    _need(all(0 < s <= 1 for s in sigmas), "sampling.sigmas must lie in (0, 1]")
    _need(all(a > b for a, b in zip(sigmas, sigmas[1:])), "sampling.sigmas must be strictly decreasing")

    cache = _obj(doc, "cache")
    window = _int(cache, "window_frames", "cache", fpb, 1024)
    sink = _int(cache, "sink_frames", "cache", 0, 1000)

    return ModelConfig(
        raw=copy.deepcopy(doc), name=name, channels=channels, height=height, width=width, patch=patch,
        decoder=decoder, dim=dim, layers=layers, heads=heads, head_dim=head_dim, ffn=ffn, freq_dim=freq_dim,
        norm_eps=norm_eps, rope_theta=theta, t_pairs=t_pairs, h_pairs=h_pairs, w_pairs=w_pairs,
        keys=tuple(keys), mouse=tuple(mouse), mouse_scale=mouse_scale, mouse_limit=mouse_limit,
        frames_per_block=fpb, sigmas=tuple(float(s) for s in sigmas), window_frames=window, sink_frames=sink)


MAX_CONFIG_BYTES = 1 << 20  # MODEL_FORMAT.md: the file is at most 1 MiB


def load_config(path: str) -> ModelConfig:
    try:
        with open(path, "rb") as f:
            blob = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as e:
        raise ConfigError(f"{path}: cannot read it: {e.strerror or e}") from None
    if len(blob) > MAX_CONFIG_BYTES:
        raise ConfigError(f"{path}: larger than {MAX_CONFIG_BYTES >> 20} MiB")
    try:
        doc = json.loads(blob.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise ConfigError(f"{path}: not valid JSON: {e}") from None
    try:
        return parse_config(doc)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from e


def replace_sampling(cfg: ModelConfig, sigmas=None, frames_per_block=None) -> ModelConfig:
    """a copy of cfg with other sampling settings (validated again)."""
    doc = copy.deepcopy(cfg.raw)
    if sigmas is not None:
        doc["sampling"]["sigmas"] = [float(s) for s in sigmas]
    if frames_per_block is not None:
        doc["sampling"]["frames_per_block"] = int(frames_per_block)
    return parse_config(doc)
