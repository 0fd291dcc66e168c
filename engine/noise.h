// Counter-based Gaussian noise: a pure function of (seed, frame index,
// element index), so a session's frames never depend on which other sessions
// shared its batch. The trainer's golden-fixture generator reimplements this
// bit for bit (train/wmtrain/noise.py).
//
// The same functions compile for the GPU (cuda/noise.cu generates a batch's
// noise on the device): integer hashing and IEEE sqrt are exact there, and
// log/cos in double differ from the host's by at most an ulp or two, which
// changes a float result only where the double lies that close to a float
// rounding boundary (about one value in 2^29).
#pragma once

#include <cmath>
#include <cstdint>

#ifdef __CUDACC__
#define WM_HOST_DEVICE __host__ __device__
#else
#define WM_HOST_DEVICE
#endif

namespace wm {

WM_HOST_DEVICE inline uint64_t splitmix64(uint64_t x) {
  uint64_t z = x + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// standard normal for element `element` of frame `frame` in session `seed`
WM_HOST_DEVICE inline float noise_normal(uint64_t seed, int64_t frame, int64_t element) {
  const uint64_t key = seed ^ (static_cast<uint64_t>(frame) * 0x9E3779B97F4A7C15ull);
  const uint64_t x1 = splitmix64(key + 2 * static_cast<uint64_t>(element));
  const uint64_t x2 = splitmix64(key + 2 * static_cast<uint64_t>(element) + 1);
  // u1 in (0, 1] so the log is finite; u2 in [0, 1)
  const double u1 = static_cast<double>((x1 >> 11) + 1) * 0x1.0p-53;
  const double u2 = static_cast<double>(x2 >> 11) * 0x1.0p-53;
  return static_cast<float>(::sqrt(-2.0 * ::log(u1)) * ::cos(6.283185307179586 * u2));
}

// fills out[0..count) with the noise of one frame (elements in [height, width, channels] order)
inline void noise_fill_frame(uint64_t seed, int64_t frame, float* out, int64_t count) {
  for (int64_t e = 0; e < count; ++e) out[e] = noise_normal(seed, frame, e);
}

}  // namespace wm
