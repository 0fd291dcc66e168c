// QuantWM-2's query-aware parts: the statistics, PSAC's effect, causality.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "quant/kv_cache.h"
#include "quant/kv_cases.h"
#include "quant/probe.h"
#include "quant/query_stats.h"
#include "tests/quant/test_util.h"

namespace wm {
namespace {

TEST(QueryStats, WeightsAreNormalisedAndFloored) {
  QueryStats s(4);
  float w[4] = {-1, -1, -1, -1};
  EXPECT_FALSE(s.channel_weights(0.01f, w));
  EXPECT_EQ(w[0], -1);
  // channel energies 4, 1, 0, 3 -> mean 2 -> weights 2, 0.5, floor, 1.5
  const float q[] = {2, 1, 0, std::sqrt(3.0f), -2, -1, 0, -std::sqrt(3.0f), NAN, 0, 0, 0};
  s.add(q, 4, 3);  // the NaN row is skipped
  EXPECT_EQ(s.count(), 2);
  ASSERT_TRUE(s.channel_weights(0.01f, w));
  EXPECT_NEAR(w[0], 2.0f, 1e-5);
  EXPECT_NEAR(w[1], 0.5f, 1e-5);
  EXPECT_NEAR(w[2], 0.01f, 1e-7);
  EXPECT_NEAR(w[3], 1.5f, 1e-5);
}

// add() sums each Gram entry over the rows in order from zero and adds that
// to the running sum, as the CUDA backend's kernel does (cuda/query_gram.cuh),
// whose sums set_gram() takes: a naive ordered sum gives the same
// statistics bit for bit (two calls; rows across
// several of add()'s blocks, a head_dim that is no whole chunk, a
// non-finite row skipped; head_dims odd, even, 64 and 128)
void expect_add_is_the_ordered_gram_sum(int d) {
  SCOPED_TRACE(d);
  const int n = 75;
  std::mt19937 g(7);
  std::normal_distribution<float> nd(0.0f, 3.0f);
  std::vector<float> q(static_cast<size_t>(n) * d);
  for (float& x : q) x = nd(g);
  q[static_cast<size_t>(9) * d + 5] = NAN;
  std::vector<double> lower(static_cast<size_t>(d) * (d + 1) / 2, 0.0);
  int64_t used = 0;
  for (int i = 0; i < n; ++i) {
    if (i == 9) continue;
    for (int x = 0; x < d; ++x)
      for (int y = 0; y <= x; ++y)
        lower[static_cast<size_t>(x) * (x + 1) / 2 + y] +=
            static_cast<double>(q[static_cast<size_t>(i) * d + x]) * q[static_cast<size_t>(i) * d + y];
    ++used;
  }
  QueryStats a(d), b(d);
  for (int call = 0; call < 2; ++call) a.add(q.data(), d, n);
  std::vector<double> twice(lower.size());
  for (size_t i = 0; i < lower.size(); ++i) twice[i] = 0.0 + lower[i] + lower[i];  // the running sums, in call order
  b.set_gram(twice.data(), 2 * used);
  ASSERT_EQ(a.lower().size(), b.lower().size());
  EXPECT_EQ(std::memcmp(a.lower().data(), b.lower().data(), a.lower().size() * 8), 0);
  EXPECT_EQ(a.count(), 2 * used);
  EXPECT_EQ(b.count(), 2 * used);
  std::vector<float> wa(d), wb(d), ua(static_cast<size_t>(8) * d), ub(ua.size());
  ASSERT_TRUE(a.channel_weights(0.01f, wa.data()));
  ASSERT_TRUE(b.channel_weights(0.01f, wb.data()));
  ASSERT_TRUE(a.principal_basis(8, ua.data(), nullptr));
  ASSERT_TRUE(b.principal_basis(8, ub.data(), nullptr));
  EXPECT_EQ(std::memcmp(wa.data(), wb.data(), wa.size() * 4), 0);
  EXPECT_EQ(std::memcmp(ua.data(), ub.data(), ua.size() * 4), 0);
}

TEST(QueryStats, AddIsTheOrderedGramSum) {
  for (const int d : {40, 33, 64, 128}) expect_add_is_the_ordered_gram_sum(d);
}

TEST(QueryStats, PrincipalBasisSpansTheQuerySubspace) {
  const int d = 32;
  std::mt19937 rng(1);
  // queries in span(e0, e5) with variances 9 and 1, plus tiny noise
  QueryStats s(d);
  std::normal_distribution<float> n(0, 1);
  std::vector<float> q(static_cast<size_t>(500) * d);
  for (int i = 0; i < 500; ++i) {
    float* r = q.data() + static_cast<size_t>(i) * d;
    for (int c = 0; c < d; ++c) r[c] = 0.01f * n(rng);
    r[0] += 3 * n(rng);
    r[5] += n(rng);
  }
  s.add(q.data(), d, 500);
  std::vector<float> u(static_cast<size_t>(8) * d);
  double energy = 0;
  ASSERT_TRUE(s.principal_basis(8, u.data(), &energy));
  EXPECT_GT(energy, 0.99);
  EXPECT_NEAR(std::fabs(u[0]), 1.0f, 1e-3);      // first eigenvector: e0
  EXPECT_NEAR(std::fabs(u[d + 5]), 1.0f, 1e-3);  // second: e5
  for (int i = 0; i < 8; ++i)
    for (int j = 0; j < 8; ++j) {
      double dot = 0;
      for (int c = 0; c < d; ++c) dot += static_cast<double>(u[static_cast<size_t>(i) * d + c]) * u[static_cast<size_t>(j) * d + c];
      EXPECT_NEAR(dot, i == j ? 1.0 : 0.0, 1e-5);
    }
}

// logit error of a format against fp32 on the synthetic (anisotropic) data
DriftStats logit_error(const std::string& format, const KvGeometry& g, const KvFormatOptions& o = {}) {
  auto cache = make_kv_cache(format, g, o);
  auto ref = make_kv_cache("fp32", g);
  EXPECT_TRUE(cache.ok() && ref.ok());
  SyntheticKv data(g, 21);
  EXPECT_TRUE(fill_cache(cache->get(), data, 10, 64).ok());
  EXPECT_TRUE(fill_cache(ref->get(), data, 10, 64).ok());
  DriftStats st;
  std::vector<float> q, kc, vc;
  for (int step = 100; step < 104; ++step) {
    data.queries(step, 64, &q);
    data.block(step, 64, &kc, &vc);
    const auto samples = probe_sample(64, g.heads, 64, static_cast<uint64_t>(step));
    EXPECT_TRUE(probe_caches(**ref, **cache, 0, q.data(), kc.data(), vc.data(), 64, samples, 8, &st));
  }
  return st;
}

double rmse(const DriftStats& s) { return std::sqrt(s.logit_sq_err_sum / std::max<int64_t>(1, s.logits)); }

TEST(QuantWm, PsacStrictlyReducesLogitErrorVsQsacAlone) {
  for (int hd : {64, 128}) {
    const KvGeometry g = kv_case_geometry(hd, 2, 64, 8, 1);
    const DriftStats qsac = logit_error("quantwm2-qsac", g), both = logit_error("quantwm2", g);
    const DriftStats qvg = logit_error("qvg2", g);
    EXPECT_LT(rmse(both), 0.7 * rmse(qsac)) << "hd " << hd;
    // and the whole method beats plain QVG on logits and token selection
    EXPECT_LT(rmse(both), rmse(qvg)) << "hd " << hd;
    EXPECT_LE(both.top1_mismatches, qvg.top1_mismatches) << "hd " << hd;
    // 4-bit coefficients still help
    KvFormatOptions o4;
    o4.psac_bits = 4;
    EXPECT_LT(rmse(logit_error("quantwm2", g, o4)), rmse(qsac)) << "hd " << hd;
    RecordProperty(("rmse_hd" + std::to_string(hd)).c_str(),
                   std::to_string(rmse(qvg)) + " qvg, " + std::to_string(rmse(qsac)) + " qsac, " + std::to_string(rmse(both)) + " quantwm");
  }
}

TEST(QuantWm, QsacWeightsReduceLogitErrorVsUniformClustering) {
  const KvGeometry g = kv_case_geometry(64, 2, 64, 8, 1);
  KvFormatOptions o;
  o.centroids = 8;
  o.tokens_per_centroid = 8;  // enough centroids for the clustering to matter
  EXPECT_LT(rmse(logit_error("quantwm2-qsac", g, o)), rmse(logit_error("qvg2", g, o)));
}

TEST(QuantWm, QuantizedSpansNeverDependOnLaterQueries) {
  const KvGeometry g = kv_case_geometry(64, 2, 32, 6, 1);
  KvFormatOptions o;
  o.psac_refresh_frames = 1;  // a new basis for every span, so the fifth frame sees the new queries
  for (const char* f : {"quantwm2", "quantwm2-qsac", "quantwm2-psac"}) {
    auto a = make_kv_cache(f, g, o);
    auto b = make_kv_cache(f, g, o);
    ASSERT_TRUE(a.ok() && b.ok());
    SyntheticKv data(g, 8);
    ASSERT_TRUE(fill_cache(a->get(), data, 4, 16).ok());
    ASSERT_TRUE(fill_cache(b->get(), data, 4, 16).ok());
    std::vector<float> ka, va, kb, vb;
    (*a)->reconstruct(0, &ka, &va);
    // b sees very different "future" queries before the next frame
    std::mt19937 rng(3);
    auto future = testing_util::randn(64 * 2 * 64, rng, 10.0f);
    for (size_t i = 0; i < future.size(); i += 64) future[i] *= 50.0f;
    (*b)->observe_queries(0, future.data(), 64);
    std::vector<float> k, v;
    data.frame(4, &k, &v);
    ASSERT_TRUE((*a)->append(0, k.data(), v.data(), 4, 1).ok());
    ASSERT_TRUE((*b)->append(0, k.data(), v.data(), 4, 1).ok());
    std::vector<float> ka2, va2;
    (*a)->reconstruct(0, &ka2, &va2);
    (*b)->reconstruct(0, &kb, &vb);
    // the first four frames are bit-identical in both; the fifth was
    // quantized after the different queries and differs
    const size_t old = ka.size();
    ASSERT_EQ(ka2.size(), kb.size());
    EXPECT_TRUE(std::equal(ka.begin(), ka.end(), kb.begin())) << f;
    EXPECT_TRUE(std::equal(ka.begin(), ka.end(), ka2.begin())) << f;
    EXPECT_FALSE(std::equal(ka2.begin() + static_cast<std::ptrdiff_t>(old), ka2.end(), kb.begin() + static_cast<std::ptrdiff_t>(old))) << f;
  }
}

TEST(QuantWm, NoQueriesMeansUniformWeightsAndNoPsac) {
  const KvGeometry g = kv_case_geometry(64, 2, 32, 4, 0);
  auto c = make_kv_cache("quantwm2", g);
  std::vector<float> k, v;
  SyntheticKv data(g, 2);
  for (int f = 0; f < 3; ++f) {
    data.frame(f, &k, &v);
    ASSERT_TRUE((*c)->append(0, k.data(), v.data(), f, 1).ok());
  }
  EXPECT_EQ((*c)->bytes().coeffs, 0);
  EXPECT_EQ((*c)->bytes().bases, 0);
  EXPECT_GT((*c)->bytes().codes, 0);
}

TEST(QuantWm, ValuesAreCodedExactlyAsQvg) {
  const KvGeometry g = kv_case_geometry(64, 2, 64, 4, 1);
  auto a = make_kv_cache("quantwm2", g);
  auto b = make_kv_cache("qvg2", g);
  SyntheticKv data(g, 9);
  ASSERT_TRUE(fill_cache(a->get(), data, 6, 32).ok());
  ASSERT_TRUE(fill_cache(b->get(), data, 6, 32).ok());
  std::vector<float> ka, va, kb, vb;
  (*a)->reconstruct(0, &ka, &va);
  (*b)->reconstruct(0, &kb, &vb);
  EXPECT_EQ(va, vb);
  EXPECT_NE(ka, kb);
}

}  // namespace
}  // namespace wm
