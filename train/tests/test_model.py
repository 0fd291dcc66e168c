"""The model against MODEL_FORMAT.md: names, layout, equations, and training mask == cached inference."""

import math
import os
import sys
import unittest

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from wmtrain.config import parse_config  # noqa: E402
from wmtrain.export import expected_shapes  # noqa: E402
from wmtrain.golden import CONFIG, random_weights  # noqa: E402
from wmtrain.model import (CLDiT, action_input, clip_mask, clip_mask_frames, patchify, rope_angles,  # noqa: E402
                           timestep_embedding, unpatchify)
from wmtrain.sample import KVCache, Session  # noqa: E402


def small_model(dtype=torch.float64, **over):
    doc = dict(CONFIG)
    doc.update(over)
    cfg = parse_config(doc)
    torch.manual_seed(0)
    m = CLDiT(cfg)
    random_weights(m)
    return m.to(dtype).eval().requires_grad_(False)


class Names(unittest.TestCase):
    def test_state_dict_is_the_format(self):
        m = small_model()
        want = expected_shapes(m.cfg)
        got = {k: list(v.shape) for k, v in m.state_dict().items()}
        self.assertEqual(got, want)

    def test_default_config_size(self):
        from wmtrain.config import load_config
        cfg = load_config(os.path.join(os.path.dirname(__file__), "..", "configs", "default.json"))
        n = sum(int(np.prod(s)) for s in expected_shapes(cfg).values())
        self.assertLess(n * 4, 50e6)


