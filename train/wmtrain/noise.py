"""The engine's counter-based Gaussian noise (engine/noise.h), bit for bit.

Element e of frame f in session `seed` is a Box-Muller normal of two uniforms
drawn with splitmix64(key + 2e) and splitmix64(key + 2e + 1), where
key = seed ^ (f * 0x9E3779B97F4A7C15) (all arithmetic modulo 2^64).
"""

from __future__ import annotations

import math

import numpy as np

MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
MIX1 = 0xBF58476D1CE4E5B9
MIX2 = 0x94D049BB133111EB
TWO_PI = 6.283185307179586
TWO_POW_M53 = 2.0 ** -53


def splitmix64_int(x: int) -> int:
    """scalar reference on Python ints."""
    z = (x + GOLDEN) & MASK64
    z = ((z ^ (z >> 30)) * MIX1) & MASK64
    z = ((z ^ (z >> 27)) * MIX2) & MASK64
    return z ^ (z >> 31)


def splitmix64(x: np.ndarray) -> np.ndarray:
    """vectorised splitmix64 on a uint64 array (wrapping arithmetic)."""
    x = np.asarray(x, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = x + np.uint64(GOLDEN)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(MIX1)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(MIX2)
        return z ^ (z >> np.uint64(31))


def frame_key(seed: int, frame: int) -> int:
    # static_cast<uint64_t>(int64 frame): two's complement for negative frames
    return (seed & MASK64) ^ (((frame & MASK64) * GOLDEN) & MASK64)


def _uniform_bits(seed: int, frame: int, count: int):
    key = np.uint64(frame_key(seed, frame))
    e2 = np.arange(count, dtype=np.uint64) * np.uint64(2)
    with np.errstate(over="ignore"):
        x1 = splitmix64(key + e2)
        x2 = splitmix64(key + e2 + np.uint64(1))
    # (x >> 11) < 2^53 is exact in float64
    a = ((x1 >> np.uint64(11)) + np.uint64(1)).astype(np.float64)
    b = (x2 >> np.uint64(11)).astype(np.float64)
    return a * TWO_POW_M53, b * TWO_POW_M53


def noise_frame(seed: int, frame: int, count: int, exact: bool = False) -> np.ndarray:
    """float32 [count]: the noise of one frame, elements in [height, width, channels] order.

    exact=False uses numpy's vectorised log/cos, which may differ from the C
    library by an ulp of the double and so, very rarely, by one float32 ulp.
    exact=True evaluates log/cos/sqrt with Python's math module (the C
    library, as the engine's std::log/std::cos) for a bit-exact result.
    """
    u1, u2 = _uniform_bits(seed, frame, count)
    if not exact:
        return (np.sqrt(-2.0 * np.log(u1)) * np.cos(TWO_PI * u2)).astype(np.float32)
    out = np.empty(count, dtype=np.float32)
    for i, (a, b) in enumerate(zip(u1.tolist(), u2.tolist())):
        out[i] = math.sqrt(-2.0 * math.log(a)) * math.cos(TWO_PI * b)
    return out


def noise_normal(seed: int, frame: int, element: int) -> float:
    """scalar reference of wm::noise_normal (returns the float32 value as a Python float)."""
    key = frame_key(seed, frame)
    x1 = splitmix64_int((key + 2 * element) & MASK64)
    x2 = splitmix64_int((key + 2 * element + 1) & MASK64)
    u1 = float((x1 >> 11) + 1) * TWO_POW_M53
    u2 = float(x2 >> 11) * TWO_POW_M53
    return float(np.float32(math.sqrt(-2.0 * math.log(u1)) * math.cos(TWO_PI * u2)))
