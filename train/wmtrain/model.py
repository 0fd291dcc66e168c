"""The causal latent DiT ("cldit", version 1), equation for equation as docs/MODEL_FORMAT.md.

Parameter names are the safetensors names: `state_dict()` of CLDiT is the
checkpoint. One forward serves training (a whole clip with a block-causal
mask) and sampling (one block against a KV cache).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from .config import ModelConfig

HAS_SDPA = hasattr(F, "scaled_dot_product_attention")


# ---------------------------------------------------------------- helpers

def patchify(frames: torch.Tensor, p: int) -> torch.Tensor:
    """[..., H, W, C] -> [..., T, P] with x[(py * p + px) * C + ch] = frame[r*p+py][c*p+px][ch]."""
    *lead, h, w, c = frames.shape
    x = frames.reshape(*lead, h // p, p, w // p, p, c)
    n = len(lead)
    x = x.permute(*range(n), n, n + 2, n + 1, n + 3, n + 4)  # [..., gh, gw, py, px, C]
    return x.reshape(*lead, (h // p) * (w // p), p * p * c)


def unpatchify(tokens: torch.Tensor, p: int, h: int, w: int, c: int) -> torch.Tensor:
    """[..., T, P] -> [..., H, W, C] (inverse of patchify)."""
    *lead, _, _ = tokens.shape
    n = len(lead)
    x = tokens.reshape(*lead, h // p, w // p, p, p, c)
    x = x.permute(*range(n), n, n + 2, n + 1, n + 3, n + 4)  # [..., gh, py, gw, px, C]
    return x.reshape(*lead, h, w, c)


def action_input(keys_and_mouse: torch.Tensor, cfg: ModelConfig) -> torch.Tensor:
    """raw actions [..., K + M] (key bits, raw mouse) -> embedding input (mouse / mouse_scale)."""
    k = len(cfg.keys)
    scale = torch.ones(cfg.action_dim, dtype=keys_and_mouse.dtype, device=keys_and_mouse.device)
    scale[k:] = 1.0 / cfg.mouse_scale
    return keys_and_mouse * scale if cfg.mouse_scale != 1.0 else keys_and_mouse


def timestep_embedding(sigma: torch.Tensor, freq_dim: int) -> torch.Tensor:
    """[...] -> [..., freq_dim]: cos then sin of (1000 sigma) * exp(-ln(10000) i / half)."""
    half = freq_dim // 2
    i = torch.arange(half, dtype=torch.float64, device=sigma.device)
    freqs = torch.exp(-math.log(10000.0) * i / half).to(sigma.dtype)
    args = (1000.0 * sigma)[..., None] * freqs
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


def rope_frequencies(cfg: ModelConfig, dtype=torch.float64) -> tuple:
    """per-axis pair frequencies theta^(-j / n) for the time, row and column groups."""
    def group(n):
        return torch.tensor([cfg.rope_theta ** (-j / n) for j in range(n)], dtype=dtype)
    return group(cfg.t_pairs), group(cfg.h_pairs), group(cfg.w_pairs)


def rope_angles(cfg: ModelConfig, t_pos: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """t_pos [Nb, Fr] (absolute frame positions) -> angles [Nb, Fr, T, Dh/2] (time pairs, row, column)."""
    ft, fh, fw = (f.to(device=t_pos.device, dtype=dtype) for f in rope_frequencies(cfg, dtype))
    nb, fr = t_pos.shape
    gh, gw = cfg.grid_h, cfg.grid_w
    rows = torch.arange(gh, device=t_pos.device, dtype=dtype).repeat_interleave(gw)  # [T]
    cols = torch.arange(gw, device=t_pos.device, dtype=dtype).repeat(gh)  # [T]
    at = t_pos.to(dtype)[:, :, None, None] * ft  # [Nb, Fr, 1, t_pairs]
    at = at.expand(nb, fr, gh * gw, cfg.t_pairs)
    ah = (rows[:, None] * fh).expand(nb, fr, gh * gw, cfg.h_pairs)
    aw = (cols[:, None] * fw).expand(nb, fr, gh * gw, cfg.w_pairs)
    return torch.cat([at, ah, aw], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [Nb, Fr, T, H, Dh]; cos, sin [Nb, Fr, T, Dh/2]: rotates channel pairs (2j, 2j+1)."""
    x0, x1 = x[..., 0::2], x[..., 1::2]
    c, s = cos[:, :, :, None, :], sin[:, :, :, None, :]
    return torch.stack([x0 * c - x1 * s, x0 * s + x1 * c], dim=-1).flatten(-2)


