"""trainer plumbing end to end on a tiny synthetic run: log, checkpoint, resume, export, reload, evaluation."""

import contextlib
import io
import json
import os
import pickle
import pickletools
import shutil
import sys
import tempfile
import unittest
import zipfile
from unittest import mock

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from wmtrain import export as export_mod  # noqa: E402
from wmtrain import train  # noqa: E402
from wmtrain.model import clip_mask_frames  # noqa: E402
from wmtrain.safetensors import load_file, load_metadata  # noqa: E402

CONFIG = os.path.join(os.path.dirname(__file__), "..", "configs", "tiny.json")


# the opcodes torch 1.13's weights-only reader takes (floats, for one, it refuses)
WEIGHTS_ONLY_OPS = {"APPEND", "APPENDS", "BINGET", "BININT", "BININT1", "BININT2", "BINPERSID", "BINPUT", "BINUNICODE",
                    "BUILD", "EMPTY_DICT", "EMPTY_LIST", "EMPTY_SET", "EMPTY_TUPLE", "GLOBAL", "LONG1", "LONG_BINGET",
                    "LONG_BINPUT", "MARK", "NEWFALSE", "NEWTRUE", "NEWOBJ", "NONE", "PROTO", "REDUCE", "SETITEM",
                    "SETITEMS", "SHORT_BINSTRING", "STOP", "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3"}


def _read(path):
    with open(path, "rb") as f:
        return f.read()


def _pickle_of(path):
    with zipfile.ZipFile(path) as z:
        return z.read(next(n for n in z.namelist() if n.endswith("/data.pkl")))


