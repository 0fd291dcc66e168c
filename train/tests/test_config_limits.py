"""config.json limits and unreadable files, without torch: a bad config is a ConfigError, never another exception."""

import copy
import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from wmtrain.config import ConfigError, load_config, parse_config  # noqa: E402

HERE = os.path.dirname(__file__)


class ConfigLimits(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        with open(os.path.join(HERE, "..", "configs", "tiny.json"), encoding="utf-8") as f:
            cls.doc = json.load(f)

    def test_documented_upper_bounds(self):
        # MODEL_FORMAT.md's ranges: beyond them the engine refuses the model, and a huge width is a huge allocation
        def bad(fn):
            doc = copy.deepcopy(self.doc)
            fn(doc)
            with self.assertRaises(ConfigError):
                parse_config(doc)
        parse_config(self.doc)
        bad(lambda d: d.update(heads=257))
        bad(lambda d: d.update(ffn=65537))
        bad(lambda d: d.update(ffn=10 ** 12))
        bad(lambda d: d.update(freq_dim=4098))
        bad(lambda d: d.update(norm_eps=2.0))
        bad(lambda d: d["rope"].update(theta=1e10))
        bad(lambda d: d["actions"].update(keys=["WA", "S"]))
        bad(lambda d: d["actions"].update(keys=["#", "S"]))
        bad(lambda d: d["actions"].update(keys=[" ", "S"]))
        bad(lambda d: d["actions"].update(mouse_scale=1e7))
        bad(lambda d: d["actions"].update(mouse_limit=1e-9))
        bad(lambda d: d["cache"].update(sink_frames=1001))
        bad(lambda d: d.update(name="bad\nname"))

    def test_names_as_the_engine_reads_them(self):
        # 1..64 bytes of UTF-8 (the engine counts bytes), no C0/C1/bidirectional controls
        def name_ok(name):
            doc = copy.deepcopy(self.doc)
            doc["name"] = name
            try:
                parse_config(doc)
                return True
            except ConfigError:
                return False
        self.assertTrue(name_ok("\u00e9" * 32))
        self.assertTrue(name_ok("caf\u00e9 \u2615"))
        self.assertFalse(name_ok("\u00e9" * 33))
        for bad in ("a\u0085b", "a\u009b2J", "a\x7f", "evil\u202egpj.exe", "x\u2066y", "x\ud800y"):
            self.assertFalse(name_ok(bad), repr(bad))

    def test_unreadable_files(self):
        with tempfile.TemporaryDirectory() as tmp:
            cases = {"missing.json": None, "folder.json": "dir", "latin1.json": b"\xff\xfe{",
                     "deep.json": b"[" * 100000, "huge.json": b" " * (1 << 20) + b"{}"}
            for name, content in cases.items():
                path = os.path.join(tmp, name)
                if content == "dir":
                    os.mkdir(path)
                elif content is not None:
                    with open(path, "wb") as f:
                        f.write(content)
                with self.assertRaises(ConfigError, msg=name) as cm:
                    load_config(path)
                self.assertIn(path, str(cm.exception))


if __name__ == "__main__":
    unittest.main()
