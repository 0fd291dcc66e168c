#include "quant/span_codec.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "common/half.h"
#include "quant/kmeans.h"
#include "quant/kv_layouts.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace wm {
namespace {

// q2sym_quantize_bytes (q2_ops.h) with its candidate scales tried side by
// side: each candidate's error is still summed over the values in order,
// with a separate multiply and add per step (this unit is built without
// fused multiply-adds), and the candidates are compared in the reference's
// order, so the block and the error are the reference's bit for bit. The
// codes as counts of thresholds passed: mid-rise (s > 0) [v >= s] + [v >= 0]
// + [v >= -s], ternary [v >= s/2] + [v >= -s/2], both level sets in one
// pass over the values, a vector of 8 lanes each. (q2sym_code's ternary
// lower threshold is strict: a value on it is as far from either level, so
// its error is the same on either side.)
template <int B>
float q2sym_quantize_search(const float* x, const float* w, uint8_t* blk) {
#if defined(__AVX2__)
  float xs[B];
  float best_err;
  const float amax = q2sym_prepare(x, w, B, xs, &best_err);
  uint8_t best = 0;
  if (amax > 0.0f) {
    // the candidates: mid-rise scales in lanes 0..7, ternary ones in 8..15
    // (7 each at most); idle lanes get a valid scale and are never read
    alignas(32) float scale[16], err[16];
    uint8_t code[16];
    int count[2] = {0, 0};
    for (int mode = 0; mode < 2; ++mode) {
      int hi, lo;
      q2sym_candidates(amax, mode == 1, &hi, &lo);
      for (int c = hi; c >= lo; --c, ++count[mode]) {
        scale[8 * mode + count[mode]] = e4m3_decode(static_cast<uint8_t>(c));
        code[8 * mode + count[mode]] = static_cast<uint8_t>(c | (mode == 1 ? kQ2Ternary : 0));
      }
      for (int t = count[mode]; t < 8; ++t) scale[8 * mode + t] = 1.0f;
    }
    const __m256 one = _mm256_set1_ps(1.0f);
    const __m256 s0 = _mm256_load_ps(scale), neg_s0 = _mm256_sub_ps(_mm256_setzero_ps(), s0);
    const __m256 s1 = _mm256_load_ps(scale + 8);
    const __m256 half_s1 = _mm256_mul_ps(_mm256_set1_ps(0.5f), s1), neg_half_s1 = _mm256_mul_ps(_mm256_set1_ps(-0.5f), s1);
    const __m256 off0 = _mm256_set1_ps(1.5f);
    __m256 e0 = _mm256_setzero_ps(), e1 = _mm256_setzero_ps();
    for (int i = 0; i < B; ++i) {
      const __m256 v = _mm256_set1_ps(xs[i]);
      const __m256 wi = _mm256_set1_ps(w != nullptr ? w[i] : 1.0f);
      const __m256 nonneg = _mm256_set1_ps(xs[i] >= 0.0f ? 1.0f : 0.0f);
      const __m256 c0 = _mm256_add_ps(_mm256_add_ps(_mm256_and_ps(_mm256_cmp_ps(v, s0, _CMP_GE_OQ), one), nonneg),
                                      _mm256_and_ps(_mm256_cmp_ps(v, neg_s0, _CMP_GE_OQ), one));
      const __m256 c1 = _mm256_add_ps(_mm256_and_ps(_mm256_cmp_ps(v, half_s1, _CMP_GE_OQ), one),
                                      _mm256_and_ps(_mm256_cmp_ps(v, neg_half_s1, _CMP_GE_OQ), one));
      const __m256 d0 = _mm256_sub_ps(v, _mm256_mul_ps(_mm256_sub_ps(c0, off0), s0));
      const __m256 d1 = _mm256_sub_ps(v, _mm256_mul_ps(_mm256_sub_ps(c1, one), s1));
      e0 = _mm256_add_ps(e0, _mm256_mul_ps(_mm256_mul_ps(wi, d0), d0));
      e1 = _mm256_add_ps(e1, _mm256_mul_ps(_mm256_mul_ps(wi, d1), d1));
    }
    _mm256_store_ps(err, e0);
    _mm256_store_ps(err + 8, e1);
    for (int mode = 0; mode < 2; ++mode)
      for (int t = 0; t < count[mode]; ++t)
        if (err[8 * mode + t] < best_err) {
          best_err = err[8 * mode + t];
          best = code[8 * mode + t];
        }
  }
  q2sym_write(xs, B, best, blk);
  return best_err;
#else
  return q2sym_quantize_bytes<B>(x, w, B, blk);
#endif
}

template <int B>
void encode_impl(const float* x, int n, int d, int stride, const SpanCodecParams& p, SpanHeadCodes* out) {
  using Block = BlockQ2Sym<B>;
  const int nb = d / B;
  // the NaN guard, then clustering on the clean copy
  std::vector<float> clean(static_cast<size_t>(n) * d);
  for (int i = 0; i < n; ++i)
    for (int c = 0; c < d; ++c)
      clean[static_cast<size_t>(i) * d + c] = kv_sanitize(x[static_cast<size_t>(i) * stride + c]);
  std::vector<float> cen;
  kmeans(clean.data(), n, d, d, p.weights, std::min(p.centroids, 256), p.iters, p.seed, &cen, nullptr);
  const int k = static_cast<int>(cen.size()) / d;
  out->k = k;
  out->centroids.resize(cen.size());
  // tokens are coded against the stored (fp16) centroids
  for (size_t i = 0; i < cen.size(); ++i) {
    out->centroids[i] = f32_to_f16(cen[i]);
    cen[i] = f16_to_f32(out->centroids[i]);
  }
  out->ids.assign(static_cast<size_t>(n), 0);
  out->blocks.assign(static_cast<size_t>(n) * nb * sizeof(Block), 0);
  const bool psac = p.basis != nullptr;
  const int rec = span_coeff_bytes(p.coeff_bits);
  out->coeffs.assign(psac ? static_cast<size_t>(n) * rec : 0, 0);

  const int m = std::max(1, std::min(p.candidates, k));
  // every token's distance to every (stored) centroid at once, in vector lanes where there are
  // several; nearest_centroids' order and ties
  std::vector<float> to(k > 1 ? static_cast<size_t>(k) * n : 0);
  if (k > 1) {
    const RowDistances rows(clean.data(), n, d, d, p.weights);
    for (int j = 0; j < k; ++j) rows.to_one(cen.data() + static_cast<size_t>(j) * d, to.data() + static_cast<size_t>(j) * n);
  }
  std::vector<int> cand(static_cast<size_t>(m));
  std::vector<float> cdist(static_cast<size_t>(m));
  std::vector<float> resid(static_cast<size_t>(d));
  std::vector<Block> trial(static_cast<size_t>(nb)), best(static_cast<size_t>(nb));
  std::vector<float> err_vec(static_cast<size_t>(d)), alpha(kPsacRank), deq(static_cast<size_t>(B));
  for (int i = 0; i < n; ++i) {
    const float* xi = clean.data() + static_cast<size_t>(i) * d;
    const int have = k > 1 ? nearest_of(to.data() + i, n, k, m, cand.data(), cdist.data())
                           : nearest_centroids(xi, d, p.weights, cen.data(), k, m, cand.data(), cdist.data());
    float best_err = std::numeric_limits<float>::infinity();
    int best_id = cand[0];
    for (int t = 0; t < have; ++t) {
      const float* cj = cen.data() + static_cast<size_t>(cand[static_cast<size_t>(t)]) * d;
      for (int c = 0; c < d; ++c) resid[static_cast<size_t>(c)] = xi[c] - cj[c];
      float err = 0.0f;
      for (int b = 0; b < nb; ++b)
        err += q2sym_quantize_search<B>(resid.data() + b * B, p.weights != nullptr ? p.weights + b * B : nullptr,
                                        reinterpret_cast<uint8_t*>(&trial[static_cast<size_t>(b)]));
      // strict < keeps the nearest candidate on ties (and a finite error always beats the first inf)
      if (err < best_err || t == 0) {
        best_err = err;
        best_id = cand[static_cast<size_t>(t)];
        best = trial;
      }
    }
    out->ids[static_cast<size_t>(i)] = static_cast<uint8_t>(best_id);
    std::copy(reinterpret_cast<const uint8_t*>(best.data()), reinterpret_cast<const uint8_t*>(best.data()) + nb * sizeof(Block),
              out->blocks.data() + static_cast<size_t>(i) * nb * sizeof(Block));
    if (!psac) continue;
    // PSAC: the error left after centroid + residual, projected on the basis
    const float* cj = cen.data() + static_cast<size_t>(best_id) * d;
    for (int b = 0; b < nb; ++b) {
      q2sym_dequantize_ref<B>(best[static_cast<size_t>(b)], deq.data());
      for (int c = 0; c < B; ++c) err_vec[static_cast<size_t>(b * B + c)] = xi[b * B + c] - cj[b * B + c] - deq[static_cast<size_t>(c)];
    }
    for (int r = 0; r < kPsacRank; ++r) {
      double a = 0;
      for (int c = 0; c < d; ++c) a += static_cast<double>(p.basis[static_cast<size_t>(r) * d + c]) * err_vec[static_cast<size_t>(c)];
      alpha[static_cast<size_t>(r)] = static_cast<float>(a);
    }
    uint8_t* dst = out->coeffs.data() + static_cast<size_t>(i) * rec;
    if (p.coeff_bits == 8) {
      psac_quantize_ref(alpha.data(), reinterpret_cast<PsacCoeffsI8<kPsacRank>*>(dst));
    } else {
      psac_quantize_ref(alpha.data(), reinterpret_cast<PsacCoeffsI4<kPsacRank>*>(dst));
    }
  }
}

template <int B>
void decode_impl(const SpanHeadCodes& c, int n, int d, int coeff_bits, const float* basis, float* out, int stride) {
  using Block = BlockQ2Sym<B>;
  const int nb = d / B;
  const Block* blocks = reinterpret_cast<const Block*>(c.blocks.data());
  const int rec = span_coeff_bytes(coeff_bits);
  std::vector<float> alpha(kPsacRank);
  for (int i = 0; i < n; ++i) {
    float* o = out + static_cast<size_t>(i) * stride;
    const uint16_t* cj = c.centroids.data() + static_cast<size_t>(c.ids[static_cast<size_t>(i)]) * d;
    for (int b = 0; b < nb; ++b) q2sym_dequantize_ref<B>(blocks[static_cast<size_t>(i) * nb + b], o + b * B);
    for (int x = 0; x < d; ++x) o[x] += f16_to_f32(cj[x]);
    if (basis == nullptr || c.coeffs.empty()) continue;
    const uint8_t* src = c.coeffs.data() + static_cast<size_t>(i) * rec;
    if (coeff_bits == 8) {
      psac_dequantize_ref(*reinterpret_cast<const PsacCoeffsI8<kPsacRank>*>(src), alpha.data());
    } else {
      psac_dequantize_ref(*reinterpret_cast<const PsacCoeffsI4<kPsacRank>*>(src), alpha.data());
    }
    for (int r = 0; r < kPsacRank; ++r)
      for (int x = 0; x < d; ++x) o[x] += alpha[static_cast<size_t>(r)] * basis[static_cast<size_t>(r) * d + x];
  }
}

uint64_t mix(uint64_t a, uint64_t b) {
  uint64_t x = a ^ (b + 0x9E3779B97F4A7C15ull + (a << 6) + (a >> 2));
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

uint64_t span_seed(uint64_t kmeans_seed, int layer, int head, int side, int64_t first_frame) {
  return mix(mix(mix(kmeans_seed, static_cast<uint64_t>(layer)), static_cast<uint64_t>(head) * 2 + static_cast<uint64_t>(side)),
             static_cast<uint64_t>(first_frame));
}

int span_block_bytes(int head_dim, int block) { return head_dim / block * (1 + block / 4); }

int span_coeff_bytes(int coeff_bits) {
  return coeff_bits == 8 ? static_cast<int>(sizeof(PsacCoeffsI8<kPsacRank>))
                         : static_cast<int>(sizeof(PsacCoeffsI4<kPsacRank>));
}

void span_encode(const float* x, int n, int d, int stride, const SpanCodecParams& p, SpanHeadCodes* out) {
  switch (p.block) {
    case 16: return encode_impl<16>(x, n, d, stride, p, out);
    case 32: return encode_impl<32>(x, n, d, stride, p, out);
    case 64: return encode_impl<64>(x, n, d, stride, p, out);
    default: return encode_impl<128>(x, n, d, stride, p, out);
  }
}

float span_quantize_residual(const float* x, const float* w, int block, uint8_t* out) {
  switch (block) {
    case 16: return q2sym_quantize_search<16>(x, w, out);
    case 32: return q2sym_quantize_search<32>(x, w, out);
    case 64: return q2sym_quantize_search<64>(x, w, out);
    default: return q2sym_quantize_search<128>(x, w, out);
  }
}

void span_decode_ref(const SpanHeadCodes& c, int n, int d, int block, int coeff_bits, const float* basis,
                     float* out, int stride) {
  switch (block) {
    case 16: return decode_impl<16>(c, n, d, coeff_bits, basis, out, stride);
    case 32: return decode_impl<32>(c, n, d, coeff_bits, basis, out, stride);
    case 64: return decode_impl<64>(c, n, d, coeff_bits, basis, out, stride);
    default: return decode_impl<128>(c, n, d, coeff_bits, basis, out, stride);
  }
}

void span_drop_front(SpanHeadCodes* c, int tokens, int head_dim, int block, int coeff_bits) {
  auto drop = [&](std::vector<uint8_t>* v, size_t per_token) {
    if (v->empty()) return;
    v->erase(v->begin(), v->begin() + static_cast<std::ptrdiff_t>(per_token * tokens));
  };
  drop(&c->ids, 1);
  drop(&c->blocks, static_cast<size_t>(span_block_bytes(head_dim, block)));
  drop(&c->coeffs, static_cast<size_t>(span_coeff_bytes(coeff_bits)));
}

}  // namespace wm
