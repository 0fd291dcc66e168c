"""noise.py against engine/noise.h compiled with g++ (skipped when no compiler is found)."""

import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from wmtrain.noise import noise_frame, noise_normal, splitmix64, splitmix64_int  # noqa: E402

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

PROGRAM = r"""
#include "engine/noise.h"
#include <cstdio>
#include <vector>
// prints the float bits of noise_normal for the cases on stdin ("seed frame element" per line), then
// writes count floats of noise_fill_frame(seed, frame) to the file named in argv[1]
int main(int argc, char** argv) {
  unsigned long long seed; long long frame, elem;
  while (std::scanf("%llu %lld %lld", &seed, &frame, &elem) == 3) {
    float v = wm::noise_normal(seed, frame, elem);
    unsigned u; __builtin_memcpy(&u, &v, 4);
    std::printf("%u\n", u);
  }
  std::vector<float> buf(64 * 64 * 3);
  FILE* f = std::fopen(argv[1], "wb");
  for (long long fr = 0; fr < 4; ++fr) {
    wm::noise_fill_frame(1234, fr, buf.data(), (long long)buf.size());
    std::fwrite(buf.data(), 4, buf.size(), f);
  }
  std::fclose(f);
}
"""

CASES = [(0, 0, 0), (1234, 0, 0), (1234, 0, 1), (1234, 5, 767), (2**64 - 1, 3, 100000), (42, -1, 7),
         (0x9E3779B97F4A7C15, 1, 0), (7, 123456789, 12287), (2**63, 2**40, 2**33)]


@unittest.skipIf(shutil.which("g++") is None, "g++ not found")
class NoiseMatchesEngine(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp()
        src = os.path.join(cls.tmp, "noise.cc")
        exe = os.path.join(cls.tmp, "noise")
        with open(src, "w") as f:
            f.write(PROGRAM)
        subprocess.run(["g++", "-std=c++20", "-O2", f"-I{REPO}", src, "-o", exe], check=True)
        stdin = "".join(f"{s} {fr} {e}\n" for s, fr, e in CASES)
        cls.bin_path = os.path.join(cls.tmp, "frames.bin")
        out = subprocess.run([exe, cls.bin_path], input=stdin, capture_output=True, text=True, check=True).stdout
        cls.bits = [int(x) for x in out.split()]

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def test_scalar_cases(self):
        for (s, fr, e), want in zip(CASES, self.bits):
            got = np.float32(noise_normal(s, fr, e)).view(np.uint32)
            self.assertEqual(int(got), want, f"case {(s, fr, e)}")

    def test_vector_cases(self):
        for (s, fr, e), want in zip(CASES, self.bits):
            if e > 200000:
                continue
            self.assertEqual(int(noise_frame(s, fr, e + 1, exact=True)[e].view(np.uint32)), want)
            self.assertEqual(int(noise_frame(s, fr, e + 1)[e].view(np.uint32)), want)

    def test_whole_frames(self):
        ref = np.fromfile(self.bin_path, dtype=np.float32).reshape(4, -1)
        for fr in range(4):
            exact = noise_frame(1234, fr, ref.shape[1], exact=True)
            np.testing.assert_array_equal(exact.view(np.uint32), ref[fr].view(np.uint32))
            fast = noise_frame(1234, fr, ref.shape[1])
            # numpy's vectorised log/cos may round a double differently from libm: allow rare 1-ulp cases
            ulps = np.abs(fast.view(np.int32).astype(np.int64) - ref[fr].view(np.int32).astype(np.int64))
            self.assertLessEqual(int(ulps.max()), 1)
            self.assertLess(int((ulps > 0).sum()), 5)


class SplitmixSelf(unittest.TestCase):
    def test_vector_matches_int(self):
        xs = [0, 1, 2**64 - 1, 0x9E3779B97F4A7C15, 123456789123456789]
        v = splitmix64(np.array(xs, dtype=np.uint64))
        self.assertEqual([int(a) for a in v], [splitmix64_int(x) for x in xs])

    def test_distribution(self):
        x = noise_frame(99, 3, 200000)
        self.assertAlmostEqual(float(x.mean()), 0.0, delta=0.01)
        self.assertAlmostEqual(float(x.std()), 1.0, delta=0.01)


if __name__ == "__main__":
    unittest.main()
