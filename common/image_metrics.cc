#include "common/image_metrics.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace wm {

double squared_error_u8(const uint8_t* a, const uint8_t* b, size_t bytes) {
  double se = 0;
  for (size_t i = 0; i < bytes; ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    se += d * d;
  }
  return se;
}

double psnr_rgb8(const uint8_t* a, const uint8_t* b, size_t bytes) {
  if (bytes == 0) return 0.0;
  const double se = squared_error_u8(a, b, bytes);
  if (se == 0) return std::numeric_limits<double>::infinity();
  return 10.0 * std::log10(255.0 * 255.0 / (se / static_cast<double>(bytes)));
}

double ssim_rgb8(const uint8_t* a, const uint8_t* b, int width, int height) {
  auto luma = [&](const uint8_t* img) {
    std::vector<double> y(static_cast<size_t>(width) * height);
    for (size_t p = 0; p < y.size(); ++p) y[p] = 0.299 * img[3 * p] + 0.587 * img[3 * p + 1] + 0.114 * img[3 * p + 2];
    return y;
  };
  const std::vector<double> ya = luma(a), yb = luma(b);
  const double c1 = (0.01 * 255) * (0.01 * 255), c2 = (0.03 * 255) * (0.03 * 255);
  const int win = std::min({8, width, height}), stride = std::max(1, win / 2);
  double sum = 0;
  int count = 0;
  for (int y0 = 0; y0 + win <= height; y0 += stride)
    for (int x0 = 0; x0 + win <= width; x0 += stride) {
      double ma = 0, mb = 0;
      for (int y = y0; y < y0 + win; ++y)
        for (int x = x0; x < x0 + win; ++x) {
          ma += ya[static_cast<size_t>(y) * width + x];
          mb += yb[static_cast<size_t>(y) * width + x];
        }
      const double n = win * win;
      ma /= n;
      mb /= n;
      double va = 0, vb = 0, cov = 0;
      for (int y = y0; y < y0 + win; ++y)
        for (int x = x0; x < x0 + win; ++x) {
          const double da = ya[static_cast<size_t>(y) * width + x] - ma, db = yb[static_cast<size_t>(y) * width + x] - mb;
          va += da * da;
          vb += db * db;
          cov += da * db;
        }
      va /= n - 1;
      vb /= n - 1;
      cov /= n - 1;
      sum += ((2 * ma * mb + c1) * (2 * cov + c2)) / ((ma * ma + mb * mb + c1) * (va + vb + c2));
      ++count;
    }
  return count > 0 ? sum / count : 0.0;
}

}  // namespace wm
