"""safetensors writer/reader: layout, dtypes, metadata and rejection of broken files."""

import json
import os
import struct
import sys
import tempfile
import unittest

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from wmtrain.safetensors import (SafetensorsError, bf16_bits_to_f32, f32_to_bf16_bits, load_file,  # noqa: E402
                                 load_metadata, read_header, save_file)


class RoundTrip(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp()
        self.path = os.path.join(self.dir, "t.safetensors")
        rng = np.random.default_rng(0)
        self.t = {"a.weight": rng.standard_normal((3, 5)).astype(np.float32), "b": np.arange(7, dtype=np.float32),
                  "scalar_like": np.ones((1,), np.float32), "empty": np.zeros((0, 4), np.float32)}

    def test_layout(self):
        save_file(self.t, self.path, metadata={"step": 12})
        with open(self.path, "rb") as f:
            raw = f.read()
        (n,) = struct.unpack("<Q", raw[:8])
        self.assertEqual(n % 8, 0)
        header = json.loads(raw[8:8 + n])
        self.assertEqual(header["__metadata__"], {"step": "12"})
        self.assertEqual(header["a.weight"], {"dtype": "F32", "shape": [3, 5], "data_offsets": [0, 60]})
        self.assertEqual(len(raw), 8 + n + sum(v.nbytes for v in self.t.values()))
        a = np.frombuffer(raw[8 + n:8 + n + 60], dtype="<f4").reshape(3, 5)
        np.testing.assert_array_equal(a, self.t["a.weight"])

    def test_f32(self):
        save_file(self.t, self.path)
        back = load_file(self.path)
        self.assertEqual(list(back), list(self.t))
        for k in self.t:
            np.testing.assert_array_equal(back[k], self.t[k])
        self.assertEqual(load_metadata(self.path), {})

    def test_f16_bf16(self):
        for dt, tol in (("F16", 1e-3), ("BF16", 8e-3)):
            save_file(self.t, self.path, dtype=dt)
            header, _ = read_header(self.path)
            self.assertEqual(header["a.weight"]["dtype"], dt)
            back = load_file(self.path, as_float32=True)
            np.testing.assert_allclose(back["a.weight"], self.t["a.weight"], rtol=tol, atol=tol)
            self.assertEqual(back["a.weight"].dtype, np.float32)

    def test_bf16_rounding(self):
        x = np.array([1.0, -2.5, 1.00390625, 1.01171875, 3.0e38, np.inf], dtype=np.float32)
        b = f32_to_bf16_bits(x)
        self.assertEqual(b[0], 0x3F80)
        np.testing.assert_array_equal(bf16_bits_to_f32(b)[:2], x[:2])
        self.assertEqual(bf16_bits_to_f32(b)[2], 1.0)  # tie rounds to even
        self.assertEqual(bf16_bits_to_f32(b)[3], 1.015625)
        self.assertTrue(np.isinf(bf16_bits_to_f32(b)[5]))

    def _corrupt(self, mutate):
        save_file(self.t, self.path)
        with open(self.path, "rb") as f:
            raw = bytearray(f.read())
        raw = mutate(raw)
        with open(self.path, "wb") as f:
            f.write(raw)
        with self.assertRaises(SafetensorsError):
            load_file(self.path)

    def test_rejects_truncated(self):
        self._corrupt(lambda r: r[:-4])

    def test_rejects_trailing(self):
        self._corrupt(lambda r: r + b"\0\0\0\0")

    def test_rejects_huge_header(self):
        self._corrupt(lambda r: struct.pack("<Q", 1 << 40) + r[8:])

    def test_rejects_overlap(self):
        def mut(r):
            (n,) = struct.unpack("<Q", r[:8])
            h = json.loads(r[8:8 + n])
            h["b"]["data_offsets"] = [0, 28]
            hj = json.dumps(h).encode()
            hj += b" " * ((8 - len(hj) % 8) % 8)
            return bytearray(struct.pack("<Q", len(hj)) + hj + r[8 + n:])
        self._corrupt(mut)


if __name__ == "__main__":
    unittest.main()
