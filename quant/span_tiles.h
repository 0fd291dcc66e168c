// The tile source of the span formats (attention_cpu.h): one tile is a
// pending fp16 frame or up to kSpanTileTokens tokens of one quantized span,
// dequantized for one head into the attention's scratch. The residual block
// size and the PSAC coefficient record are template types (STYLE 5); the
// PSAC correction is added to the raw logits as (U q) . alpha.
#pragma once

#include <immintrin.h>

#include <Eigen/Dense>
#include <vector>

#include "quant/attention_cpu.h"
#include "quant/fp16_rows.h"
#include "quant/kv_layouts.h"
#include "quant/span_store.h"

namespace wm {

inline constexpr int kSpanTileTokens = 256;

// one token: centroid (fp16 [d]) + residual blocks (BlockQ2Sym<B> [d / B]) -> out [d]
template <int B>
inline void q2sym_token_dequant(const uint8_t* blocks, const uint16_t* centroid, int d, float* out) {
  static_assert(B % 8 == 0, "8 codes per step");
  const BlockQ2Sym<B>* blk = reinterpret_cast<const BlockQ2Sym<B>*>(blocks);
  for (int b = 0; b < d / B; ++b) {
    const float s = q2sym_scale(blk[b].scale), off = q2sym_offset(blk[b].scale);
    const uint8_t* codes = blk[b].codes;
    float* o = out + b * B;
    const uint16_t* c = centroid + b * B;
#if defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
    const __m256i shifts = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
    const __m256 vs = _mm256_set1_ps(s), voff = _mm256_set1_ps(off);
    const __m256i three = _mm256_set1_epi32(3);
    for (int i = 0; i < B; i += 8) {
      const int two = codes[i / 4] | (codes[i / 4 + 1] << 8);  // 8 codes
      const __m256i q = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(two), shifts), three);
      const __m256 lv = _mm256_sub_ps(_mm256_cvtepi32_ps(q), voff);
      const __m256 cv = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c + i)));
      _mm256_storeu_ps(o + i, _mm256_fmadd_ps(lv, vs, cv));
    }
#else
    for (int i = 0; i < B; ++i) o[i] = f16_to_f32(c[i]) + (static_cast<float>(q2_get(codes, i)) - off) * s;
#endif
  }
}

template <int B, class Coeffs>
struct SpanTiles {
  struct Ref {
    const PendingFrame* frame;  // a pending frame, or
    const QuantSpan* span;      // tokens [begin, begin + tokens) of a span
    int begin, tokens;
  };
  struct HeadScratch {
    const PsacBasis* basis = nullptr;
    const float* q = nullptr;  // the queries qu was made of (a long block comes in row chunks)
    int n = 0;
    RowMatrix qu;              // [n, kPsacRank]: U q of every query for `basis`
    RowMatrix alpha;           // [kPsacRank, tile tokens]
  };
  int head_dim = 0;
  int tokens_per_frame = 0;
  bool keys_quantized = true, values_quantized = true;
  std::vector<Ref> refs;                      // the tiles, in frame order
  mutable std::vector<HeadScratch> scratch;   // [heads]; a head's thread only touches its own

  int tiles() const { return static_cast<int>(refs.size()); }
  int tile_tokens(int t) const { return refs[static_cast<size_t>(t)].tokens; }

  void load(int t, int head, float* k, float* v) const {
    const Ref& r = refs[static_cast<size_t>(t)];
    const int D = head_dim;
    if (r.frame != nullptr) {
      const size_t off = static_cast<size_t>(head) * tokens_per_frame * D;
      load_row(r.frame->k.data() + off, k, r.tokens * D);
      load_row(r.frame->v.data() + off, v, r.tokens * D);
      return;
    }
    const int bb = span_block_bytes(D, B);
    const size_t h = static_cast<size_t>(head);
    for (int side = 0; side < 2; ++side) {
      const bool quantized = side == 0 ? keys_quantized : values_quantized;
      float* out = side == 0 ? k : v;
      if (!quantized) {
        const auto& f = side == 0 ? r.span->kf[h] : r.span->vf[h];
        load_row(f.data() + static_cast<size_t>(r.begin) * D, out, r.tokens * D);
        continue;
      }
      const SpanHeadCodes& c = side == 0 ? r.span->k[h] : r.span->v[h];
      for (int i = 0; i < r.tokens; ++i) {
        const int tok = r.begin + i;
        q2sym_token_dequant<B>(c.blocks.data() + static_cast<size_t>(tok) * bb,
                               c.centroids.data() + static_cast<size_t>(c.ids[static_cast<size_t>(tok)]) * D, D,
                               out + static_cast<size_t>(i) * D);
      }
    }
  }

