"""config.json validation per MODEL_FORMAT.md."""

import copy
import json
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from wmtrain.config import ConfigError, load_config, parse_config  # noqa: E402
from wmtrain.golden import CONFIG  # noqa: E402

HERE = os.path.dirname(__file__)


class Configs(unittest.TestCase):
    def test_shipped_configs_load(self):
        cfg = load_config(os.path.join(HERE, "..", "configs", "default.json"))
        self.assertEqual((cfg.tokens, cfg.patch_dim, cfg.action_dim), (64, 192, 6))
        self.assertEqual(cfg.sigmas, (1.0, 0.7, 0.35))
        self.assertEqual((cfg.window_frames, cfg.sink_frames, cfg.frames_per_block), (16, 1, 1))
        load_config(os.path.join(HERE, "..", "configs", "tiny.json"))
        golden = os.path.join(HERE, "..", "..", "tests", "golden", "parity", "config.json")
        if os.path.exists(golden):
            self.assertEqual(load_config(golden).raw, CONFIG)

    def test_round_trip(self):
        cfg = parse_config(CONFIG)
        self.assertEqual(parse_config(json.loads(cfg.to_json())), cfg)

    def test_rejections(self):
        def bad(fn):
            doc = copy.deepcopy(CONFIG)
            fn(doc)
            with self.assertRaises(ConfigError):
                parse_config(doc)
        bad(lambda d: d.update(format="other"))
        bad(lambda d: d.update(version=2))
        bad(lambda d: d.update(name=""))
        bad(lambda d: d.update(name="x" * 65))
        bad(lambda d: d["frame"].update(height=18))
        bad(lambda d: d["frame"].update(patch=33))
        bad(lambda d: d["frame"].update(channels=4))  # pixels need 3
        bad(lambda d: d["frame"].update(decoder="vae"))
        bad(lambda d: d.update(head_dim=31))
        bad(lambda d: d.update(freq_dim=31))
        bad(lambda d: d.update(norm_eps=0))
        bad(lambda d: d["rope"].update(t_pairs=7))
        bad(lambda d: d["rope"].update(theta=1.0))
        bad(lambda d: d["actions"].update(keys=[]))
        bad(lambda d: d["actions"].update(keys=["W", "W"]))
        bad(lambda d: d["actions"].update(mouse=["a", "b", "c", "d", "e"]))
        bad(lambda d: d["actions"].update(mouse_scale=0))
        bad(lambda d: d["sampling"].update(sigmas=[0.9, 0.5]))
        bad(lambda d: d["sampling"].update(sigmas=[1.0, 0.5, 0.5]))
        bad(lambda d: d["sampling"].update(sigmas=[1.0, 0.0]))
        bad(lambda d: d["sampling"].update(sigmas=[]))
        bad(lambda d: d["sampling"].update(frames_per_block=17))
        bad(lambda d: d["cache"].update(window_frames=1))  # < B = 2
        bad(lambda d: d["cache"].update(sink_frames=-1))
        bad(lambda d: d.update(layers=True))
        bad(lambda d: d.pop("cache"))


if __name__ == "__main__":
    unittest.main()
