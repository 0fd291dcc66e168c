#include "quant/query_stats.h"

#include <cmath>
#include <vector>

namespace wm {

QueryStats::QueryStats(int head_dim) : d_(head_dim), g_(Eigen::MatrixXd::Zero(head_dim, head_dim)) {}

void QueryStats::add(const float* q, int stride, int n) {
  std::vector<double> lower(static_cast<size_t>(d_) * (d_ + 1) / 2, 0.0);
  std::vector<double> row(static_cast<size_t>(d_));
  int64_t used = 0;
  for (int i = 0; i < n; ++i) {
    const float* r = q + static_cast<size_t>(i) * stride;
    bool finite = true;
    for (int c = 0; c < d_; ++c) finite = finite && std::isfinite(r[c]);
    if (!finite) continue;
    for (int c = 0; c < d_; ++c) row[static_cast<size_t>(c)] = r[c];
    // row i's products into every entry, rows in order (the inner loop is
    // over independent entries, so vectorising it keeps each one's order)
    double* p = lower.data();
    for (int x = 0; x < d_; ++x) {
      const double rx = row[static_cast<size_t>(x)];
      for (int y = 0; y <= x; ++y) p[y] += rx * row[static_cast<size_t>(y)];
      p += x + 1;
    }
    ++used;
  }
  if (used > 0) add_gram(lower.data(), used);
}

void QueryStats::add_gram(const double* lower, int64_t rows) {
  if (rows <= 0) return;
  for (int x = 0; x < d_; ++x)
    for (int y = 0; y <= x; ++y) {
      g_(x, y) += lower[static_cast<size_t>(x) * (x + 1) / 2 + y];
      g_(y, x) = g_(x, y);
    }
  count_ += rows;
}

bool QueryStats::channel_weights(float floor, float* w) const {
  if (count_ == 0) return false;
  double mean = 0;
  for (int c = 0; c < d_; ++c) mean += g_(c, c) / static_cast<double>(count_);
  mean /= d_;
  for (int c = 0; c < d_; ++c) {
    const double v = mean > 0 ? g_(c, c) / static_cast<double>(count_) / mean : 1.0;
    w[c] = static_cast<float>(std::max(static_cast<double>(floor), v));
  }
  return true;
}

bool QueryStats::principal_basis(int r, float* u, double* energy) const {
  if (count_ == 0) return false;
  const Eigen::MatrixXd sigma = g_ / static_cast<double>(count_);
  Eigen::SelfAdjointEigenSolver<Eigen::MatrixXd> es(sigma);
  if (es.info() != Eigen::Success) return false;
  // eigenvalues ascend: the top r are the last columns
  double top = 0, trace = 0;
  for (int i = 0; i < d_; ++i) trace += std::max(0.0, es.eigenvalues()[i]);
  for (int j = 0; j < r; ++j) {
    const int col = d_ - 1 - j;
    top += std::max(0.0, es.eigenvalues()[col]);
    for (int c = 0; c < d_; ++c) u[static_cast<size_t>(j) * d_ + c] = static_cast<float>(es.eigenvectors()(c, col));
  }
  if (energy != nullptr) *energy = trace > 0 ? top / trace : 0.0;
  return true;
}

}  // namespace wm