class _WritesMarker:
    """an object whose unpickling runs code: it creates the file `path`."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


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
        # the same records deflated: a compressed record could inflate far past the file's size
        with zipfile.ZipFile(good) as src, zipfile.ZipFile(os.path.join(bad, "deflated.pt"), "w",
                                                           zipfile.ZIP_DEFLATED) as dst:
            for info in src.infolist():
                dst.writestr(info.filename, src.read(info))
        ck = export_mod.load_checkpoint(good)
        ck["ema"] = dict(ck["ema"], **{"head.bias": torch.zeros(3)})
        export_mod.write_checkpoint(os.path.join(bad, "shape.pt"), ck)
        ck = export_mod.load_checkpoint(good)
        ck["config"] = dict(ck["config"], dim=-1)
        export_mod.write_checkpoint(os.path.join(bad, "config.pt"), ck)
        expect = {"missing.pt": "cannot read it", "garbage.pt": "damaged", "cut.pt": "damaged", "short.pt": "damaged",
                  "foreign.pt": "not a wmtrain checkpoint", "list.pt": "not a wmtrain checkpoint",
                  "shape.pt": "head.bias", "config.pt": "its config", "deflated.pt": "compressed record"}
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
        export_mod.write_checkpoint(other, ck)
        self._fails(train.main, base + ["--resume", other], "--resume", "another config")
        ck = export_mod.load_checkpoint(os.path.join(self.out, "ckpt.pt"))
        ck["sampler"] = {"bit_generator": "nothing"}
        odd = os.path.join(out, "odd.pt")
        export_mod.write_checkpoint(odd, ck)
        self._fails(train.main, base + ["--resume", odd], "--resume", "cannot resume")
        self.assertFalse(os.path.exists(os.path.join(out, "ckpt.pt")))

    def test_checkpoint_holds_tensors_and_plain_data_only(self):
        good = os.path.join(self.out, "ckpt.pt")
        doc = torch.load(good, map_location="cpu", weights_only=True)
        self.assertEqual((doc["format"], doc["version"]), ("wmtrain-checkpoint", 2))
        self.assertEqual(json.loads(doc["meta"])["step"], 4)
        self.assertTrue(all(torch.is_tensor(v) for st in doc["opt_state"].values() for v in st.values()))
        ops = [(op.name, arg) for op, arg, _ in pickletools.genops(_pickle_of(good))]
        self.assertLessEqual({name for name, _ in ops}, WEIGHTS_ONLY_OPS)
        for name, arg in ops:
            if name == "GLOBAL":
                self.assertTrue(arg in ("torch._utils _rebuild_tensor_v2", "collections OrderedDict") or
                                (arg.startswith("torch ") and arg.endswith("Storage")), arg)
        ck = export_mod.load_checkpoint(good)
        self.assertEqual(ck["opt"]["param_groups"][0]["betas"], (0.9, 0.99))
        self.assertEqual(ck["step"], 4)
        self.assertIsInstance(ck["elapsed"], float)

    def test_resume_continues_identically(self):
        """3 steps and a resume to 6 end where 6 steps in one run end (the warmup keeps the lr off --steps)."""
        def run(out, *extra):
            argv = ["--config", CONFIG, "--data", os.path.join(self.out, "data"), "--out", out, "--batch", "2",
                    "--clip-frames", "8", "--warmup", "10", "--holdout", "2", "--eval-clips", "0", "--threads", "1",
                    "--seed", "3", "--gap-prob", "0.5"]
            with contextlib.redirect_stdout(io.StringIO()):
                self.assertEqual(train.main(argv + list(extra)), 0)
            return export_mod.load_checkpoint(os.path.join(out, "ckpt.pt"))

        whole = run(os.path.join(self.out, "whole"), "--steps", "6")
        part = os.path.join(self.out, "part")
        self.assertEqual(run(part, "--steps", "3")["step"], 3)
        resumed = run(part, "--steps", "6", "--resume", os.path.join(part, "ckpt.pt"))
        self.assertEqual(resumed["step"], 6)
        for name in ("model", "ema"):
            self.assertEqual(set(whole[name]), set(resumed[name]))
            for k, v in whole[name].items():
                self.assertTrue(torch.equal(v, resumed[name][k]), f"{name} {k}")
        self.assertEqual(set(whole["opt"]["state"]), set(resumed["opt"]["state"]))
        for i, st in whole["opt"]["state"].items():
            for k, v in st.items():
                self.assertTrue(torch.equal(v, resumed["opt"]["state"][i][k]), f"opt {i} {k}")
        self.assertEqual(whole["opt"]["param_groups"], resumed["opt"]["param_groups"])
        self.assertEqual(whole["sampler"], resumed["sampler"])
        self.assertTrue(torch.equal(whole["gen"], resumed["gen"]))

    def test_older_format_is_refused_unread(self):
        good = os.path.join(self.out, "ckpt.pt")
        old = os.path.join(self.out, "old.pt")
        torch.save(export_mod.load_checkpoint(good), old)  # the former layout: this dict pickled whole
        with self.assertRaises(export_mod.CheckpointError) as cm:
            export_mod.load_checkpoint(old)
        self.assertIn(old, str(cm.exception))
        self.assertIn("older wmtrain format", str(cm.exception))
        self._fails(export_mod.main, ["--ckpt", old, "--out", os.path.join(self.out, "old_model")], old, "older")

    def test_refuses_code_in_a_checkpoint_without_running_it(self):
        good = os.path.join(self.out, "ckpt.pt")
        d = tempfile.mkdtemp(dir=self.out)
        control = os.path.join(d, "control")
        pickle.loads(pickle.dumps(_WritesMarker(control))).close()
        self.assertTrue(os.path.exists(control))  # unpickled, the object does run code
        marker = os.path.join(d, "ran")
        doc = torch.load(good, map_location="cpu", weights_only=True)
        paths = [os.path.join(d, n) for n in ("top.pt", "meta.pt", "proto4.pt", "old.pt", "torchscript.pt")]
        torch.save(_WritesMarker(marker), paths[0])
        torch.save(dict(doc, meta=_WritesMarker(marker)), paths[1])
        torch.save(dict(doc, meta=_WritesMarker(marker)), paths[2], pickle_protocol=4)
        torch.save(dict(export_mod.load_checkpoint(good), args=_WritesMarker(marker)), paths[3])
        with zipfile.ZipFile(good) as src, zipfile.ZipFile(paths[4], "w") as dst:
            for info in src.infolist():
                dst.writestr(info, src.read(info))
            dst.writestr(src.namelist()[0].split("/")[0] + "/constants.pkl", pickle.dumps(_WritesMarker(marker)))
        for p in paths:
            with self.assertRaises(export_mod.CheckpointError, msg=p) as cm:
                export_mod.load_checkpoint(p)
            self.assertIn(p, str(cm.exception))
            self.assertNotIn("\n", str(cm.exception))
            self._fails(export_mod.main, ["--ckpt", p, "--out", os.path.join(d, "model")], "--ckpt", p)
        self.assertIn("TorchScript", str(cm.exception))
        base = ["--config", CONFIG, "--data", os.path.join(self.out, "data"), "--out", os.path.join(d, "out"),
                "--batch", "2", "--clip-frames", "8", "--threads", "1", "--steps", "1", "--eval-clips", "0"]
        self._fails(train.main, base + ["--resume", paths[1]], "--resume", paths[1])
        # torch's weights-only reader refuses them too, without the scan before it
        with mock.patch.object(export_mod, "_scan_pickle", return_value=(set(), set())):
            for p in paths[:4]:
                with self.assertRaises(export_mod.CheckpointError, msg=p):
                    export_mod.load_checkpoint(p)
        self.assertFalse(os.path.exists(marker))
        self.assertFalse(os.path.exists(os.path.join(d, "model", "model.safetensors")))

    def test_refuses_to_load_with_a_torch_without_weights_only(self):
        def load(f, map_location=None, pickle_module=None, **pickle_load_args):
            raise AssertionError("an unrestricted torch.load was called")

        with mock.patch.object(torch, "load", load):
            with self.assertRaises(export_mod.CheckpointError) as cm:
                export_mod.load_checkpoint(os.path.join(self.out, "ckpt.pt"))
        self.assertIn("weights_only", str(cm.exception))


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
