"""dataset loading, clip sampling and the synthetic generator."""

import os
import shutil
import sys
import tempfile
import unittest

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from wmtrain.config import load_config  # noqa: E402
from wmtrain.data import ClipSampler, DataError, EpisodeData, make_synthetic  # noqa: E402

HERE = os.path.dirname(__file__)


class Data(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp()
        make_synthetic(cls.dir, episodes=5, frames=40, height=32, width=32, seed=1)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def test_layout(self):
        fr = np.load(os.path.join(self.dir, "episode_00000", "frames.npy"))
        ac = np.load(os.path.join(self.dir, "episode_00000", "actions.npy"))
        self.assertEqual((fr.dtype, fr.shape), (np.uint8, (40, 32, 32, 3)))
        self.assertEqual((ac.dtype, ac.shape), (np.float32, (40, 6)))
        self.assertTrue(np.all(ac[0] == 0))
        self.assertTrue(np.all(np.isin(ac[:, :4], (0, 1))))

    def test_load_split_check(self):
        d = EpisodeData.load(self.dir)
        self.assertEqual((d.episodes, d.total_frames), (5, 200))
        d.check(load_config(os.path.join(HERE, "..", "configs", "tiny.json")))
        with self.assertRaises(DataError):
            d.check(load_config(os.path.join(HERE, "..", "configs", "default.json")))  # 64x64
        tr, ho = d.split(2)
        self.assertEqual((tr.episodes, ho.episodes), (3, 2))
        np.testing.assert_array_equal(ho.episode(1)[0], d.episode(4)[0])

    def test_clips_stay_in_episodes(self):
        d = EpisodeData.load(self.dir)
        for gap_prob in (0.0, 1.0):
            s = ClipSampler(d, 12, 2, 1, gap_prob=gap_prob, seed=3)
            idx, pos, gap_block = s.sample(64)
            ep = np.searchsorted(d.starts, idx[:, 0], side="right") - 1
            self.assertTrue(np.all(idx >= d.starts[ep][:, None]))
            self.assertTrue(np.all(idx < (d.starts[ep] + d.lengths[ep])[:, None]))
            self.assertTrue(np.all(np.diff(pos, axis=1) >= 1))
            np.testing.assert_array_equal(idx - idx[:, :1], pos)
            if gap_prob == 0:
                self.assertTrue(np.all(gap_block == -1))
                self.assertTrue(np.all(np.diff(idx, axis=1) == 1))
            else:
                self.assertTrue(np.all(gap_block == 1))  # k0 = ceil(1 / 2) * 2 = 2 frames, then the gap
                self.assertTrue(np.all(pos[:, 2] - pos[:, 1] > 1))
                self.assertTrue(np.all(np.diff(pos[:, 2:], axis=1) == 1))


if __name__ == "__main__":
    unittest.main()
