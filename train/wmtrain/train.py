"""Trainer CLI: flow matching with diffusion forcing on clips, exported as a wmserve model.

/usr/bin/python3 -m wmtrain.train --config configs/default.json --data DIR --out OUT [--minutes M]

See docs/TRAINING.md for the objective, the noise-level scheme and the mask.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import math
import os
import sys
import time

import numpy as np
import torch

from .config import ConfigError, load_config, parse_config, replace_sampling
from .data import ClipSampler, DataError, EpisodeData, make_synthetic
from .export import CheckpointError, export_info, export_model, load_checkpoint, write_checkpoint
from .model import CLDiT, action_input, clip_mask, param_count, patchify
from .sample import evaluate

CLEAN_SIGMA = 0.05  # frames below this noise level count as "clean context" for the loss weight


def _number(kind, lo=None, hi=None, lo_open=False):
    """an argparse type: a finite `kind` within [lo, hi] ((lo, hi] with lo_open)."""
    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
        if not math.isfinite(v) or (lo is not None and (v <= lo if lo_open else v < lo)) or (hi is not None and v > hi):
            lo_s = "" if lo is None else f"{'>' if lo_open else '>='} {lo}"
            hi_s = "" if hi is None else f"<= {hi}"
            raise argparse.ArgumentTypeError(f"{text!r} is out of range ({' and '.join(x for x in (lo_s, hi_s) if x)})")
        return v
    return parse


COUNT = _number(int, 0, 1 << 31)
POSITIVE = _number(int, 1, 1 << 31)
FRACTION = _number(float, 0.0, 1.0)
NON_NEGATIVE = _number(float, 0.0)


def parse_horizons(text: str) -> tuple:
    try:
        hs = tuple(int(h) for h in text.split(","))
    except ValueError:
        hs = ()
    if not hs or min(hs) < 1 or max(hs) > 100000:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of frame counts in 1..100000")
    return hs


def parse_schedules(text: str) -> list:
    """'1;1,0.5' -> [[1.0], [1.0, 0.5]]; each is checked against the model's config once it is loaded."""
    out = []
    for part in (s for s in text.split(";") if s.strip()):
        try:
            out.append([float(v) for v in part.split(",")])
        except ValueError:
            raise argparse.ArgumentTypeError(f"{part!r} is not a comma-separated list of sigmas") from None
    return out


def parse_device(text: str) -> str:
    if text in ("auto", "cpu", "cuda") or (text.startswith("cuda:") and text[5:].isdigit()):
        return text
    raise argparse.ArgumentTypeError(f"{text!r}: give auto, cpu, cuda or cuda:N")


