// QSAC's channel weights from a head's query statistics: the arithmetic
// that QueryStats::channel_weights (host) and the CUDA backend's
// qsac_weights_kernel (cuda/query_gram.cu) both run, so that their weights
// are the same bit for bit. Host and device.
#pragma once

#include "common/hd.h"

namespace wm::qsac_ops {

// w_c = max(floor, (G_cc / count) / mean_c(G_cc / count)), 1 where that
// mean is not positive, summed and divided in double in channel order;
// diag: G's diagonal [d]. False (w untouched) when no row was counted
WM_HD inline bool channel_weights(const double* diag, double count, int d, float floor, float* w) {
  if (count == 0) return false;
  double mean = 0;
  for (int c = 0; c < d; ++c) mean += diag[c] / count;
  mean /= d;
  const double f = floor;
  for (int c = 0; c < d; ++c) {
    const double v = mean > 0 ? diag[c] / count / mean : 1.0;
    w[c] = static_cast<float>(f < v ? v : f);  // std::max(f, v)
  }
  return true;
}

}  // namespace wm::qsac_ops
