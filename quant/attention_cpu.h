// Tiled attention with online softmax on the CPU, shared by every cache
// format. A format supplies its cache as a sequence of tiles that it
// dequantizes one at a time into a small fp32 scratch (never the whole cache);
// the current block's own K/V come last as one more tile.
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
#include <cmath>
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
  // s: raw logits already scaled, [n, t]; v: [t, head_dim]
  template <class VMat>
  void update(RowMatrix& s, const VMat& v) {
    const int n = static_cast<int>(s.rows());
    Eigen::VectorXf corr(n);
    for (int i = 0; i < n; ++i) {
      const float row_max = s.row(i).maxCoeff();
      const float m_new = std::max(m[i], row_max);
      corr[i] = std::isinf(m[i]) ? 0.0f : std::exp(m[i] - m_new);
      s.row(i) = (s.row(i).array() - m_new).exp();
      l[i] = l[i] * corr[i] + s.row(i).sum();
      m[i] = m_new;
    }
    acc = corr.asDiagonal() * acc;
    acc.noalias() += s * v;
  }
};

// attention of n queries of one head. q, k_cur, v_cur, out are [n, heads, head_dim] rows.
template <class Source>
void attend_head(const Source& src, int head, int heads, int head_dim, const float* q, const float* k_cur,
                 const float* v_cur, int n, float* out) {
  const int stride = heads * head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  StridedMap qm(q + head * head_dim, n, head_dim, Eigen::OuterStride<>(stride));
  OnlineSoftmax st;
  st.reset(n, head_dim);
  RowMatrix kt, vt, s;
  for (int t = 0; t < src.tiles(); ++t) {
    const int tt = src.tile_tokens(t);
    if (tt == 0) continue;
    kt.resize(tt, head_dim);
    vt.resize(tt, head_dim);
    src.load(t, head, kt.data(), vt.data());
    s.noalias() = qm * kt.transpose();
    src.add_logit_bias(t, head, q + head * head_dim, stride, n, s.data(), tt);
    s *= scale;
    st.update(s, vt);
  }
  StridedMap kc(k_cur + head * head_dim, n, head_dim, Eigen::OuterStride<>(stride));
  StridedMap vc(v_cur + head * head_dim, n, head_dim, Eigen::OuterStride<>(stride));
  s.noalias() = (qm * kc.transpose()) * scale;
  st.update(s, vc);
  for (int i = 0; i < n; ++i) {
    const float inv = 1.0f / st.l[i];
    float* o = out + static_cast<size_t>(i) * stride + head * head_dim;
    for (int d = 0; d < head_dim; ++d) o[d] = st.acc(i, d) * inv;
  }
}

template <class Source>
void attend_all_heads(const Source& src, int heads, int head_dim, const float* q, const float* k_cur,
                      const float* v_cur, int n, float* out) {
#pragma omp parallel for schedule(static)
  for (int h = 0; h < heads; ++h) attend_head(src, h, heads, head_dim, q, k_cur, v_cur, n, out);
}

}  // namespace wm
