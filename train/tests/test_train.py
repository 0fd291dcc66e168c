"""trainer plumbing end to end on a tiny synthetic run: log, checkpoint, resume, export, reload, evaluation."""

import contextlib
import io
import json
import os
import shutil
import sys
import tempfile
import unittest

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from wmtrain import export as export_mod  # noqa: E402
from wmtrain import train  # noqa: E402
from wmtrain.model import clip_mask_frames  # noqa: E402
from wmtrain.safetensors import load_file, load_metadata  # noqa: E402

CONFIG = os.path.join(os.path.dirname(__file__), "..", "configs", "tiny.json")


def _read(path):
    with open(path, "rb") as f:
        return f.read()


class TrainSmoke(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.out = tempfile.mkdtemp()
        cls.args = ["--config", CONFIG, "--synthetic", "6", "--synthetic-frames", "24", "--out", cls.out,
                    "--batch", "2", "--clip-frames", "8", "--log-every", "2", "--warmup", "2", "--holdout", "2",
                    "--eval-clips", "2", "--eval-horizons", "1,3", "--eval-sigmas", "1;1,0.5", "--threads", "1",
                    "--seed", "5"]
        rc = train.main(cls.args + ["--steps", "4"])
        assert rc == 0

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.out, ignore_errors=True)

    def test_outputs(self):
        for f in ("train_log.jsonl", "ckpt.pt", "summary.json", "model/config.json", "model/model.safetensors"):
            self.assertTrue(os.path.exists(os.path.join(self.out, f)), f)
        with open(os.path.join(self.out, "summary.json")) as f:
            s = json.load(f)
        self.assertEqual(s["steps"], 4)
        for mode in ("rollout", "teacher_forced", "copy_last", "copy_first"):
            self.assertIn("psnr@3", s["eval"][mode])
        self.assertIn("1,0.5", s["eval_schedules"])
        with open(os.path.join(self.out, "train_log.jsonl")) as f:
            steps = [json.loads(l) for l in f if '"loss"' in l]
        self.assertTrue(all(np.isfinite(r["loss"]) for r in steps))
        self.assertTrue(all(k in steps[-1] for k in ("step", "loss", "lr", "elapsed", "frames_per_s")))

    def test_export_reload_round_trip(self):
        ck = export_mod.load_checkpoint(os.path.join(self.out, "ckpt.pt"))
        m = export_mod.load_model_dir(os.path.join(self.out, "model"))
        for k, v in m.state_dict().items():
            self.assertTrue(torch.equal(v, ck["ema"][k].float()), k)
        self.assertEqual(load_metadata(os.path.join(self.out, "model", "model.safetensors"))["weights"], "ema")
        # F16 export through the CLI, split into parts that join to the same bytes
        d16 = os.path.join(self.out, "m16")
        export_mod.main(["--ckpt", os.path.join(self.out, "ckpt.pt"), "--out", d16, "--f16", "--split-mib", "0.25"])
        t16 = load_file(os.path.join(d16, "model.safetensors"))
        self.assertEqual(t16["head.weight"].dtype, np.float16)
        parts = sorted(p for p in os.listdir(d16) if ".part" in p)
        self.assertGreater(len(parts), 1)
        joined = b"".join(_read(os.path.join(d16, f"model.safetensors.part{i}")) for i in range(len(parts)))
        self.assertEqual(joined, _read(os.path.join(d16, "model.safetensors")))
        m16 = export_mod.load_model_dir(d16)
        for k, v in m16.state_dict().items():
            np.testing.assert_allclose(v.numpy(), ck["ema"][k].float().numpy(), rtol=1e-3, atol=1e-4)

    def test_resume_continues(self):
        out2 = os.path.join(self.out, "resumed")
        shutil.copytree(self.out, out2, ignore=shutil.ignore_patterns("resumed", "m16"))
        args = [a if a != self.out else out2 for a in self.args]
        rc = train.main(args + ["--steps", "6", "--resume", os.path.join(out2, "ckpt.pt"), "--eval-clips", "0"])
        self.assertEqual(rc, 0)
        ck = export_mod.load_checkpoint(os.path.join(out2, "ckpt.pt"))
        self.assertEqual(ck["step"], 6)

    def _fails(self, fn, argv, *words):
        """fn(argv) ends with exit status 2 and one line on stderr holding every word, and no traceback."""
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                rc = fn(argv)
            except SystemExit as e:
                rc = e.code
        text = err.getvalue()
        self.assertEqual(rc, 2, f"{argv}: {text}")
        self.assertNotIn("Traceback", text)
        for w in words:
            self.assertIn(w, text, argv)
        return text

    def test_export_refuses_damaged_checkpoints(self):
        bad = os.path.join(self.out, "bad")
        os.makedirs(bad, exist_ok=True)
        good = os.path.join(self.out, "ckpt.pt")
        blob = _read(good)
        cases = {"garbage.pt": b"not a checkpoint\n", "cut.pt": blob[: len(blob) // 2], "short.pt": blob[:-64]}
        for name, data in cases.items():
            with open(os.path.join(bad, name), "wb") as f:
                f.write(data)
        torch.save({"x": 1}, os.path.join(bad, "foreign.pt"))
        torch.save([1, 2], os.path.join(bad, "list.pt"))
        ck = export_mod.load_checkpoint(good)
        ck["ema"] = dict(ck["ema"], **{"head.bias": torch.zeros(3)})
        torch.save(ck, os.path.join(bad, "shape.pt"))
        ck = export_mod.load_checkpoint(good)
        ck["config"] = dict(ck["config"], dim=-1)
        torch.save(ck, os.path.join(bad, "config.pt"))
        expect = {"missing.pt": "cannot read it", "garbage.pt": "damaged", "cut.pt": "damaged", "short.pt": "damaged",
                  "foreign.pt": "not a wmtrain checkpoint", "list.pt": "not a wmtrain checkpoint",
                  "shape.pt": "head.bias", "config.pt": "its config"}
        for name, word in expect.items():
            path = os.path.join(bad, name)
            self._fails(export_mod.main, ["--ckpt", path, "--out", os.path.join(bad, "model")], path, word)
        self._fails(export_mod.main, ["--ckpt", bad, "--out", os.path.join(bad, "model")], "Is a directory")
        self.assertFalse(os.path.exists(os.path.join(bad, "model", "model.safetensors")))
        # flags and the output folder
        self._fails(export_mod.main, ["--ckpt", good, "--out", "/dev/null/model"], "--out")
        self._fails(export_mod.main, ["--ckpt", good, "--out", os.path.join(bad, "m"), "--split-mib", "-1"], "--split-mib")
        self._fails(export_mod.main, ["--ckpt", good, "--out", os.path.join(bad, "m"), "--name", ""], "name")
        self._fails(export_mod.main, ["--ckpt", good, "--out", os.path.join(bad, "m"), "--f16", "--bf16"], "--bf16")

    def test_train_refuses_bad_flags_and_outputs_before_any_work(self):
        data = os.path.join(self.out, "data")
        out = os.path.join(self.out, "refused")
        base = ["--config", CONFIG, "--data", data, "--out", out, "--batch", "2", "--clip-frames", "8", "--threads", "1"]
        for extra, word in ((["--steps", "-1"], "--steps"), (["--steps", "1", "--batch", "0"], "--batch"),
                            (["--steps", "1", "--lr", "nan"], "--lr"), (["--steps", "1", "--device", "tpu"], "--device"),
                            ([], "--steps or --minutes"), (["--steps", "1", "--eval-horizons", "0"], "--eval-horizons"),
                            (["--steps", "1", "--eval-sigmas", "1;x"], "--eval-sigmas"),
                            (["--steps", "1", "--ema", "1.5"], "--ema")):
            self._fails(train.main, base + extra, word)
        # checked before training starts, so nothing is written
        self._fails(train.main, base + ["--steps", "1", "--eval-sigmas", "0.5,1"], "--eval-sigmas", "start at 1")
        self._fails(train.main, base + ["--steps", "1", "--ckpt", "/dev/null/ckpt.pt"], "--ckpt")
        self._fails(train.main, base + ["--steps", "1", "--export-dir", "/dev/null/model"], "--export-dir")
        self.assertFalse(os.path.exists(os.path.join(out, "ckpt.pt")))

    def test_resume_refuses_damaged_or_foreign_checkpoints(self):
        out = os.path.join(self.out, "refused_resume")
        os.makedirs(out, exist_ok=True)
        cut = os.path.join(out, "cut.pt")
        with open(cut, "wb") as f:
            f.write(_read(os.path.join(self.out, "ckpt.pt"))[:-64])
        base = [a if a != self.out else out for a in self.args] + ["--steps", "6", "--eval-clips", "0",
                                                                   "--data", os.path.join(self.out, "data")]
        self._fails(train.main, base + ["--resume", cut], "--resume", cut, "damaged")
        self._fails(train.main, base + ["--resume", os.path.join(out, "none.pt")], "--resume", "cannot read it")
        ck = export_mod.load_checkpoint(os.path.join(self.out, "ckpt.pt"))
        ck["config"] = dict(ck["config"], name="another")
        other = os.path.join(out, "other.pt")
        torch.save(ck, other)
        self._fails(train.main, base + ["--resume", other], "--resume", "another config")
        ck = export_mod.load_checkpoint(os.path.join(self.out, "ckpt.pt"))
        ck["sampler"] = {"bit_generator": "nothing"}
        odd = os.path.join(out, "odd.pt")
        torch.save(ck, odd)
        self._fails(train.main, base + ["--resume", odd], "--resume", "cannot resume")
        self.assertFalse(os.path.exists(os.path.join(out, "ckpt.pt")))


class NoiseScheme(unittest.TestCase):
    def test_sigma_sampling(self):
        args = train.parse_args(["--config", CONFIG, "--out", "/tmp/unused", "--steps", "1"])
        g = torch.Generator().manual_seed(0)
        sched = torch.tensor([1.0, 0.7, 0.35])
        s = train.sample_sigmas(4000, 12, 2, args, sched, g, "cpu")
        self.assertTrue(bool(((s >= 0) & (s <= 1)).all()))
        near_clean_first = s[:, :2].max(dim=1).values < args.ctx_sigma_max
        self.assertAlmostEqual(float(near_clean_first.float().mean()), args.ctx_prob, delta=0.05)
        # the last block always lies after the cut: one shared sigma
        self.assertTrue(bool((s[near_clean_first, -2] == s[near_clean_first, -1]).all()))
        on_sched = float(torch.isin(s, sched).float().mean())
        self.assertGreater(on_sched, 0.1)

    def test_lr_schedule(self):
        args = train.parse_args(["--config", CONFIG, "--out", "/tmp/unused", "--steps", "1", "--warmup", "10", "--lr", "1e-3"])
        self.assertAlmostEqual(train.lr_at(0, 0.0, args), 1e-4)
        self.assertAlmostEqual(train.lr_at(10, 0.0, args), 1e-3)
        self.assertAlmostEqual(train.lr_at(100, 1.0, args), 1e-4)

    def test_mask_is_block_causal(self):
        m = clip_mask_frames(8, 2, 3, 1)
        self.assertTrue(m[1, 0] and m[0, 1])  # a block sees itself
        self.assertFalse(m[1, 2])  # never a later block


if __name__ == "__main__":
    unittest.main()
