// Helpers shared by the quant tests: an independent naive attention (double)
// and small data generators.
#pragma once

#include <cmath>
#include <random>
#include <vector>

#include "quant/kv_cache.h"

namespace wm::testing_util {

inline std::vector<float> randn(size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// softmax(q [k_hist; k_cur]^T / sqrt(d)) [v_hist; v_cur] in double; every
// tensor [rows, heads, hd]
inline void naive_attention(const std::vector<float>& q, int n, const std::vector<float>& kh, const std::vector<float>& vh,
                            int m, const std::vector<float>& kc, const std::vector<float>& vc, int heads, int hd,
                            std::vector<float>* out) {
  out->assign(static_cast<size_t>(n) * heads * hd, 0.0f);
  const size_t st = static_cast<size_t>(heads) * hd;
  for (int h = 0; h < heads; ++h)
    for (int i = 0; i < n; ++i) {
      std::vector<double> s(static_cast<size_t>(m + n));
      double mx = -1e300;
      for (int j = 0; j < m + n; ++j) {
        const float* kr = j < m ? kh.data() + j * st + h * hd : kc.data() + (j - m) * st + h * hd;
        double dot = 0;
        for (int d = 0; d < hd; ++d) dot += static_cast<double>(q[i * st + h * hd + d]) * kr[d];
        s[static_cast<size_t>(j)] = dot / std::sqrt(static_cast<double>(hd));
        mx = std::max(mx, s[static_cast<size_t>(j)]);
      }
      double z = 0;
      for (double& x : s) z += (x = std::exp(x - mx));
      for (int d = 0; d < hd; ++d) {
        double acc = 0;
        for (int j = 0; j < m + n; ++j) {
          const float* vr = j < m ? vh.data() + j * st + h * hd : vc.data() + (j - m) * st + h * hd;
          acc += s[static_cast<size_t>(j)] * vr[d];
        }
        (*out)[i * st + h * hd + d] = static_cast<float>(acc / z);
      }
    }
}

inline double rel_l2(const std::vector<float>& a, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (static_cast<double>(a[i]) - ref[i]) * (static_cast<double>(a[i]) - ref[i]);
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

inline bool all_finite(const std::vector<float>& v) {
  for (float x : v)
    if (!std::isfinite(x)) return false;
  return true;
}

}  // namespace wm::testing_util