def parse_args(argv=None):
    ap = argparse.ArgumentParser(prog="wmtrain", description="train a cldit world model")
    ap.add_argument("--config", required=True, help="model config.json")
    ap.add_argument("--data", help="dataset folder (dataset.json, episode_*/frames.npy, actions.npy)")
    ap.add_argument("--synthetic", type=COUNT, default=0, metavar="EPISODES",
                    help="generate this many synthetic episodes into OUT/data when --data is not given")
    ap.add_argument("--synthetic-frames", type=POSITIVE, default=96)
    ap.add_argument("--out", required=True, help="output folder (log, checkpoint, model, summary)")
    ap.add_argument("--export-dir", help="model directory to write (default OUT/model)")
    ap.add_argument("--ckpt", help="checkpoint file to write (default OUT/ckpt.pt)")
    ap.add_argument("--name", help="model name for the exported config.json")
    ap.add_argument("--minutes", type=NON_NEGATIVE, default=0, help="training time budget (0: only --steps)")
    ap.add_argument("--steps", type=COUNT, default=0, help="maximum optimiser steps (0: only --minutes)")
    ap.add_argument("--batch", type=POSITIVE, default=8, help="clips per step")
    ap.add_argument("--clip-frames", type=COUNT, default=0, help="frames per clip (default 2*(W+S) rounded to B)")
    ap.add_argument("--lr", type=_number(float, 0.0, lo_open=True), default=3e-4)
    ap.add_argument("--min-lr-frac", type=FRACTION, default=0.1, help="cosine decays to lr * this")
    ap.add_argument("--warmup", type=COUNT, default=200, help="warmup steps")
    ap.add_argument("--weight-decay", type=NON_NEGATIVE, default=0.01)
    ap.add_argument("--grad-clip", type=_number(float, 0.0, lo_open=True), default=1.0)
    ap.add_argument("--ema", type=_number(float, 0.0, 0.999999), default=0.999)
    ap.add_argument("--seed", type=_number(int, 0, (1 << 62)), default=0)
    ap.add_argument("--device", type=parse_device, default="auto", help="auto, cpu, cuda or cuda:N")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model (falls back to eager on error)")
    ap.add_argument("--threads", type=_number(int, 0, 4096), default=0, help="CPU threads for torch (0: default)")
    # noise-level scheme
    ap.add_argument("--ctx-prob", type=FRACTION, default=0.5, help="P(clip has a near-clean prefix + block-shared sigmas)")
    ap.add_argument("--ctx-sigma-max", type=FRACTION, default=0.03, help="near-clean prefix sigma ~ U(0, this)")
    ap.add_argument("--sched-prob", type=FRACTION, default=0.25, help="P(a sigma is drawn from the config's sigmas)")
    ap.add_argument("--logit-mean", type=_number(float, -20.0, 20.0), default=0.0)
    ap.add_argument("--logit-std", type=_number(float, 0.0, 20.0, lo_open=True), default=1.0)
    ap.add_argument("--shift", type=_number(float, 0.0, 1000.0, lo_open=True), default=2.0,
                    help="sigma = s t / (1 + (s - 1) t), s > 1 favours high noise")
    ap.add_argument("--clean-loss-weight", type=NON_NEGATIVE, default=0.1, help="loss weight of frames with sigma < 0.05")
    ap.add_argument("--gap-prob", type=FRACTION, default=0.25, help="P(clip puts its sinks far back in the episode)")
    # bookkeeping
    ap.add_argument("--log-every", type=POSITIVE, default=20)
    ap.add_argument("--ckpt-every", type=POSITIVE, default=500, help="save the checkpoint every this many steps")
    ap.add_argument("--ckpt-every-s", type=NON_NEGATIVE, default=300, help="... and at least every this many seconds")
    ap.add_argument("--export-every-s", type=NON_NEGATIVE, default=0, help="export the EMA model every this many seconds")
    ap.add_argument("--split-mib", type=NON_NEGATIVE, default=0, help="exports also write parts of at most this many MiB")
    ap.add_argument("--resume", help="checkpoint to resume from")
    ap.add_argument("--holdout", type=COUNT, default=4, help="episodes held out for evaluation")
    ap.add_argument("--eval-clips", type=COUNT, default=8)
    ap.add_argument("--eval-horizons", type=parse_horizons, default="1,8,32")
    ap.add_argument("--eval-sigmas", type=parse_schedules, default="",
                    help="extra schedules to evaluate, e.g. '1;1,0.5;1,0.75,0.5,0.25'")
    ap.add_argument("--export-best", action="store_true",
                    help="evaluate the EMA and the raw weights at the end and export the better (default: EMA)")
    ap.add_argument("--max-episodes", type=COUNT, default=0)
    args = ap.parse_args(argv)
    if not args.steps and not args.minutes:
        ap.error("give --steps or --minutes (or both): with neither there is nothing to train")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        ap.error(f"--device {args.device}: this torch sees no CUDA device")
    if args.device.startswith("cuda:") and int(args.device[5:]) >= torch.cuda.device_count():
        ap.error(f"--device {args.device}: there are {torch.cuda.device_count()} CUDA devices")
    return args


class Logger:
    def __init__(self, path: str):
        self.f = open(path, "a", encoding="utf-8")

    def log(self, rec: dict) -> None:
        line = json.dumps(rec)
        self.f.write(line + "\n")
        self.f.flush()
        print(line, flush=True)

    def close(self) -> None:
        self.f.close()


