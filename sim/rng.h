// Deterministic random numbers for the simulator. The std:: distributions are
// implementation-defined, so every draw goes through this generator to keep
// mazes, start poses and policies identical across standard libraries.
#pragma once

#include <cstdint>

namespace wm::sim {

inline uint64_t splitmix64_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// combines a seed with a stream id (an episode index, a purpose tag) into a new
// seed, so that nearby seeds and nearby streams give unrelated generators
inline uint64_t derive_seed(uint64_t seed, uint64_t stream) {
  return splitmix64_mix(seed + 0x9E3779B97F4A7C15ull * (splitmix64_mix(stream + 0x632BE59BD9B4E019ull) | 1u));
}

// stream tags of the per-seed generators
inline constexpr uint64_t kMazeStream = 1;
inline constexpr uint64_t kStartStream = 2;
inline constexpr uint64_t kPolicyStream = 3;

// xoshiro256** seeded through splitmix64
class Rng {
 public:
  explicit Rng(uint64_t seed) {
    uint64_t s = seed;
    for (uint64_t& v : state_) {
      s += 0x9E3779B97F4A7C15ull;
      v = splitmix64_mix(s);
    }
  }

  uint64_t next_u64() {
    const uint64_t result = rotl(state_[1] * 5, 7) * 9;
    const uint64_t t = state_[1] << 17;
    state_[2] ^= state_[0];
    state_[3] ^= state_[1];
    state_[1] ^= state_[2];
    state_[0] ^= state_[3];
    state_[2] ^= t;
    state_[3] = rotl(state_[3], 45);
    return result;
  }

  // uniform in [0, n) for n > 0 by multiply-shift; the bias of at most n / 2^64 is irrelevant here
  uint64_t below(uint64_t n) {
    return static_cast<uint64_t>((static_cast<unsigned __int128>(next_u64()) * n) >> 64);
  }
  // uniform integer in [lo, hi], hi >= lo
  int range(int lo, int hi) { return lo + static_cast<int>(below(static_cast<uint64_t>(hi - lo) + 1)); }
  // uniform in [0, 1) with 53 random bits
  double uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
  bool chance(double p) { return uniform() < p; }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t state_[4];
};

}  // namespace wm::sim