  // s [n, tokens] (row stride s_stride) += (U q) . alpha for the tile's keys
  void add_logit_bias(int t, int head, const float* q, int q_stride, int n, float* s, int s_stride) const {
    const Ref& r = refs[static_cast<size_t>(t)];
    if (r.span == nullptr || r.span->basis == nullptr || !keys_quantized) return;
    const SpanHeadCodes& c = r.span->k[static_cast<size_t>(head)];
    if (c.coeffs.empty()) return;
    const int D = head_dim, R = kPsacRank;
    HeadScratch& hs = scratch[static_cast<size_t>(head)];
    if (hs.basis != r.span->basis.get() || hs.q != q || hs.n != n) {
      RowMatrix u(R, D);
      load_row(r.span->basis->u.data() + static_cast<size_t>(head) * R * D, u.data(), R * D);
      StridedMap qm(q, n, D, Eigen::OuterStride<>(q_stride));
      hs.qu.noalias() = qm * u.transpose();
      hs.basis = r.span->basis.get();
      hs.q = q;
      hs.n = n;
    }
    // alpha transposed, [kPsacRank, tokens], so that the update below runs
    // along the tokens: s_i += sum_r (U q_i)_r alpha_r (8 axpys per query)
    hs.alpha.resize(R, r.tokens);
    const Coeffs* rec = reinterpret_cast<const Coeffs*>(c.coeffs.data()) + r.begin;
    for (int i = 0; i < r.tokens; ++i) {
      const float sc = f16_to_f32(rec[i].scale);
      for (int j = 0; j < R; ++j) hs.alpha(j, i) = static_cast<float>(psac_code(rec[i], j)) * sc;
    }
    const float* alpha = hs.alpha.data();
    const int T = r.tokens;
    for (int i = 0; i < n; ++i) {
      float* srow = s + static_cast<size_t>(i) * s_stride;
      const float* qu = hs.qu.data() + static_cast<size_t>(i) * R;
      int t2 = 0;
#if defined(__AVX512F__)
      // 16 logits stay in a register while the 8 coefficients accumulate
      __m512 qz[kPsacRank];
      for (int j = 0; j < R; ++j) qz[j] = _mm512_set1_ps(qu[j]);
      for (; t2 + 16 <= T; t2 += 16) {
        __m512 acc = _mm512_loadu_ps(srow + t2);
        for (int j = 0; j < R; ++j) acc = _mm512_fmadd_ps(qz[j], _mm512_loadu_ps(alpha + static_cast<size_t>(j) * T + t2), acc);
        _mm512_storeu_ps(srow + t2, acc);
      }
#endif
#if defined(__AVX2__) && defined(__FMA__)
      // 8 logits stay in a register while the 8 coefficients accumulate
      __m256 qb[kPsacRank];
      for (int j = 0; j < R; ++j) qb[j] = _mm256_set1_ps(qu[j]);
      for (; t2 + 8 <= T; t2 += 8) {
        __m256 acc = _mm256_loadu_ps(srow + t2);
        for (int j = 0; j < R; ++j) acc = _mm256_fmadd_ps(qb[j], _mm256_loadu_ps(alpha + static_cast<size_t>(j) * T + t2), acc);
        _mm256_storeu_ps(srow + t2, acc);
      }
#endif
      for (; t2 < T; ++t2) {
        float acc = srow[t2];
        for (int j = 0; j < R; ++j) acc += qu[j] * alpha[static_cast<size_t>(j) * T + t2];
        srow[t2] = acc;
      }
    }
  }
};

}  // namespace wm