def sample_sigmas(bt: int, n: int, block: int, args, sched: torch.Tensor, gen: torch.Generator, device) -> torch.Tensor:
    """[bt, n] noise levels (see docs/TRAINING.md, "Noise levels").

    With probability ctx_prob a clip has a near-clean prefix (sigma ~ U(0,
    ctx_sigma_max)) of 1 .. nblocks-1 blocks and one shared sigma per block
    after it, which is the inference situation; otherwise every frame draws
    its own sigma (diffusion forcing). A drawn sigma comes from the config's
    schedule with probability sched_prob, else from a shifted logit-normal.
    """
    nblk = n // block

    def draw(*shape):
        t = torch.sigmoid(torch.randn(*shape, generator=gen) * args.logit_std + args.logit_mean)
        s = args.shift * t / (1 + (args.shift - 1) * t)
        pick = torch.rand(*shape, generator=gen) < args.sched_prob
        si = sched[torch.randint(0, len(sched), shape, generator=gen)]
        return torch.where(pick, si, s)

    per_frame = draw(bt, n)
    per_block = draw(bt, nblk).repeat_interleave(block, dim=1)
    ctx = torch.rand(bt, generator=gen) < args.ctx_prob
    if nblk >= 2:
        cut = torch.randint(1, nblk, (bt,), generator=gen) * block
    else:
        cut = torch.zeros(bt, dtype=torch.long)
    pre = torch.arange(n)[None, :] < cut[:, None]
    near_clean = torch.rand(bt, n, generator=gen) * args.ctx_sigma_max
    sig = torch.where(ctx[:, None], torch.where(pre, near_clean, per_block), per_frame)
    return sig.to(device)


class EMA:
    def __init__(self, model: torch.nn.Module, decay: float):
        self.decay = decay
        self.shadow = {k: v.detach().clone().float() for k, v in model.state_dict().items()}

    @torch.no_grad()
    def update(self, model: torch.nn.Module, step: int) -> None:
        d = min(self.decay, (1 + step) / (10 + step))
        params = dict(model.named_parameters())
        keys = list(params)
        cur = [params[k].detach().float() for k in keys]
        sh = [self.shadow[k] for k in keys]
        torch._foreach_mul_(sh, d)
        torch._foreach_add_(sh, cur, alpha=1 - d)


def lr_at(step: int, progress: float, args) -> float:
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    p = min(max(progress, 0.0), 1.0)
    return args.lr * (args.min_lr_frac + (1 - args.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * p)))


def make_optimizer(model: torch.nn.Module, args) -> torch.optim.Optimizer:
    decay, no_decay = [], []
    for n, p in model.named_parameters():
        (decay if p.ndim >= 2 and "modulation" not in n else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": args.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    kw = {"fused": True} if torch.cuda.is_available() and next(model.parameters()).is_cuda and \
        "fused" in torch.optim.AdamW.__init__.__code__.co_varnames else {}
    return torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.99), **kw)


def save_checkpoint(path: str, model, ema: EMA, opt, step: int, elapsed: float, sampler: ClipSampler,
                    gen: torch.Generator, cfg, args) -> None:
    """everything a --resume restores, in the layout of export.write_checkpoint (tensors and plain data only)."""
    ck = {"model": {k: v.detach().cpu() for k, v in model.state_dict().items()},
          "ema": {k: v.cpu() for k, v in ema.shadow.items()},
          "opt": opt.state_dict(), "step": step, "elapsed": elapsed, "sampler": sampler.state(),
          "gen": gen.get_state(), "config": cfg.raw, "args": vars(args)}
    write_checkpoint(path, ck)


def eval_clips(data: EpisodeData, n_clips: int, length: int, seed: int) -> tuple:
    """n_clips held-out clips of `length` frames, spread over the episodes, deterministic."""
    rng = np.random.default_rng(seed)
    eps = [i for i in range(data.episodes) if data.lengths[i] >= length]
    if not eps:
        return None, None
    frames, acts = [], []
    for c in range(n_clips):
        e = eps[c % len(eps)]
        fr, ac = data.episode(e)
        s = int(rng.integers(0, len(fr) - length + 1))
        frames.append(fr[s:s + length])
        a = ac[s:s + length].copy()
        a[0] = 0  # a primed first frame carries no action, as frame 0 of a session
        acts.append(a)
    return np.stack(frames), np.stack(acts)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


class OutputError(ValueError):
    """an output path that cannot be written."""


