"""tests/golden/parity: present, small, reproducible from the stored weights, internally consistent."""

import os
import sys
import unittest

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from wmtrain.config import load_config  # noqa: E402
from wmtrain.golden import ACTIONS, BLOCKS, LAYER_BLOCKS, check  # noqa: E402
from wmtrain.model import unpatchify  # noqa: E402
from wmtrain.safetensors import load_file, load_metadata  # noqa: E402

FIXTURE = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "tests", "golden", "parity"))


@unittest.skipUnless(os.path.isdir(FIXTURE), "fixture not generated")
class Fixture(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.cfg = load_config(os.path.join(FIXTURE, "config.json"))
        cls.exp = load_file(os.path.join(FIXTURE, "expected.safetensors"))

    def test_small(self):
        total = sum(os.path.getsize(os.path.join(FIXTURE, f)) for f in os.listdir(FIXTURE))
        self.assertLess(total, 1 << 20)

    def test_names_and_shapes(self):
        c = self.cfg
        b, t, p, d = c.frames_per_block, c.tokens, c.patch_dim, c.dim
        n = BLOCKS * b
        want = {"actions": [n, 6], "frames": [n, c.height, c.width, c.channels]}
        for blk in range(BLOCKS):
            want[f"block{blk}.cond"] = [b, d]
            want[f"block{blk}.write.cond"] = [b, d]
            want[f"block{blk}.noise"] = [b * t, p]
            for i in range(len(c.sigmas)):
                want[f"block{blk}.step{i}.velocity"] = [b * t, p]
        for blk in LAYER_BLOCKS:
            for l in range(c.layers):
                want[f"block{blk}.step0.layer{l}"] = [b * t, d]
                want[f"block{blk}.write.layer{l}"] = [b * t, d]
        self.assertEqual({k: list(v.shape) for k, v in self.exp.items()}, want)
        self.assertTrue(all(v.dtype == np.float32 for v in self.exp.values()))
        np.testing.assert_array_equal(self.exp["actions"], ACTIONS)
        self.assertEqual(load_metadata(os.path.join(FIXTURE, "expected.safetensors"))["session_seed"], "1234")

    def test_euler_consistency(self):
        """frames = clamp(noise + sum_i (sigma_{i+1} - sigma_i) v_i), from the stored tensors alone."""
        c = self.cfg
        sig = list(c.sigmas) + [0.0]
        b = c.frames_per_block
        for blk in range(BLOCKS):
            x = self.exp[f"block{blk}.noise"].astype(np.float64)
            for i in range(len(c.sigmas)):
                x = x + (sig[i + 1] - sig[i]) * self.exp[f"block{blk}.step{i}.velocity"]
            img = unpatchify(torch.from_numpy(np.clip(x, -1, 1)).reshape(b, c.tokens, c.patch_dim), c.patch,
                             c.height, c.width, c.channels).numpy()
            np.testing.assert_allclose(img, self.exp["frames"][blk * b:(blk + 1) * b], atol=2e-6)

    def test_reproducible(self):
        self.assertLess(check(FIXTURE), 1e-6)


if __name__ == "__main__":
    unittest.main()