def clip_mask_frames(n_frames: int, block: int, window: int, sink: int) -> np.ndarray:
    """bool [N, N]: query frame i may see key frame j, reproducing the KV cache policy.

    A query in block b = i // B sees its own block and the frames that are in
    the cache when block b is generated (F = b * B frames done): the sinks
    0 .. min(S, F) - 1 and the window max(S, F - W) .. F - 1.
    """
    m = np.zeros((n_frames, n_frames), dtype=bool)
    for i in range(n_frames):
        b = i // block
        f = b * block
        m[i, f:min(f + block, n_frames)] = True
        m[i, :min(sink, f)] = True
        m[i, max(sink, f - window):f] = True
    return m


def clip_mask(n_frames: int, tokens: int, block: int, window: int, sink: int) -> torch.Tensor:
    """bool [N*T, N*T] token mask (frame-major tokens); True = attend."""
    m = torch.from_numpy(clip_mask_frames(n_frames, block, window, sink))
    return m.repeat_interleave(tokens, 0).repeat_interleave(tokens, 1)


def attention(q, k, v, mask=None):
    """q [Nb, H, Q, Dh], k/v [Nb, H, K, Dh], mask bool [Q, K] or None -> [Nb, H, Q, Dh]; scale 1/sqrt(Dh)."""
    if HAS_SDPA and q.dtype != torch.float64:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    scores = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1), v)


# ---------------------------------------------------------------- modules

class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):  # [..., dim]; computed in at least fp32
        xf = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
        return xf / torch.sqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight.to(xf.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d, hd = cfg.dim, cfg.heads * cfg.head_dim
        self.q, self.k, self.v = nn.Linear(d, hd), nn.Linear(d, hd), nn.Linear(d, hd)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.norm_eps)
        self.k_norm = RMSNorm(cfg.head_dim, cfg.norm_eps)
        self.o = nn.Linear(hd, d)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.modulation = nn.Parameter(torch.zeros(6, cfg.dim))
        self.attn = Attention(cfg)
        self.ffn = nn.Sequential(nn.Linear(cfg.dim, cfg.ffn), nn.GELU(approximate="tanh"), nn.Linear(cfg.ffn, cfg.dim))


