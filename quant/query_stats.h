// The causal query statistics of QuantWM (docs/QUANT.md): per (layer, kv
// head), the running second moment G = sum q q^T over every query observed
// so far and their count. QSAC reads its diagonal as channel weights; PSAC
// reads its top eigenvectors. Only queries already computed ever enter, so
// a span quantized now can never depend on a later query.
#pragma once

#include <Eigen/Dense>
#include <cstdint>
#include <vector>

namespace wm {

class QueryStats {
 public:
  explicit QueryStats(int head_dim);

  // adds n query rows q [n, head_dim] (row stride `stride` floats); a row
  // with a non-finite value is skipped, so one bad query cannot poison G.
  // One call adds the rows' own Gram matrix: each entry x >= y summed in
  // double over the rows in order from zero (the products are exact), then
  // added to the running sum, which a device does alike (cuda/query_gram.cuh)
  void add(const float* q, int stride, int n);
  // replaces G and the count with sums kept elsewhere the same way (a
  // device's running sums of the same calls): the lower triangle, entry
  // (x, y) at x (x + 1) / 2 + y, over `rows` rows
  void set_gram(const double* lower, int64_t rows);
  int64_t count() const { return count_; }
  // G's lower triangle, entry (x, y) at x (x + 1) / 2 + y (the upper one is G's mirror)
  const std::vector<double>& lower() const { return lower_; }
  int head_dim() const { return d_; }

  // w = diag(G) / count, normalised to mean 1, then floored at `floor`;
  // false (w untouched) before any query was observed
  bool channel_weights(float floor, float* w) const;

  // the top-r eigenvectors of G / count as rows u [r, head_dim], largest
  // eigenvalue first (Eigen's self-adjoint solver); `energy` gets the
  // fraction of the trace they hold. False before any query was observed.
  bool principal_basis(int r, float* u, double* energy) const;

 private:
  int d_;
  int64_t count_ = 0;
  std::vector<double> lower_;  // G's lower triangle: an add is one pass over it, in order
};

// PSAC's basis of every head at once: each head's principal_basis(r) as
// fp16 rows, [heads][r][head_dim], zeros for a head with no finite query
// yet (no correction). The heads' solves run side by side (OpenMP): one
// takes ~1.9 ms at head_dim 128, and a Matrix-Game-2 write pass that
// refreshes its bases makes 12 per layer
std::vector<uint16_t> principal_bases_f16(const std::vector<QueryStats>& heads, int r);

}  // namespace wm
