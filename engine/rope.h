// 3-D rotary position embedding over (time, row, column) on interleaved
// channel pairs (docs/MODEL_FORMAT.md): pairs 0..t-1 use time, then rows,
// then columns; within an axis group of n pairs, pair j turns at theta^(-j/n).
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "engine/backend.h"

namespace wm {

class RopeTable {
 public:
  RopeTable(const RopeParams& p, int head_dim) : pairs_(head_dim / 2) {
    freq_.resize(static_cast<size_t>(pairs_));
    axis_.resize(static_cast<size_t>(pairs_));
    int j = 0;
    const int counts[3] = {p.t_pairs, p.h_pairs, p.w_pairs};
    for (int a = 0; a < 3; ++a)
      for (int i = 0; i < counts[a]; ++i, ++j) {
        freq_[static_cast<size_t>(j)] = std::pow(static_cast<double>(p.theta), -static_cast<double>(i) / counts[a]);
        axis_[static_cast<size_t>(j)] = a;
      }
  }
  // cos and sin of every pair's angle at position pos = (t, row, col), [pairs, 2]
  void angles(const int32_t* pos, float* cs) const {
    for (int j = 0; j < pairs_; ++j) {
      const double phi = pos[axis_[static_cast<size_t>(j)]] * freq_[static_cast<size_t>(j)];
      cs[2 * j] = static_cast<float>(std::cos(phi));
      cs[2 * j + 1] = static_cast<float>(std::sin(phi));
    }
  }
  // rotates the pairs of one head vector at position pos = (t, row, col)
  void rotate(float* v, const int32_t* pos) const {
    for (int j = 0; j < pairs_; ++j) {
      const double phi = pos[axis_[static_cast<size_t>(j)]] * freq_[static_cast<size_t>(j)];
      const float c = static_cast<float>(std::cos(phi)), s = static_cast<float>(std::sin(phi));
      const float x0 = v[2 * j], x1 = v[2 * j + 1];
      v[2 * j] = x0 * c - x1 * s;
      v[2 * j + 1] = x0 * s + x1 * c;
    }
  }

 private:
  int pairs_;
  std::vector<double> freq_;
  std::vector<int> axis_;
};

}  // namespace wm