class Head(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.modulation = nn.Parameter(torch.zeros(2, cfg.dim))
        self.weight = nn.Parameter(torch.zeros(cfg.patch_dim, cfg.dim))
        self.bias = nn.Parameter(torch.zeros(cfg.patch_dim))


class CLDiT(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        d = cfg.dim
        self.patch_embed = nn.Linear(cfg.patch_dim, d)
        self.time_embed = nn.Sequential(nn.Linear(cfg.freq_dim, d), nn.SiLU(), nn.Linear(d, d))
        self.action_embed = nn.Sequential(nn.Linear(cfg.action_dim, d), nn.SiLU(), nn.Linear(d, d))
        self.cond_proj = nn.Linear(d, 6 * d)
        self.blocks = nn.ModuleList([Block(cfg) for _ in range(cfg.layers)])
        self.head = Head(cfg)
        self.init_for_training()

    def init_for_training(self) -> None:
        """adaLN-zero style: every block starts as the identity and the head outputs 0."""
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)
        for seq in (self.time_embed, self.action_embed):
            nn.init.normal_(seq[0].weight, std=0.02)
            nn.init.normal_(seq[2].weight, std=0.02)
        nn.init.zeros_(self.cond_proj.weight)
        nn.init.zeros_(self.cond_proj.bias)
        for blk in self.blocks:
            nn.init.zeros_(blk.modulation)
        nn.init.zeros_(self.head.modulation)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def conditioning(self, sigma, act):
        """sigma [Nb, Fr], act [Nb, Fr, A] (embedding input) -> c [Nb, Fr, D], e [Nb, Fr, 6, D]."""
        temb = timestep_embedding(sigma, self.cfg.freq_dim)
        c = self.time_embed(temb) + self.action_embed(act)
        e = self.cond_proj(F.silu(c))
        return c, e.unflatten(-1, (6, self.cfg.dim))

    def forward(self, x, sigma, act, t_pos, mask=None, cache=None, return_kv=False, record=None):
        """one forward pass.

        x      [Nb, Fr, T, P]  noisy tokens of Fr frames (frame-major)
        sigma  [Nb, Fr]        noise level per frame
        act    [Nb, Fr, A]     action embedding input per frame (see action_input)
        t_pos  [Nb, Fr]        absolute frame positions (RoPE time axis)
        mask   bool [Fr*T, (cached + Fr)*T] or None (None: every key visible)
        cache  per layer (k, v), each [Nb, H, cached*T, Dh] (after RMSNorm and RoPE), or None
        record dict to fill with 'cond' [Nb, Fr, D] and 'layer{l}' [Nb, Fr, T, D]
        returns y [Nb, Fr, T, P] (the velocity), and with return_kv the per-layer
        (k, v) [Nb, H, Fr*T, Dh] of these frames.
        """
        cfg = self.cfg
        nb, fr, tk, _ = x.shape
        hh, dh = cfg.heads, cfg.head_dim
        c, e = self.conditioning(sigma, act)
        if record is not None:
            record["cond"] = c.detach()
        angles = rope_angles(cfg, t_pos, dtype=torch.float64 if x.dtype == torch.float64 else torch.float32)
        cos, sin = torch.cos(angles), torch.sin(angles)
        h = self.patch_embed(x)  # [Nb, Fr, T, D]
        h = h.float() if h.dtype in (torch.float16, torch.bfloat16) else h
        kvs = []
        for li, blk in enumerate(self.blocks):
            m = (e + blk.modulation)[:, :, :, None, :]  # [Nb, Fr, 6, 1, D]
            shift1, scale1, gate1, shift2, scale2, gate2 = m.unbind(2)
            u = F.layer_norm(h, (cfg.dim,), eps=cfg.norm_eps) * (1 + scale1) + shift1
            at = blk.attn
            q = apply_rope(at.q_norm(at.q(u).unflatten(-1, (hh, dh))), cos, sin)  # [Nb, Fr, T, H, Dh]
            k = apply_rope(at.k_norm(at.k(u).unflatten(-1, (hh, dh))), cos, sin)
            v = at.v(u).unflatten(-1, (hh, dh))
            q, k, v = (t.reshape(nb, fr * tk, hh, dh).transpose(1, 2) for t in (q, k, v))  # [Nb, H, Fr*T, Dh]
            if q.dtype != v.dtype:  # autocast: norms ran in fp32, v is bf16
                q, k = q.to(v.dtype), k.to(v.dtype)
            if return_kv:
                kvs.append((k, v))
            if cache is not None and cache[li] is not None:
                kc, vc = cache[li]
                k = torch.cat([kc.to(k.dtype), k], dim=2)
                v = torch.cat([vc.to(v.dtype), v], dim=2)
            o = attention(q, k, v, mask)  # [Nb, H, Fr*T, Dh]
            o = o.transpose(1, 2).reshape(nb, fr, tk, hh * dh)
            h = h + gate1 * at.o(o)
            u = F.layer_norm(h, (cfg.dim,), eps=cfg.norm_eps) * (1 + scale2) + shift2
            h = h + gate2 * blk.ffn(u)
            if record is not None:
                record[f"layer{li}"] = h.detach()
        c4 = c[:, :, None, :]
        shift = self.head.modulation[0] + c4
        scale = self.head.modulation[1] + c4
        u = F.layer_norm(h, (cfg.dim,), eps=cfg.norm_eps) * (1 + scale) + shift
        y = F.linear(u, self.head.weight, self.head.bias)
        return (y, kvs) if return_kv else y


def param_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
