"""Episode datasets: loading (the `wmsim dataset` layout), clip sampling, and a synthetic stand-in.

Layout: DIR/episode_%05d/frames.npy  uint8 [F, H, W, 3]
        DIR/episode_%05d/actions.npy float32 [F, K + M] (key bits 0/1, then raw mouse values)
Frame 0 is the initial view with an all-zero action; frame i is the view
after action i.
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np


class DataError(ValueError):
    pass


def dataset_episodes(root: str) -> int:
    """the episode count of root/dataset.json, which the writers put down last, once every episode is whole."""
    path = os.path.join(root, "dataset.json")
    try:
        with open(path, encoding="utf-8") as f:
            desc = json.load(f)
    except FileNotFoundError:
        raise DataError(f"{path} is missing: not a dataset, or one whose writing did not finish") from None
    except (OSError, ValueError) as e:
        raise DataError(f"{path}: cannot read it: {e}") from None
    n = desc.get("episodes") if isinstance(desc, dict) else None
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise DataError(f"{path}: 'episodes' must be a positive integer")
    return n


def load_npy(path: str) -> np.ndarray:
    """a memory-mapped .npy array: its header is checked against the file's size before any allocation."""
    try:
        return np.load(path, mmap_mode="r")
    except (OSError, ValueError) as e:
        raise DataError(f"{path}: cannot read it as .npy: {e}") from None


