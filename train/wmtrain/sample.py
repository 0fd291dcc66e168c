"""The engine's sampling loop (MODEL_FORMAT.md "Sampling one block" and "The KV cache policy").

A Session holds Nb sessions that advance in lockstep (same frame indices),
each with its own KV cache slots. Used by the evaluation and by the golden
fixture generator.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .config import ModelConfig
from .model import CLDiT, action_input, patchify, unpatchify
from .noise import noise_frame


class KVCache:
    """per frame, per layer (k, v) [Nb, H, T, Dh]; sinks stay, the window slides."""

    def __init__(self, layers: int, window: int, sink: int):
        self.layers, self.window, self.sink = layers, window, sink
        self.frames: dict = {}  # frame index -> list over layers of (k, v)

    def frame_indices(self) -> list:
        return sorted(self.frames)

    def layer_kv(self):
        """per layer (k, v) [Nb, H, cached*T, Dh] in frame order, or None when empty."""
        if not self.frames:
            return None
        idx = self.frame_indices()
        out = []
        for layer in range(self.layers):
            ks = [self.frames[i][layer][0] for i in idx]
            vs = [self.frames[i][layer][1] for i in idx]
            out.append((torch.cat(ks, dim=2), torch.cat(vs, dim=2)))
        return out

    def append(self, first_frame: int, n_frames: int, kvs: list, tokens: int) -> None:
        """kvs: per layer (k, v) [Nb, H, n_frames*T, Dh] of frames first_frame .. first_frame+n_frames-1."""
        for f in range(n_frames):
            sl = slice(f * tokens, (f + 1) * tokens)
            self.frames[first_frame + f] = [(k[:, :, sl].clone(), v[:, :, sl].clone()) for k, v in kvs]

    def evict(self, generated: int) -> None:
        """keep sinks 0 .. min(S, F)-1 and the window max(S, F-W) .. F-1 after F generated frames."""
        keep = set(range(min(self.sink, generated))) | set(range(max(self.sink, generated - self.window), generated))
        for i in list(self.frames):
            if i not in keep:
                del self.frames[i]


class Session:
    """Nb lockstep sessions of one model."""

    def __init__(self, model: CLDiT, nb: int = 1, sigmas=None):
        self.model = model
        self.cfg: ModelConfig = model.cfg
        self.nb = nb
        self.sigmas = list(sigmas if sigmas is not None else self.cfg.sigmas)
        self.cache = KVCache(self.cfg.layers, self.cfg.window_frames, self.cfg.sink_frames)
        self.generated = 0  # frames written so far (the next block starts here)
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype

    def _pos(self, n_frames: int) -> torch.Tensor:
        t = torch.arange(self.generated, self.generated + n_frames, device=self.device)
        return t[None].expand(self.nb, n_frames)

    def _act(self, actions_raw) -> torch.Tensor:
        a = torch.as_tensor(np.asarray(actions_raw, dtype=np.float64), device=self.device).to(self.dtype)
        return action_input(a, self.cfg)

    @torch.no_grad()
    def forward(self, x, sigma: float, actions_raw, cache_kv, record=None, return_kv=False):
        """x [Nb, Fb, T, P]; one sigma for the block; actions_raw [Nb, Fb, A] (key bits, raw mouse)."""
        fb = x.shape[1]
        s = torch.full((self.nb, fb), float(sigma), device=self.device, dtype=self.dtype)
        return self.model(x.to(self.dtype), s, self._act(actions_raw), self._pos(fb), cache=cache_kv,
                          return_kv=return_kv, record=record)

    @torch.no_grad()
    def write(self, frames, actions_raw, record=None) -> None:
        """the sigma = 0 pass over clean frames [Nb, Fb, T, P]; their K/V enter the cache."""
        fb = frames.shape[1]
        _, kvs = self.forward(frames, 0.0, actions_raw, self.cache.layer_kv(), record=record, return_kv=True)
        self.cache.append(self.generated, fb, kvs, self.cfg.tokens)
        self.generated += fb
        self.cache.evict(self.generated)

    @torch.no_grad()
    def denoise(self, noise, actions_raw, records=None, velocities=None):
        """Euler steps over the sigmas from noise [Nb, Fb, T, P]; returns clamp(x, -1, 1). Writes nothing.

        records: list to which one record dict per step is appended (or None);
        velocities: list to which each step's velocity is appended (or None)."""
        cache_kv = self.cache.layer_kv()
        x = noise.to(self.dtype)
        sig = self.sigmas + [0.0]
        for i in range(len(self.sigmas)):
            rec = {} if records is not None else None
            v = self.forward(x, sig[i], actions_raw, cache_kv, record=rec)
            if records is not None:
                records.append(rec)
            if velocities is not None:
                velocities.append(v)
            x = x + (sig[i + 1] - sig[i]) * v
        return x.clamp(-1.0, 1.0)

    def noise(self, seeds, n_frames: int, exact: bool = False) -> torch.Tensor:
        """[Nb, n_frames, T, P]: the engine's noise for the next n_frames frames of each session seed."""
        cfg = self.cfg
        count = cfg.height * cfg.width * cfg.channels
        arr = np.stack([np.stack([noise_frame(int(s), self.generated + f, count, exact=exact)
                                  for f in range(n_frames)]) for s in seeds])
        arr = arr.reshape(self.nb, n_frames, cfg.height, cfg.width, cfg.channels)
        return patchify(torch.from_numpy(arr), cfg.patch).to(self.device, self.dtype)