def prepare_outputs(args) -> None:
    """makes --out and the folders of --ckpt and --export-dir before any work, so that a bad path
    fails at once rather than at the first checkpoint."""
    ckpt = args.ckpt or os.path.join(args.out, "ckpt.pt")
    for flag, d in (("--out", args.out), ("--ckpt", os.path.dirname(os.path.abspath(ckpt))),
                    ("--export-dir", args.export_dir or os.path.join(args.out, "model"))):
        if os.path.exists(d) and not os.path.isdir(d):
            raise OutputError(f"{flag}: {d} is not a folder")
        try:
            os.makedirs(d, exist_ok=True)
        except OSError as e:
            raise OutputError(f"{flag}: cannot make folder {d}: {e.strerror or e}") from None
        if not os.access(d, os.W_OK):
            raise OutputError(f"{flag}: folder {d} is not writable")
    if os.path.isdir(ckpt):
        raise OutputError(f"--ckpt {ckpt}: is a folder")


def main(argv=None) -> int:
    args = parse_args(argv)
    # a bad config, dataset, checkpoint or output path is one line and exit 2, as the engine's tools say it
    try:
        prepare_outputs(args)
    except OutputError as e:
        print(f"wmtrain: error: {e}", file=sys.stderr)
        return 2
    log = Logger(os.path.join(args.out, "train_log.jsonl"))
    try:
        return run(args, log)
    except (ConfigError, DataError, CheckpointError, OutputError) as e:
        print(f"wmtrain: error: {e}", file=sys.stderr)
        return 2
    finally:
        log.close()


