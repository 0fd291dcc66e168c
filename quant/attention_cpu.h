// Tiled attention with online softmax on the CPU, shared by every cache
// format. A format supplies its cache as a sequence of tiles that it
// dequantizes a few at a time into a small fp32 scratch (whole tiles up to
// ScoreLimits::group_keys keys, never the whole cache), each group one score
// block; the current block's own K/V come last.
//
// A tile source is any type with
//   int  tiles() const;                               // number of tiles
//   int  tile_tokens(int tile) const;                 // tokens in a tile
//   void load(int tile, int head, float* k, float* v) const;   // [tile_tokens, head_dim] each
//   void add_logit_bias(int tile, int head, const float* q, int q_stride, int n,
//                       float* s, int s_stride) const;          // adds a correction to raw q.k
// (add_logit_bias may do nothing; it exists for the principal-subspace correction).
#pragma once

#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

namespace wm {

using RowMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using StridedMap = Eigen::Map<const RowMatrix, 0, Eigen::OuterStride<>>;

struct OnlineSoftmax {
  RowMatrix acc;               // [n, head_dim]
  Eigen::VectorXf m, l;        // [n] running max and denominator
  void reset(int n, int head_dim) {
    acc.setZero(n, head_dim);
    m.setConstant(n, -std::numeric_limits<float>::infinity());
    l.setZero(n);
  }
  // s: raw logits already scaled, [rows, t] for the queries r0..r0+rows; v: [t, head_dim]
  template <class VMat>
  void update(RowMatrix& s, const VMat& v, int r0 = 0) {
    const int rows = static_cast<int>(s.rows());
    Eigen::VectorXf corr(rows);
    for (int j = 0; j < rows; ++j) {
      const int i = r0 + j;
      const float row_max = s.row(j).maxCoeff();
      const float m_new = std::max(m[i], row_max);
      corr[j] = std::isinf(m[i]) ? 0.0f : std::exp(m[i] - m_new);
      s.row(j) = (s.row(j).array() - m_new).exp();
      l[i] = l[i] * corr[j] + s.row(j).sum();
      m[i] = m_new;
    }
    auto a = acc.middleRows(r0, rows);
    a = corr.asDiagonal() * a;
    a.noalias() += s * v;
  }
};

// The logits of one score block are at most ScoreLimits::max_floats (32 MiB
// per thread): a frame of many tokens attends in row chunks of its queries (and
// column chunks of its own block's keys) instead of as one n x n matrix.
// The shipped configs fit in one chunk (the Matrix-Game-2 shape's 2640-query
// block over its own keys is 7 Mi floats), so their arithmetic is the
// unchunked one. Cached tiles (a frame each in the fp16 cache) go in groups:
// a 64-token frame's scores are a product too small to run at speed, so
// the default model attends to 4 frames per score block.
struct ScoreLimits {
  int64_t max_floats = int64_t{1} << 23;
  int block_keys = 4096;  // the current block's own keys per score block
  int group_keys = 256;   // cached keys per score block (whole tiles; a wider tile alone)
};

// attention of n queries of one head. q, k_cur, v_cur, out are [n, heads, head_dim] rows.
template <class Source>
void attend_head(const Source& src, int head, int heads, int head_dim, const float* q, const float* k_cur,
                 const float* v_cur, int n, float* out, ScoreLimits limits = {}) {
  const int stride = heads * head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  StridedMap qm(q + head * head_dim, n, head_dim, Eigen::OuterStride<>(stride));
  // cached tiles are attended in groups of whole tiles up to group_keys
  // keys (one score block each), so that a cache of small tiles (a frame
  // each) makes a few wide products instead of many small ones
  const int block_keys = std::max(1, std::min(n, limits.block_keys));
  int64_t widest = std::max(block_keys, 1);
  std::vector<int> group_end;  // each group's end tile
  for (int t = 0; t < src.tiles();) {
    int64_t keys = src.tile_tokens(t++);
    while (t < src.tiles() && keys + src.tile_tokens(t) <= limits.group_keys) keys += src.tile_tokens(t++);
    group_end.push_back(t);
    widest = std::max(widest, keys);
  }
  const int rows = static_cast<int>(std::clamp<int64_t>(limits.max_floats / widest, 1, std::max(n, 1)));
  OnlineSoftmax st;
  st.reset(n, head_dim);
  RowMatrix kt, vt, s;
  for (int g = 0, t0 = 0; g < static_cast<int>(group_end.size()); t0 = group_end[static_cast<size_t>(g++)]) {
    const int t1 = group_end[static_cast<size_t>(g)];
    int keys = 0;
    for (int t = t0; t < t1; ++t) keys += src.tile_tokens(t);
    if (keys == 0) continue;
    kt.resize(keys, head_dim);
    vt.resize(keys, head_dim);
    for (int t = t0, at = 0; t < t1; at += src.tile_tokens(t++))
      if (src.tile_tokens(t) > 0)
        src.load(t, head, kt.data() + static_cast<size_t>(at) * head_dim, vt.data() + static_cast<size_t>(at) * head_dim);
    for (int r0 = 0; r0 < n; r0 += rows) {
      const int nr = std::min(rows, n - r0);
      s.noalias() = qm.middleRows(r0, nr) * kt.transpose();
      for (int t = t0, at = 0; t < t1; at += src.tile_tokens(t++))
        if (src.tile_tokens(t) > 0)
          src.add_logit_bias(t, head, q + static_cast<size_t>(r0) * stride + head * head_dim, stride, nr, s.data() + at,
                             keys);
      s *= scale;
      st.update(s, vt, r0);
    }
  }
  StridedMap kc(k_cur + head * head_dim, n, head_dim, Eigen::OuterStride<>(stride));
  StridedMap vc(v_cur + head * head_dim, n, head_dim, Eigen::OuterStride<>(stride));
  for (int c0 = 0; c0 < n; c0 += block_keys) {
    const int nc = std::min(block_keys, n - c0);
    for (int r0 = 0; r0 < n; r0 += rows) {
      const int nr = std::min(rows, n - r0);
      s.noalias() = (qm.middleRows(r0, nr) * kc.middleRows(c0, nc).transpose()) * scale;
      st.update(s, vc.middleRows(c0, nc), r0);
    }
  }
  for (int i = 0; i < n; ++i) {
    const float inv = 1.0f / st.l[i];
    float* o = out + static_cast<size_t>(i) * stride + head * head_dim;
    for (int d = 0; d < head_dim; ++d) o[d] = st.acc(i, d) * inv;
  }
}

template <class Source>
void attend_all_heads(const Source& src, int heads, int head_dim, const float* q, const float* k_cur,
                      const float* v_cur, int n, float* out, ScoreLimits limits = {}) {
#pragma omp parallel for schedule(static)
  for (int h = 0; h < heads; ++h) attend_head(src, h, heads, head_dim, q, k_cur, v_cur, n, out, limits);
}

}  // namespace wm
