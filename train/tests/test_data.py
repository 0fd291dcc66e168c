"""dataset loading, clip sampling and the synthetic generator."""

import json
import os
import shutil
import sys
import tempfile
import unittest
from unittest import mock

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


class BrokenData(unittest.TestCase):
    """a damaged dataset is a DataError that names the file, never another exception or a huge allocation."""

    @classmethod
    def setUpClass(cls):
        cls.good = tempfile.mkdtemp()
        make_synthetic(cls.good, episodes=3, frames=20, height=32, width=32, seed=2)
        cls.cfg = load_config(os.path.join(HERE, "..", "configs", "tiny.json"))

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.good, ignore_errors=True)

    def setUp(self):
        self.dir = os.path.join(tempfile.mkdtemp(), "data")
        shutil.copytree(self.good, self.dir)
        self.ep = os.path.join(self.dir, "episode_00001")

    def tearDown(self):
        shutil.rmtree(os.path.dirname(self.dir), ignore_errors=True)

    def assert_refused(self, needle):
        with self.assertRaises(DataError) as cm:
            EpisodeData.load(self.dir).check(self.cfg)
        self.assertIn(needle, str(cm.exception))

    def test_truncated_frames(self):
        os.truncate(os.path.join(self.ep, "frames.npy"), 1000)
        self.assert_refused("episode_00001/frames.npy")

    def test_truncated_actions(self):
        for size in (100, 30):
            os.truncate(os.path.join(self.ep, "actions.npy"), size)
            self.assert_refused("episode_00001/actions.npy")

    def test_missing_or_directory(self):
        os.remove(os.path.join(self.ep, "actions.npy"))
        self.assert_refused("episode_00001/actions.npy")
        os.mkdir(os.path.join(self.ep, "actions.npy"))
        self.assert_refused("episode_00001/actions.npy")

    def test_wrong_dtypes(self):
        path = os.path.join(self.ep, "actions.npy")
        np.save(path, np.array([{}] * 20, dtype=object), allow_pickle=True)
        self.assert_refused("episode_00001/actions.npy")
        np.save(path, np.array([["a"] * 6] * 20))
        self.assert_refused("episode_00001/actions.npy")

    def test_absurd_header_shape(self):
        # the header claims 2.4e12 floats (8.7 TiB); the file holds 120
        path = os.path.join(self.ep, "actions.npy")
        with open(path, "rb") as f:
            blob = f.read()
        end = blob.index(b"\n") + 1
        header = blob[10:end].decode("latin1")
        bigger = header.replace("(20, 6)", "(400000000000, 6)")
        bigger = bigger[:-1].rstrip(" ")
        bigger = bigger + " " * (len(header) - 1 - len(bigger)) + "\n"
        self.assertEqual(len(bigger), len(header))
        with open(path, "wb") as f:
            f.write(blob[:10] + bigger.encode("latin1") + blob[end:])
        self.assert_refused("episode_00001/actions.npy")

    def test_non_finite_actions(self):
        path = os.path.join(self.ep, "actions.npy")
        a = np.load(path)
        a[5, 4] = np.nan
        np.save(path, a)
        self.assert_refused("not finite")

    def test_needs_dataset_json(self):
        os.remove(os.path.join(self.dir, "dataset.json"))
        self.assert_refused("dataset.json")
        with open(os.path.join(self.dir, "dataset.json"), "w") as f:
            f.write("{not json")
        self.assert_refused("dataset.json")
        with open(os.path.join(self.dir, "dataset.json"), "w") as f:
            json.dump({"episodes": 4}, f)
        self.assert_refused("episode_00003")

    def test_stale_episodes_beyond_dataset_json_are_ignored(self):
        shutil.copytree(self.ep, os.path.join(self.dir, "episode_00007"))
        self.assertEqual(EpisodeData.load(self.dir).episodes, 3)

    def test_dataset_larger_than_memory_is_refused_before_copying(self):
        with mock.patch("wmtrain.data.available_memory", return_value=100_000):
            self.assert_refused("more than 80% of the")
        EpisodeData.load(self.dir).check(self.cfg)


if __name__ == "__main__":
    unittest.main()