# ---------------------------------------------------------------- evaluation

def frames_to_tokens(frames_u8: np.ndarray, cfg: ModelConfig, device, dtype) -> torch.Tensor:
    """uint8 [..., H, W, C] -> [..., T, P] in [-1, 1]."""
    x = torch.from_numpy(np.ascontiguousarray(frames_u8)).to(device=device, dtype=dtype) * (2.0 / 255.0) - 1.0
    return patchify(x, cfg.patch)


def tokens_to_rgb8(tokens: torch.Tensor, cfg: ModelConfig) -> np.ndarray:
    """[..., T, P] -> uint8 [..., H, W, C] exactly as the 'pixels' decoder."""
    img = unpatchify(tokens.float().clamp(-1, 1), cfg.patch, cfg.height, cfg.width, cfg.channels)
    return torch.round((img + 1.0) * 127.5).clamp(0, 255).to(torch.uint8).cpu().numpy()


def psnr_u8(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """per leading item PSNR in dB of two uint8 arrays [N, ...] (capped at 99 dB)."""
    d = a.astype(np.float64) - b.astype(np.float64)
    mse = (d * d).reshape(d.shape[0], -1).mean(axis=1)
    return np.where(mse > 0, 10.0 * np.log10(255.0 ** 2 / np.maximum(mse, 1e-12)), 99.0)


@torch.no_grad()
def evaluate(model: CLDiT, frames_u8: np.ndarray, actions: np.ndarray, horizons=(1, 8, 32), seed_base: int = 1000,
             sigmas=None) -> dict:
    """PSNR of generated frames against the ground truth.

    frames_u8 [Nc, L, H, W, C], actions [Nc, L, A] (raw). Each clip is one
    session: the first block (B frames) of ground truth is written with the
    sigma = 0 pass, then the following frames are generated block by block
    from the engine's noise (session seed = seed_base + clip). Horizon h is
    the h-th generated frame. 'rollout' writes the generated frames back
    (autoregressive); 'teacher_forced' writes the ground truth instead (one
    step predictions). 'copy_last' is the baseline that repeats the last
    ground-truth context frame (teacher forced) and 'copy_first' the primed
    frame (rollout).
    """
    cfg = model.cfg
    model.eval()
    nc, length = frames_u8.shape[:2]
    b = cfg.frames_per_block
    horizon = max(horizons)
    n_blocks = math.ceil(horizon / b)
    need = b * (1 + n_blocks)
    if length < need:
        raise ValueError(f"evaluation clips need {need} frames, got {length}")
    p = next(model.parameters())
    gt_tok = frames_to_tokens(frames_u8[:, :need], cfg, p.device, p.dtype)  # [Nc, need, T, P]
    seeds = [seed_base + i for i in range(nc)]
    result = {}
    for mode in ("rollout", "teacher_forced"):
        sess = Session(model, nc, sigmas)
        sess.write(gt_tok[:, :b], actions[:, :b])
        per_h = []
        for blk in range(1, n_blocks + 1):
            f0 = blk * b
            acts = actions[:, f0:f0 + b]
            gen = sess.denoise(sess.noise(seeds, b), acts)
            rgb = tokens_to_rgb8(gen, cfg)
            for j in range(b):
                per_h.append(psnr_u8(rgb[:, j], frames_u8[:, f0 + j]))
            sess.write(gen if mode == "rollout" else gt_tok[:, f0:f0 + b], acts)
        per_h = np.stack(per_h[:horizon], axis=1)  # [Nc, horizon]
        result[mode] = {f"psnr@{h}": float(per_h[:, h - 1].mean()) for h in horizons}
        result[mode]["psnr_mean"] = float(per_h.mean())
    gt = frames_u8[:, b:b + horizon]
    last = frames_u8[:, b - 1:b - 1 + horizon]
    first = np.repeat(frames_u8[:, b - 1:b], horizon, axis=1)
    for name, ref in (("copy_last", last), ("copy_first", first)):
        per_h = np.stack([psnr_u8(ref[:, h], gt[:, h]) for h in range(horizon)], axis=1)
        result[name] = {f"psnr@{h}": float(per_h[:, h - 1].mean()) for h in horizons}
        result[name]["psnr_mean"] = float(per_h.mean())
    result["clips"] = int(nc)
    result["sigmas"] = list(sigmas if sigmas is not None else cfg.sigmas)
    return result
