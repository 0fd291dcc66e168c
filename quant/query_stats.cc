#include "quant/query_stats.h"

#include <cmath>
#include <vector>

namespace wm {

QueryStats::QueryStats(int head_dim) : d_(head_dim), g_(Eigen::MatrixXd::Zero(head_dim, head_dim)) {}

void QueryStats::add(const float* q, int stride, int n) {
  using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  std::vector<int> rows;
  rows.reserve(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    const float* r = q + static_cast<size_t>(i) * stride;
    bool finite = true;
    for (int c = 0; c < d_; ++c) finite = finite && std::isfinite(r[c]);
    if (finite) rows.push_back(i);
  }
  if (rows.empty()) return;
  // one rank-k update per call in float (a GEMM), accumulated in double
  RowMatrix m(static_cast<Eigen::Index>(rows.size()), d_);
  for (size_t i = 0; i < rows.size(); ++i)
    m.row(static_cast<Eigen::Index>(i)) =
        Eigen::Map<const Eigen::RowVectorXf>(q + static_cast<size_t>(rows[i]) * stride, d_);
  Eigen::MatrixXf gram = Eigen::MatrixXf::Zero(d_, d_);
  gram.selfadjointView<Eigen::Lower>().rankUpdate(m.transpose());
  g_ += gram.selfadjointView<Eigen::Lower>().toDenseMatrix().cast<double>();
  count_ += static_cast<int64_t>(rows.size());
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
