#include "quant/query_stats.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/half.h"
#include "quant/qsac_ops.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace wm {

QueryStats::QueryStats(int head_dim)
    : d_(head_dim), lower_(static_cast<size_t>(head_dim) * (head_dim + 1) / 2, 0.0) {}

void QueryStats::add(const float* q, int stride, int n) {
  // the finite rows in double, each padded to whole chunks of kChunk
  constexpr int kChunk = 16;
  const int width = (d_ + kChunk - 1) / kChunk * kChunk;
  std::vector<double> rows;
  rows.reserve(static_cast<size_t>(n) * width);
  int64_t used = 0;
  for (int i = 0; i < n; ++i) {
    const float* r = q + static_cast<size_t>(i) * stride;
    bool finite = true;
    for (int c = 0; c < d_; ++c) finite = finite && std::isfinite(r[c]);
    if (!finite) continue;
    rows.insert(rows.end(), r, r + d_);
    rows.resize(rows.size() + static_cast<size_t>(width - d_), 0.0);
    ++used;
  }
  if (used == 0) return;
  // entry (x, y) = sum over the rows in order, from zero. Rows go in blocks
  // that stay in cache, kChunk entries of one matrix row at a time, their
  // sums in registers across the block and carried on to the next block:
  // every entry is still one chain of adds over the rows in order
  std::vector<double> chunk(static_cast<size_t>(d_) * width, 0.0);  // [x][y]: the sums, whole chunks
  constexpr int64_t kRows = 32;
  for (int64_t i0 = 0; i0 < used; i0 += kRows) {
    const int64_t i1 = std::min(used, i0 + kRows);
    for (int x = 0; x < d_; ++x)
      for (int y0 = 0; y0 <= x; y0 += kChunk) {
        double* acc = chunk.data() + static_cast<size_t>(x) * width + y0;
#if defined(__AVX2__)
        __m256d a[kChunk / 4];
        for (int j = 0; j < kChunk / 4; ++j) a[j] = _mm256_loadu_pd(acc + 4 * j);
        const double* r = rows.data() + static_cast<size_t>(i0) * width;
        for (int64_t i = i0; i < i1; ++i, r += width) {
          // a product of two floats is exact in double: multiply then add
          // is the same as the fused form
          const __m256d rx = _mm256_set1_pd(r[x]);
          for (int j = 0; j < kChunk / 4; ++j)
            a[j] = _mm256_add_pd(a[j], _mm256_mul_pd(rx, _mm256_loadu_pd(r + y0 + 4 * j)));
        }
        for (int j = 0; j < kChunk / 4; ++j) _mm256_storeu_pd(acc + 4 * j, a[j]);
#else
        const double* r = rows.data() + static_cast<size_t>(i0) * width;
        for (int64_t i = i0; i < i1; ++i, r += width)
          for (int j = 0; j < kChunk; ++j) acc[j] += r[x] * r[y0 + j];
#endif
      }
  }
  // this call's sums, each added to the running one
  for (int x = 0; x < d_; ++x) {
    double* g = lower_.data() + static_cast<size_t>(x) * (x + 1) / 2;
    const double* c = chunk.data() + static_cast<size_t>(x) * width;
    for (int y = 0; y <= x; ++y) g[y] += c[y];
  }
  count_ += used;
}

void QueryStats::set_gram(const double* lower, int64_t rows) {
  std::copy(lower, lower + lower_.size(), lower_.begin());
  count_ = std::max<int64_t>(rows, 0);
}

bool QueryStats::channel_weights(float floor, float* w) const {
  std::vector<double> diag(static_cast<size_t>(d_));
  for (int c = 0; c < d_; ++c) diag[static_cast<size_t>(c)] = lower_[static_cast<size_t>(c) * (c + 1) / 2 + c];
  return qsac_ops::channel_weights(diag.data(), static_cast<double>(count_), d_, floor, w);
}

bool QueryStats::principal_basis(int r, float* u, double* energy) const {
  if (count_ == 0) return false;
  Eigen::MatrixXd sigma(d_, d_);
  for (int x = 0; x < d_; ++x)
    for (int y = 0; y <= x; ++y) sigma(x, y) = sigma(y, x) = lower_[static_cast<size_t>(x) * (x + 1) / 2 + y];
  sigma /= static_cast<double>(count_);
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

std::vector<uint16_t> principal_bases_f16(const std::vector<QueryStats>& heads, int r) {
  const int H = static_cast<int>(heads.size());
  const size_t per = H > 0 ? static_cast<size_t>(r) * heads[0].head_dim() : 0;
  std::vector<uint16_t> out(per * H, 0);
#pragma omp parallel for schedule(dynamic)
  for (int h = 0; h < H; ++h) {
    std::vector<float> u(per);
    if (!heads[static_cast<size_t>(h)].principal_basis(r, u.data(), nullptr)) continue;
    for (size_t i = 0; i < per; ++i) out[static_cast<size_t>(h) * per + i] = f32_to_f16(u[i]);
  }
  return out;
}

}  // namespace wm