def available_memory() -> int:
    """bytes the kernel says a new allocation can take (MemAvailable), or physical memory where it says nothing."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


# the share of available memory the concatenated episodes may take: the
# model, optimiser, batches and evaluation need the rest
MEMORY_SHARE = 0.8


class EpisodeData:
    """every episode in memory, concatenated: frames uint8 [total, H, W, C], actions float32 [total, A]."""

    def __init__(self, frames, actions, starts, lengths, names=None):
        self.frames = frames
        self.actions = actions
        self.starts = np.asarray(starts, dtype=np.int64)
        self.lengths = np.asarray(lengths, dtype=np.int64)
        self.names = list(names) if names is not None else [f"episode_{i:05d}" for i in range(len(starts))]

    @property
    def episodes(self) -> int:
        return len(self.starts)

    @property
    def total_frames(self) -> int:
        return int(self.lengths.sum())

    @classmethod
    def load(cls, root: str, max_episodes: int | None = None) -> "EpisodeData":
        """the episodes that root/dataset.json counts; raises DataError for anything missing or damaged."""
        dirs = [os.path.join(root, f"episode_{e:05d}") for e in range(dataset_episodes(root))]
        if max_episodes:
            dirs = dirs[:max_episodes]
        for d in dirs:
            if not os.path.isdir(d):
                raise DataError(f"{d}: missing, though dataset.json counts it")
        frames, actions, lengths = [], [], []
        shape = None
        for d in dirs:
            fr = load_npy(os.path.join(d, "frames.npy"))
            ac = load_npy(os.path.join(d, "actions.npy"))
            if ac.dtype.kind not in "fiu":
                raise DataError(f"{d}/actions.npy: need numbers, got {ac.dtype}")
            if fr.dtype != np.uint8 or fr.ndim != 4:
                raise DataError(f"{d}/frames.npy: need uint8 [F, H, W, C], got {fr.dtype} {fr.shape}")
            if ac.ndim != 2 or ac.shape[0] != fr.shape[0]:
                raise DataError(f"{d}/actions.npy: need [F, A] with F = {fr.shape[0]}, got {ac.shape}")
            if shape is None:
                shape = (fr.shape[1:], ac.shape[1])
            elif (fr.shape[1:], ac.shape[1]) != shape:
                raise DataError(f"{d}: frame/action shape {fr.shape[1:]}, {ac.shape[1]} differs from {shape}")
            frames.append(fr)
            actions.append(ac)
            lengths.append(fr.shape[0])
        # every episode is copied into one array: refuse a dataset that cannot fit before copying any
        need = sum(f.nbytes + a.shape[0] * a.shape[1] * 4 for f, a in zip(frames, actions))
        have = available_memory()
        if need > MEMORY_SHARE * have:
            raise DataError(f"{root}: its {len(dirs)} episodes take {need / 2**30:.2f} GiB in memory, more than "
                            f"{MEMORY_SHARE:.0%} of the {have / 2**30:.2f} GiB available; give --max-episodes")
        actions = [a.astype(np.float32) for a in actions]
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        return cls(np.concatenate(frames), np.concatenate(actions), starts, lengths, [os.path.basename(d) for d in dirs])

    def check(self, cfg) -> None:
        """raises DataError unless the data fits the model config."""
        h, w, c = self.frames.shape[1:]
        if (h, w, c) != (cfg.height, cfg.width, cfg.channels):
            raise DataError(f"frames are {h}x{w}x{c}, the config wants {cfg.height}x{cfg.width}x{cfg.channels}")
        if self.actions.shape[1] != cfg.action_dim:
            raise DataError(f"actions have {self.actions.shape[1]} values, the config wants {cfg.action_dim}")
        k = len(cfg.keys)
        bits = self.actions[:, :k]
        if not np.all((bits == 0) | (bits == 1)):
            raise DataError("key columns must be 0 or 1")
        mouse = self.actions[:, k:]
        if not np.all(np.isfinite(mouse)):
            raise DataError("a mouse value is not finite")
        if mouse.size and float(np.abs(mouse).max()) > cfg.mouse_limit:
            raise DataError(f"a mouse value exceeds mouse_limit {cfg.mouse_limit}")

    def split(self, holdout: int) -> tuple:
        """(train, held-out): the last `holdout` episodes are held out."""
        if holdout <= 0:
            return self, None
        if holdout >= self.episodes:
            raise DataError(f"cannot hold out {holdout} of {self.episodes} episodes")
        cut = self.episodes - holdout

        def sub(lo, hi):
            a, b = int(self.starts[lo]), int(self.starts[hi - 1] + self.lengths[hi - 1])
            return EpisodeData(self.frames[a:b], self.actions[a:b], self.starts[lo:hi] - a, self.lengths[lo:hi],
                               self.names[lo:hi])
        return sub(0, cut), sub(cut, self.episodes)

    def episode(self, i: int) -> tuple:
        a, n = int(self.starts[i]), int(self.lengths[i])
        return self.frames[a:a + n], self.actions[a:a + n]


class ClipSampler:
    """random clips of N frames as global frame indices, with RoPE positions.

    With probability gap_prob a clip is a 'gap clip': its first k0 =
    ceil(S / B) * B frames (holding the sinks) come from the episode's start
    e0, the rest from a later contiguous stretch, so the sinks sit far back
    in time as they do in a long session; positions are episode indices
    minus e0. The first block after the gap has no recent context, so its
    loss is masked (see `loss_mask`).
    """

    def __init__(self, data: EpisodeData, n_frames: int, block: int, sink: int, gap_prob: float = 0.0, seed: int = 0):
        self.data, self.n, self.block, self.sink = data, n_frames, block, sink
        self.gap_prob = gap_prob if sink > 0 else 0.0
        self.k0 = -(-sink // block) * block
        self.valid = np.nonzero(data.lengths >= n_frames)[0]
        if len(self.valid) == 0:
            raise DataError(f"no episode has {n_frames} frames")
        self.rng = np.random.default_rng(seed)

    def state(self) -> dict:
        return self.rng.bit_generator.state

    def set_state(self, st: dict) -> None:
        self.rng.bit_generator.state = st

    def sample(self, batch: int) -> tuple:
        """idx int64 [batch, N] (rows of data.frames), pos int64 [batch, N], gap_block int64 [batch] (-1: none)."""
        n, rng = self.n, self.rng
        ep = self.valid[rng.integers(0, len(self.valid), size=batch)]
        slack = self.data.lengths[ep] - n  # >= 0
        gap = np.zeros(batch, dtype=np.int64)
        use_gap = (rng.random(batch) < self.gap_prob) & (slack >= 1) & (self.k0 < n)
        gap[use_gap] = 1 + (rng.random(use_gap.sum()) * slack[use_gap]).astype(np.int64)
        e0 = (rng.random(batch) * (slack - gap + 1)).astype(np.int64)
        offs = np.arange(n, dtype=np.int64)[None, :].repeat(batch, 0)
        offs = offs + np.where(offs >= self.k0, gap[:, None], 0)
        idx = self.data.starts[ep][:, None] + e0[:, None] + offs
        gap_block = np.where(gap > 0, self.k0 // self.block, -1)
        return idx, offs, gap_block


# ---------------------------------------------------------------- synthetic data

def make_synthetic(out: str, episodes: int = 16, frames: int = 64, height: int = 64, width: int = 64,
                   seed: int = 0, world: int = 4) -> None:
    """episodes in the wmsim layout: a view window moving over a toroidal map of coloured squares.

    W/S move the view up/down, A/D left/right (3 px per frame), yaw and pitch
    shift it by 0.4 px per unit. Deterministic given the actions, with revisits.
    """
    rng = np.random.default_rng(seed)
    wh, ww = height * world, width * world
    canvas = np.zeros((wh, ww, 3), dtype=np.float32)
    yy, xx = np.mgrid[0:wh, 0:ww]
    canvas[..., 0] = 40 + 30 * np.sin(2 * np.pi * xx / ww)
    canvas[..., 1] = 60 + 30 * np.sin(2 * np.pi * yy / wh)
    canvas[..., 2] = 90
    for _ in range(world * world * 6):
        s = int(rng.integers(4, max(5, height // 4)))
        y, x = int(rng.integers(0, wh)), int(rng.integers(0, ww))
        col = rng.integers(0, 256, size=3)
        ys, xs = (np.arange(y, y + s) % wh), (np.arange(x, x + s) % ww)
        canvas[np.ix_(ys, xs)] = col
    canvas = canvas.astype(np.uint8)
    os.makedirs(out, exist_ok=True)
    for e in range(episodes):
        acts = np.zeros((frames, 6), dtype=np.float32)
        i = 1
        while i < frames:
            run = int(rng.integers(3, 12))
            keys = np.zeros(4, dtype=np.float32)
            choice = rng.integers(0, 7)
            if choice < 4:
                keys[choice] = 1
            elif choice == 4:
                keys[[0, 1]] = 1
            elif choice == 5:
                keys[[0, 3]] = 1
            yaw = float(np.clip(rng.normal(0, 8), -30, 30)) if rng.random() < 0.5 else 0.0
            pitch = float(np.clip(rng.normal(0, 4), -15, 15)) if rng.random() < 0.3 else 0.0
            acts[i:i + run, :4] = keys
            acts[i:i + run, 4] = round(yaw, 1)
            acts[i:i + run, 5] = round(pitch, 1)
            i += run
        dx = (acts[:, 3] - acts[:, 1]) * 3 + acts[:, 4] * 0.4
        dy = (acts[:, 2] - acts[:, 0]) * 3 + acts[:, 5] * 0.4
        x0, y0 = rng.integers(0, ww), rng.integers(0, wh)
        px = np.round(x0 + np.cumsum(dx)).astype(np.int64)
        py = np.round(y0 + np.cumsum(dy)).astype(np.int64)
        fr = np.empty((frames, height, width, 3), dtype=np.uint8)
        for f in range(frames):
            ys = (py[f] + np.arange(height)) % wh
            xs = (px[f] + np.arange(width)) % ww
            fr[f] = canvas[np.ix_(ys, xs)]
        d = os.path.join(out, f"episode_{e:05d}")
        os.makedirs(d, exist_ok=True)
        np.save(os.path.join(d, "frames.npy"), fr)
        np.save(os.path.join(d, "actions.npy"), acts)
    with open(os.path.join(out, "dataset.json"), "w") as f:
        json.dump({"generator": "wmtrain.data synthetic", "episodes": episodes, "frames": frames,
                   "height": height, "width": width, "seed": seed}, f)
        f.write("\n")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description="make a synthetic dataset in the wmsim layout")
    ap.add_argument("out")
    ap.add_argument("--episodes", type=int, default=16)
    ap.add_argument("--frames", type=int, default=64)
    ap.add_argument("--size", type=int, default=64, help="frame height and width")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    make_synthetic(a.out, a.episodes, a.frames, a.size, a.size, a.seed)


if __name__ == "__main__":
    main()