def run(args, log: Logger) -> int:
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = load_config(args.config)
    if args.name:
        doc = copy.deepcopy(cfg.raw)
        doc["name"] = args.name
        cfg = parse_config(doc)
    for sig in args.eval_sigmas:
        try:
            replace_sampling(cfg, sigmas=sig)
        except ConfigError as e:
            raise ConfigError(f"--eval-sigmas {','.join(map(str, sig))}: {e}") from None
    device = resolve_device(args.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    export_dir = args.export_dir or os.path.join(args.out, "model")
    ckpt_path = args.ckpt or os.path.join(args.out, "ckpt.pt")

    # ---- data
    data_dir = args.data
    if not data_dir:
        if not args.synthetic:
            print("error: give --data DIR or --synthetic EPISODES", file=sys.stderr)
            return 2
        data_dir = os.path.join(args.out, "data")
        if not os.path.isdir(data_dir):
            make_synthetic(data_dir, args.synthetic, args.synthetic_frames, cfg.height, cfg.width, seed=args.seed)
    t_load = time.time()
    all_data = EpisodeData.load(data_dir, args.max_episodes or None)
    all_data.check(cfg)
    train_data, held = all_data.split(min(args.holdout, all_data.episodes - 1))
    b = cfg.frames_per_block
    n = args.clip_frames or 2 * (cfg.window_frames + cfg.sink_frames)
    n = max(b * 2, -(-n // b) * b)
    sampler = ClipSampler(train_data, n, b, cfg.sink_frames, args.gap_prob, seed=args.seed)
    frames_dev = torch.from_numpy(train_data.frames)
    acts_dev = torch.from_numpy(train_data.actions)
    if device.type == "cuda":
        frames_dev = frames_dev.to(device, non_blocking=True)
        acts_dev = acts_dev.to(device, non_blocking=True)
    log.log({"event": "data", "dir": data_dir, "episodes": all_data.episodes, "train_frames": train_data.total_frames,
             "held_out_episodes": held.episodes if held else 0, "clip_frames": n, "load_s": round(time.time() - t_load, 2)})

    # ---- model
    torch.manual_seed(args.seed)
    model = CLDiT(cfg).to(device)
    ema = EMA(model, args.ema)
    opt = make_optimizer(model, args)
    gen = torch.Generator().manual_seed(args.seed + 1)
    step, elapsed_before = 0, 0.0
    if args.resume:
        try:
            ck = load_checkpoint(args.resume)
        except CheckpointError as e:
            raise CheckpointError(f"--resume {e}") from None
        if ck["config"] != cfg.raw:
            raise CheckpointError(f"--resume {args.resume}: made for another config than {args.config}")
        try:
            model.load_state_dict(ck["model"])
            ema.shadow = {k: v.to(device) for k, v in ck["ema"].items()}
            opt.load_state_dict(ck["opt"])
            step, elapsed_before = ck["step"], float(ck["elapsed"])
            sampler.set_state(ck["sampler"])
            gen.set_state(ck["gen"])
        except (KeyError, ValueError, TypeError, RuntimeError) as e:
            raise CheckpointError(f"--resume {args.resume}: cannot resume from it ({type(e).__name__}: {str(e)[:200]})") from None
        log.log({"event": "resume", "from": args.resume, "step": step, "elapsed": elapsed_before})
    else:
        ema.shadow = {k: v.to(device) for k, v in ema.shadow.items()}
    mask = clip_mask(n, cfg.tokens, b, cfg.window_frames, cfg.sink_frames).to(device)
    sched = torch.tensor(cfg.sigmas, dtype=torch.float32)
    use_amp = device.type == "cuda"
    amp = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if use_amp else contextlib.nullcontext
    fwd = model
    if args.compile:
        try:
            fwd = torch.compile(model)
        except Exception as e:  # noqa: BLE001 - any failure means eager
            log.log({"event": "compile_failed", "error": repr(e)[:300]})
            fwd = model
    log.log({"event": "start", "params": param_count(model), "device": str(device), "batch": args.batch,
             "clip_frames": n, "tokens_per_clip": n * cfg.tokens, "compile": fwd is not model,
             "torch": torch.__version__, "config": cfg.raw})

    budget_s = args.minutes * 60.0
    max_steps = args.steps

    def progress(now_elapsed: float) -> float:
        ps = [step / max_steps] if max_steps else []
        if budget_s > 0:
            ps.append(now_elapsed / budget_s)
        return max(ps) if ps else 0.0

    def train_step(model_fn):
        idx, pos, gap_block = sampler.sample(args.batch)
        idx_t = torch.from_numpy(idx).to(frames_dev.device)
        fr = frames_dev[idx_t].to(device, non_blocking=True)  # [Bt, N, H, W, C] uint8
        act = acts_dev[idx_t].to(device, non_blocking=True)  # [Bt, N, A]
        x0 = patchify(fr.float() * (2.0 / 255.0) - 1.0, cfg.patch)  # [Bt, N, T, P]
        a_in = action_input(act, cfg)
        pos_t = torch.from_numpy(pos).to(device)
        sig = sample_sigmas(args.batch, n, b, args, sched, gen, device)  # [Bt, N]
        w = torch.where(sig < CLEAN_SIGMA, torch.full_like(sig, args.clean_loss_weight), torch.ones_like(sig))
        gb = torch.from_numpy(gap_block).to(device)
        blk_of = torch.arange(n, device=device) // b
        w = torch.where((gb[:, None] >= 0) & (blk_of[None, :] == gb[:, None]), torch.zeros_like(w), w)
        eps = torch.randn(x0.shape, generator=gen).to(device) if device.type == "cpu" else torch.randn_like(x0)
        s4 = sig[:, :, None, None]
        xt = (1 - s4) * x0 + s4 * eps
        target = eps - x0
        with amp():
            y = model_fn(xt, sig, a_in, pos_t, mask=mask)
        per_frame = (y.float() - target).pow(2).mean(dim=(2, 3))  # [Bt, N]
        loss = (per_frame * w).sum() / w.sum().clamp_min(1e-8)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), args.grad_clip)
        opt.step()
        return loss, gn

    t0 = time.time()
    last_log_t, last_log_step = t0, step
    last_ckpt_t = last_export_t = t0
    loss_hist = []
    frames_per_step = args.batch * n
    stop_reason = "steps"
    while True:
        elapsed = elapsed_before + (time.time() - t0)
        if max_steps and step >= max_steps:
            break
        if budget_s > 0 and elapsed >= budget_s:
            stop_reason = "minutes"
            break
        if not max_steps and budget_s <= 0:
            break
        lr = lr_at(step, progress(elapsed), args)
        for g in opt.param_groups:
            g["lr"] = lr
        try:
            loss, gn = train_step(fwd)
        except Exception as e:  # noqa: BLE001 - a failing compiled graph falls back to eager once
            if fwd is model:
                raise
            log.log({"event": "compile_failed", "error": repr(e)[:300]})
            fwd = model
            opt.zero_grad(set_to_none=True)
            continue
        ema.update(model, step)
        step += 1
        loss_hist.append(loss.detach())
        if step % args.log_every == 0 or step == 1:
            now = time.time()
            losses = torch.stack(loss_hist).float().cpu().numpy()
            loss_hist = []
            rate = (step - last_log_step) * frames_per_step / max(now - last_log_t, 1e-9)
            log.log({"step": step, "loss": float(losses.mean()), "lr": lr, "grad_norm": float(gn),
                     "elapsed": round(elapsed_before + now - t0, 2), "frames_per_s": round(rate, 1)})
            last_log_t, last_log_step = now, step
        now = time.time()
        if step % args.ckpt_every == 0 or now - last_ckpt_t >= args.ckpt_every_s:
            save_checkpoint(ckpt_path, model, ema, opt, step, elapsed_before + now - t0, sampler, gen, cfg, args)
            last_ckpt_t = now
        if args.export_every_s > 0 and now - last_export_t >= args.export_every_s:
            path = export_model(ema.shadow, cfg, export_dir, metadata={"step": step, "weights": "ema"},
                                split_bytes=int(args.split_mib * 1024 * 1024))
            log.log({"event": "export", "step": step, "dir": export_dir, **export_info(path)})
            last_export_t = now

    train_s = time.time() - t0
    elapsed = elapsed_before + train_s
    save_checkpoint(ckpt_path, model, ema, opt, step, elapsed, sampler, gen, cfg, args)
    path = export_model(ema.shadow, cfg, export_dir, metadata={"step": step, "weights": "ema"},
                        split_bytes=int(args.split_mib * 1024 * 1024))
    exported = export_info(path)
    log.log({"event": "export", "step": step, "dir": export_dir, "stop": stop_reason, **exported})

    # ---- evaluation of the exported (EMA) weights with the engine's sampling loop
    summary = {"params": param_count(model), "steps": step, "train_seconds": round(train_s, 1),
               "elapsed_total": round(elapsed, 1), "stop": stop_reason, "batch": args.batch, "clip_frames": n,
               "frames_per_s": round(frames_per_step * (step - (ck["step"] if args.resume else 0)) / max(train_s, 1e-9), 1),
               "device": str(device), "torch": torch.__version__, "data": data_dir,
               "export": {"dir": export_dir, **exported}, "train_episodes": train_data.episodes, "train_frames": train_data.total_frames, "config": cfg.raw,
               "args": vars(args)}
    horizons = args.eval_horizons
    if held is not None and args.eval_clips > 0:
        t_eval = time.time()
        length = b * (1 + math.ceil(max(horizons) / b))
        ef, ea = eval_clips(held, args.eval_clips, length, seed=args.seed + 7)
        if ef is not None:
            emodel = CLDiT(cfg).to(device)
            emodel.load_state_dict({k: v.to(device) for k, v in ema.shadow.items()})
            summary["eval"] = evaluate(emodel, ef, ea, horizons)
            summary["exported_weights"] = "ema"
            if args.export_best:
                raw_eval = evaluate(model, ef, ea, horizons)
                summary["eval_raw_weights"] = raw_eval
                score = lambda r: r["rollout"]["psnr_mean"] + r["teacher_forced"]["psnr_mean"]  # noqa: E731
                if score(raw_eval) > score(summary["eval"]):
                    path = export_model(model.state_dict(), cfg, export_dir, metadata={"step": step, "weights": "raw"},
                                        split_bytes=int(args.split_mib * 1024 * 1024))
                    summary["export"] = {"dir": export_dir, **export_info(path)}
                    summary["eval_ema_weights"], summary["eval"] = summary["eval"], raw_eval
                    summary["exported_weights"] = "raw"
                    emodel.load_state_dict(model.state_dict())
                    log.log({"event": "export", "step": step, "dir": export_dir, "weights": "raw", **summary["export"]})
            extra = {}
            for sig in args.eval_sigmas:  # checked against the config before training
                r = evaluate(emodel, ef, ea, horizons, sigmas=sig)
                extra[",".join(f"{v:g}" for v in sig)] = {"rollout": r["rollout"], "teacher_forced": r["teacher_forced"]}
            if extra:
                summary["eval_schedules"] = extra
            summary["eval_seconds"] = round(time.time() - t_eval, 1)
        else:
            summary["eval"] = f"held-out episodes are shorter than {length} frames"
    with open(os.path.join(args.out, "summary.json"), "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2)
        f.write("\n")
    log.log({"event": "done", "steps": step, "eval": summary.get("eval")})
    return 0


if __name__ == "__main__":
    sys.exit(main())