class Layout(unittest.TestCase):
    def test_patchify_formula(self):
        h, w, c, p = 8, 12, 3, 4
        fr = torch.arange(h * w * c, dtype=torch.float64).reshape(h, w, c)
        tok = patchify(fr, p)
        gw = w // p
        self.assertEqual(tuple(tok.shape), ((h // p) * gw, p * p * c))
        for r in range(h // p):
            for col in range(gw):
                for py in range(p):
                    for px in range(p):
                        for ch in range(c):
                            self.assertEqual(tok[r * gw + col, (py * p + px) * c + ch], fr[r * p + py, col * p + px, ch])
        self.assertTrue(torch.equal(unpatchify(tok, p, h, w, c), fr))

    def test_action_input(self):
        cfg = parse_config(CONFIG)
        a = torch.tensor([[1, 0, 1, 0, 25.0, -5.0]], dtype=torch.float64)
        self.assertEqual(action_input(a, cfg).tolist(), [[1, 0, 1, 0, 2.5, -0.5]])

    def test_timestep_embedding(self):
        s = torch.tensor([0.3], dtype=torch.float64)
        e = timestep_embedding(s, 8)[0]
        for i in range(4):
            f = math.exp(-math.log(10000) * i / 4)
            self.assertAlmostEqual(float(e[i]), math.cos(300 * f), places=12)
            self.assertAlmostEqual(float(e[4 + i]), math.sin(300 * f), places=12)

    def test_rope_angles(self):
        cfg = parse_config(CONFIG)  # t 6, h 5, w 5, grid 4x4
        ang = rope_angles(cfg, torch.tensor([[7]]), dtype=torch.float64)[0, 0]  # [T, 16]
        n = 2 * cfg.grid_w + 3  # row 2, column 3
        th = cfg.rope_theta
        want = [7 * th ** (-j / 6) for j in range(6)] + [2 * th ** (-j / 5) for j in range(5)] + \
               [3 * th ** (-j / 5) for j in range(5)]
        np.testing.assert_allclose(ang[n].numpy(), want, rtol=1e-14)


def reference_forward(m, x, sigma, act, t_pos, keys=None, vals=None):
    """a literal, loop-based transcription of the document for one frame block of one session.

    x [Fr, T, P], sigma [Fr], act [Fr, A] (embedding input), t_pos [Fr]; keys/vals per layer
    [cached tokens, H, Dh] or None. Returns y [Fr, T, P] and the block's per layer (k, v)."""
    cfg = m.cfg
    sd = {k: v for k, v in m.state_dict().items()}
    lin = lambda name, u: u @ sd[name + ".weight"].T + sd[name + ".bias"]  # noqa: E731
    ln = lambda u: (u - u.mean(-1, keepdim=True)) / torch.sqrt(u.var(-1, unbiased=False, keepdim=True) + cfg.norm_eps)  # noqa
    silu = lambda u: u * torch.sigmoid(u)  # noqa: E731
    gelu = lambda u: 0.5 * u * (1 + torch.tanh(math.sqrt(2 / math.pi) * (u + 0.044715 * u ** 3)))  # noqa: E731
    fr, tk, _ = x.shape
    hh, dh, d = cfg.heads, cfg.head_dim, cfg.dim
    half = cfg.freq_dim // 2
    c, e = [], []
    for f in range(fr):
        s = 1000 * sigma[f]
        fq = torch.tensor([math.exp(-math.log(10000) * i / half) for i in range(half)], dtype=x.dtype)
        temb = torch.cat([torch.cos(s * fq), torch.sin(s * fq)])
        cf = lin("time_embed.2", silu(lin("time_embed.0", temb))) + lin("action_embed.2", silu(lin("action_embed.0", act[f])))
        c.append(cf)
        e.append(lin("cond_proj", silu(cf)).reshape(6, d))

    def rope(v, t, r, col):  # v [H, Dh]
        out = v.clone()
        groups = [(0, cfg.t_pairs, t), (cfg.t_pairs, cfg.h_pairs, r), (cfg.t_pairs + cfg.h_pairs, cfg.w_pairs, col)]
        for start, n, pos in groups:
            for j in range(n):
                phi = pos * cfg.rope_theta ** (-j / n)
                i0 = 2 * (start + j)
                x0, x1 = v[:, i0], v[:, i0 + 1]
                out[:, i0] = x0 * math.cos(phi) - x1 * math.sin(phi)
                out[:, i0 + 1] = x0 * math.sin(phi) + x1 * math.cos(phi)
        return out

    def rms(v, w):
        return v / torch.sqrt((v * v).mean(-1, keepdim=True) + cfg.norm_eps) * w

    h = lin("patch_embed", x)  # [Fr, T, D]
    new_kv = []
    for l in range(cfg.layers):
        b = f"blocks.{l}."
        q_all, k_all, v_all = [], [], []
        us = []
        for f in range(fr):
            mm = e[f] + sd[b + "modulation"]
            u = ln(h[f]) * (1 + mm[1]) + mm[0]
            us.append(u)
            q = lin(b + "attn.q", u).reshape(tk, hh, dh)
            k = lin(b + "attn.k", u).reshape(tk, hh, dh)
            v = lin(b + "attn.v", u).reshape(tk, hh, dh)
            for n in range(tk):
                r, col = divmod(n, cfg.grid_w)
                q[n] = rope(rms(q[n], sd[b + "attn.q_norm.weight"]), float(t_pos[f]), r, col)
                k[n] = rope(rms(k[n], sd[b + "attn.k_norm.weight"]), float(t_pos[f]), r, col)
            q_all.append(q)
            k_all.append(k)
            v_all.append(v)
        qb, kb, vb = torch.cat(q_all), torch.cat(k_all), torch.cat(v_all)  # [Fr*T, H, Dh]
        new_kv.append((kb, vb))
        kk = kb if keys is None else torch.cat([keys[l], kb])
        vv = vb if vals is None else torch.cat([vals[l], vb])
        o = torch.zeros(fr * tk, hh, dh, dtype=x.dtype)
        for head in range(hh):
            att = torch.softmax(qb[:, head] @ kk[:, head].T / math.sqrt(dh), dim=-1)
            o[:, head] = att @ vv[:, head]
        o = o.reshape(fr, tk, hh * dh)
        hn = []
        for f in range(fr):
            mm = e[f] + sd[b + "modulation"]
            hf = h[f] + mm[2] * lin(b + "attn.o", o[f])
            u = ln(hf) * (1 + mm[4]) + mm[3]
            hf = hf + mm[5] * lin(b + "ffn.2", gelu(lin(b + "ffn.0", u)))
            hn.append(hf)
        h = torch.stack(hn)
    y = []
    for f in range(fr):
        shift, scale = sd["head.modulation"][0] + c[f], sd["head.modulation"][1] + c[f]
        y.append((ln(h[f]) * (1 + scale) + shift) @ sd["head.weight"].T + sd["head.bias"])
    return torch.stack(y), new_kv


class Equations(unittest.TestCase):
    def test_forward_matches_literal_reference(self):
        m = small_model()
        cfg = m.cfg
        g = torch.Generator().manual_seed(3)
        fr = 2
        x = torch.randn(fr, cfg.tokens, cfg.patch_dim, generator=g, dtype=torch.float64)
        sigma = torch.tensor([0.6, 0.6], dtype=torch.float64)
        act = action_input(torch.tensor([[1, 0, 0, 1, 12.5, -3.0], [0, 1, 1, 0, -40.0, 7.0]], dtype=torch.float64), cfg)
        tpos = torch.tensor([4, 5])
        cached = 3
        keys = [torch.randn(cached * cfg.tokens, cfg.heads, cfg.head_dim, generator=g, dtype=torch.float64)
                for _ in range(cfg.layers)]
        vals = [torch.randn(cached * cfg.tokens, cfg.heads, cfg.head_dim, generator=g, dtype=torch.float64)
                for _ in range(cfg.layers)]
        want, want_kv = reference_forward(m, x, sigma, act, tpos, keys, vals)
        cache = [(k.transpose(0, 1)[None], v.transpose(0, 1)[None]) for k, v in zip(keys, vals)]
        got, kv = m(x[None], sigma[None], act[None], tpos[None], cache=cache, return_kv=True)
        np.testing.assert_allclose(got[0].numpy(), want.numpy(), atol=1e-10)
        for (k, v), (wk, wv) in zip(kv, want_kv):
            np.testing.assert_allclose(k[0].transpose(0, 1).numpy(), wk.numpy(), atol=1e-10)
            np.testing.assert_allclose(v[0].transpose(0, 1).numpy(), wv.numpy(), atol=1e-10)


class CachePolicy(unittest.TestCase):
    def test_kvcache_matches_document(self):
        for window, sink in ((3, 1), (4, 0), (2, 2), (5, 3)):
            c = KVCache(1, window, sink)
            for f in range(12):
                c.frames[f] = [(None, None)]
                c.evict(f + 1)
                want = sorted(set(range(min(sink, f + 1))) | set(range(max(sink, f + 1 - window), f + 1)))
                self.assertEqual(c.frame_indices(), want)

    def test_mask_matches_cache(self):
        for n, b, w, s in ((12, 2, 3, 1), (10, 1, 4, 2), (9, 3, 3, 0), (16, 2, 5, 3)):
            m = clip_mask_frames(n, b, w, s)
            c = KVCache(1, w, s)
            for blk in range(n // b):
                visible = set(c.frame_indices()) | set(range(blk * b, blk * b + b))
                for i in range(blk * b, blk * b + b):
                    self.assertEqual(set(np.nonzero(m[i])[0].tolist()), visible, (n, b, w, s, i))
                for f in range(blk * b, blk * b + b):
                    c.frames[f] = [(None, None)]
                c.evict(blk * b + b)

    def test_clip_forward_equals_cached_sampling(self):
        """the training forward (one clip, mask) reproduces the engine's incremental passes exactly."""
        m = small_model()
        cfg = m.cfg
        b, n = cfg.frames_per_block, 12
        g = torch.Generator().manual_seed(5)
        clean = torch.rand(1, n, cfg.tokens, cfg.patch_dim, generator=g, dtype=torch.float64) * 2 - 1
        raw = torch.randint(0, 2, (n, 6), generator=g).double()
        raw[:, 4:] = torch.randn(n, 2, generator=g, dtype=torch.float64) * 10
        act = action_input(raw, cfg)[None]
        mask = clip_mask(n, cfg.tokens, b, cfg.window_frames, cfg.sink_frames)
        pos = torch.arange(n)[None]
        # every frame clean (sigma 0): the clip forward is the sequence of write passes
        y_clip = m(clean, torch.zeros(1, n, dtype=torch.float64), act, pos, mask=mask)
        sess = Session(m, 1)
        for blk in range(n // b):
            sl = slice(blk * b, blk * b + b)
            y_blk = sess.forward(clean[:, sl], 0.0, raw[None, sl].numpy(), sess.cache.layer_kv())
            np.testing.assert_allclose(y_clip[:, sl].numpy(), y_blk.numpy(), atol=1e-10, err_msg=f"block {blk}")
            # a noisy block over the same cache equals the clip forward with that block noisy
            noisy = torch.randn(1, b, cfg.tokens, cfg.patch_dim, generator=g, dtype=torch.float64)
            y_step = sess.forward(noisy, 0.6, raw[None, sl].numpy(), sess.cache.layer_kv())
            x_mix = clean.clone()
            x_mix[:, sl] = noisy
            sig = torch.zeros(1, n, dtype=torch.float64)
            sig[:, sl] = 0.6
            y_mix = m(x_mix, sig, act, pos, mask=mask)
            np.testing.assert_allclose(y_mix[:, sl].numpy(), y_step.numpy(), atol=1e-10, err_msg=f"step {blk}")
            sess.write(clean[:, sl], raw[None, sl].numpy())

    def test_bf16_autocast_path_runs(self):
        m = small_model(torch.float32)
        cfg = m.cfg
        x = torch.randn(2, 4, cfg.tokens, cfg.patch_dim)
        mask = clip_mask(4, cfg.tokens, 2, cfg.window_frames, cfg.sink_frames)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = m(x, torch.rand(2, 4), torch.zeros(2, 4, cfg.action_dim), torch.arange(4)[None].expand(2, 4), mask=mask)
        ref = m(x, torch.rand(2, 4) * 0, torch.zeros(2, 4, cfg.action_dim), torch.arange(4)[None].expand(2, 4), mask=mask)
        self.assertEqual(y.shape, ref.shape)
        self.assertTrue(torch.isfinite(y.float()).all())


if __name__ == "__main__":
    unittest.main()
