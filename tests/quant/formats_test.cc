// Every format through the shared case table (quant/kv_cases.h): fused
// attention against the scalar reference decoder + naive attention, byte
// accounting, error budgets, determinism and the edge cases.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <map>
#include <random>

#include "absl/strings/str_cat.h"
#include "quant/kv_cache.h"
#include "quant/kv_cases.h"
#include "tests/quant/test_util.h"

namespace wm {

// gtest prints a failing case by its name
void PrintTo(const KvCase& c, std::ostream* os) { *os << c.name; }

namespace {

using testing_util::all_finite;
using testing_util::naive_attention;
using testing_util::rel_l2;

std::unique_ptr<KvCache> make(const KvCase& c) {
  auto cache = make_kv_cache(c.format, c.geometry, c.options);
  EXPECT_TRUE(cache.ok()) << c.name << ": " << cache.status();
  return cache.ok() ? std::move(*cache) : nullptr;
}

class FormatCaseTest : public ::testing::TestWithParam<KvCase> {};

TEST_P(FormatCaseTest, FusedAttentionMatchesReferenceDecoderAcrossEviction) {
  const KvCase& c = GetParam();
  auto cache = make(c);
  ASSERT_NE(cache, nullptr);
  auto ref = make_kv_cache("fp32", c.geometry);
  ASSERT_TRUE(ref.ok());
  SyntheticKv data(c.geometry, c.seed);
  const KvGeometry& g = c.geometry;
  const int64_t reserve = kv_format_max_bytes(c.format, g, c.options);
  std::vector<float> k, v, q, kc, vc, out, want, rk, rv;
  for (int f = 0; f < c.frames; ++f) {
    data.frame(f, &k, &v);
    data.queries(f, c.query_tokens, &q);
    data.block(f, c.query_tokens, &kc, &vc);
    for (int l = 0; l < g.layers; ++l) {
      cache->observe_queries(l, q.data(), c.query_tokens);
      // attention before the append, as in the engine's write pass
      out.assign(q.size(), 0.0f);
      cache->attend(l, q.data(), kc.data(), vc.data(), c.query_tokens, out.data());
      cache->reconstruct(l, &rk, &rv);
      const int m = static_cast<int>(rk.size() / (static_cast<size_t>(g.heads) * g.head_dim));
      naive_attention(q, c.query_tokens, rk, rv, m, kc, vc, g.heads, g.head_dim, &want);
      ASSERT_LT(rel_l2(out, want), 2e-5) << c.name << " frame " << f;
      ASSERT_TRUE((*ref)->append(l, k.data(), v.data(), f, 1).ok());
      ASSERT_TRUE(cache->append(l, k.data(), v.data(), f, 1).ok());
      EXPECT_EQ(cache->frames(l), (*ref)->frames(l)) << c.name << " frame " << f;
    }
    EXPECT_LE(cache->bytes().total(), reserve) << c.name << " frame " << f;
  }
  EXPECT_EQ(cache->format(), c.format);
}

TEST_P(FormatCaseTest, DeterministicAcrossRunsAndThreadCounts) {
  const KvCase& c = GetParam();
  std::vector<float> out[2], rk[2], rv[2];
  const int threads = omp_get_max_threads();
  for (int run = 0; run < 2; ++run) {
    omp_set_num_threads(run == 0 ? 1 : std::max(2, threads));
    auto cache = make(c);
    ASSERT_NE(cache, nullptr);
    SyntheticKv data(c.geometry, c.seed);
    ASSERT_TRUE(fill_cache(cache.get(), data, c.frames, c.query_tokens).ok());
    std::vector<float> q, kc, vc;
    data.queries(99, c.query_tokens, &q);
    data.block(99, c.query_tokens, &kc, &vc);
    out[run].resize(q.size());
    cache->attend(0, q.data(), kc.data(), vc.data(), c.query_tokens, out[run].data());
    cache->reconstruct(0, &rk[run], &rv[run]);
  }
  omp_set_num_threads(threads);
  EXPECT_EQ(rk[0], rk[1]) << c.name;
  EXPECT_EQ(rv[0], rv[1]) << c.name;
  // outputs: per-head work is independent of the thread count
  EXPECT_EQ(out[0], out[1]) << c.name;
}

INSTANTIATE_TEST_SUITE_P(Cases, FormatCaseTest, ::testing::ValuesIn(kv_test_cases()),
                         [](const ::testing::TestParamInfo<KvCase>& i) {
                           std::string n = i.param.name;
                           for (char& ch : n)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return n;
                         });

// relative reconstruction error of the whole window against full precision
std::pair<double, double> reconstruction_error(const std::string& format, const KvGeometry& g, int frames,
                                               const KvFormatOptions& o = {}) {
  auto cache = make_kv_cache(format, g, o);
  auto ref = make_kv_cache("fp32", g);
  EXPECT_TRUE(cache.ok() && ref.ok());
  SyntheticKv data(g, 5);
  EXPECT_TRUE(fill_cache(cache->get(), data, frames, 32).ok());
  EXPECT_TRUE(fill_cache(ref->get(), data, frames, 32).ok());
  std::vector<float> k, v, rk, rv;
  (*cache)->reconstruct(0, &k, &v);
  (*ref)->reconstruct(0, &rk, &rv);
  return {rel_l2(k, rk), rel_l2(v, rv)};
}

TEST(Formats, ReconstructionErrorWithinBudget) {
  // per-format budgets (relative L2 over the window, sinks and fp16 parts included)
  const std::map<std::string, std::pair<double, double>> budget = {
      {"fp16", {1e-3, 1e-3}}, {"kivi2", {0.30, 0.40}}, {"qvg2", {0.25, 0.40}},
      {"quantwm2", {0.25, 0.40}}, {"kivi2-v", {1e-3, 0.40}}, {"qvg2-k", {0.25, 1e-3}}};
  for (int hd : {64, 128}) {
    const KvGeometry g = kv_case_geometry(hd, 2, 64, 6, 1);
    for (const auto& [format, b] : budget) {
      const auto [ek, ev] = reconstruction_error(format, g, 10);
      EXPECT_LT(ek, b.first) << format << " keys, hd " << hd;
      EXPECT_LT(ev, b.second) << format << " values, hd " << hd;
      if (format != "fp16" && format != "qvg2-k") {
        EXPECT_GT(ev, 0.01) << format << ": values should be quantized";
      }
    }
  }
}

// the default model's geometry, one layer: every component by hand (docs/QUANT.md's worked example)
TEST(Formats, BytesMatchHandComputedLayoutsForTheDefaultModel) {
  const KvGeometry g = kv_case_geometry(64, 4, 64, 16, 1);
  SyntheticKv data(g, 1);
  auto run = [&](const char* format) {
    auto cache = make_kv_cache(format, g);
    EXPECT_TRUE(cache.ok());
    EXPECT_TRUE(fill_cache(cache->get(), data, 20, 64).ok());
    return (*cache)->bytes();
  };
  const int64_t sink = 64 * 4 * 64 * 2 * 2;  // one fp16 frame, K and V
  // KIVI-2: 16 live frames = 32 chunks of 32 tokens; per chunk and head:
  // codes 2 * 64*32/4, scales 2 * 64 * 2, zeros 2 * 64 * 2
  KvBytes b = run("kivi2");
  EXPECT_EQ(b.fp_values, sink);
  EXPECT_EQ(b.codes, 32 * 4 * 1024);
  EXPECT_EQ(b.scales, 32 * 4 * 256);
  EXPECT_EQ(b.zeros, 32 * 4 * 256);
  EXPECT_EQ(b.total(), 262144);
  // QVG-2: 16 one-frame spans; per span, head and side: codes 64*64/4 = 1024,
  // fp8 scales 64, ids 64, one fp16 centroid 128
  b = run("qvg2");
  EXPECT_EQ(b.fp_values, sink);
  EXPECT_EQ(b.codes, 16 * 4 * 2 * 1024);
  EXPECT_EQ(b.scales, 16 * 4 * 2 * 64);
  EXPECT_EQ(b.ids, 16 * 4 * 2 * 64);
  EXPECT_EQ(b.centroids, 16 * 4 * 2 * 128);
  EXPECT_EQ(b.total(), 229376);
  // QuantWM-2: + 64 coefficient records of 10 bytes per span and head, and
  // two live bases (frames 4..19 were quantized with the bases of frames 1 and 17)
  b = run("quantwm2");
  EXPECT_EQ(b.coeffs, 16 * 4 * 640);
  EXPECT_EQ(b.bases, 2 * 4 * 8 * 64 * 2);
  EXPECT_EQ(b.total(), 229376 + 40960 + 8192);
  // fp16 for comparison: 17 frames
  EXPECT_EQ(run("fp16").total(), 17 * sink);
}

TEST(Formats, ReservationIsTheExactWorstCase) {
  // run long sessions (past several span / basis / residual periods) and
  // compare the most bytes ever held with what admission reserves
  struct C {
    const char* format;
    KvFormatOptions o;
    KvGeometry g;
  };
  KvFormatOptions span3;
  span3.span_frames = 3;
  span3.psac_refresh_frames = 4;
  KvFormatOptions kivi;
  kivi.kivi_residual = 64;
  const C cases[] = {
      {"kivi2", {}, kv_case_geometry(64, 2, 24, 4, 1)},  {"kivi2", kivi, kv_case_geometry(64, 2, 40, 3, 0)},
      {"qvg2", {}, kv_case_geometry(64, 2, 32, 4, 1)},   {"quantwm2", {}, kv_case_geometry(64, 2, 32, 4, 1)},
      {"quantwm2", span3, kv_case_geometry(64, 2, 16, 5, 2)}, {"qvg2-k", span3, kv_case_geometry(32, 2, 16, 5, 0)},
  };
  for (const C& c : cases) {
    auto cache = make_kv_cache(c.format, c.g, c.o);
    ASSERT_TRUE(cache.ok()) << cache.status();
    SyntheticKv data(c.g, 2);
    int64_t most = 0;
    std::vector<float> k, v, q;
    for (int f = 0; f < 40; ++f) {
      data.frame(f, &k, &v);
      data.queries(f, 8, &q);
      (*cache)->observe_queries(0, q.data(), 8);
      ASSERT_TRUE((*cache)->append(0, k.data(), v.data(), f, 1).ok());
      most = std::max(most, (*cache)->bytes().total());
    }
    EXPECT_EQ(most, kv_format_max_bytes(c.format, c.g, c.o)) << c.format;
  }
}

TEST(Formats, ReservationCoversEveryEngineAppendPattern) {
  // blocks of 3 frames, one sink: the engine appends whole blocks except a
  // prompt's last chunk; every such pattern stays within the reservation and
  // the worst of them reaches it
  KvGeometry g = kv_case_geometry(32, 1, 16, 6, 1);
  g.frames_per_block = 3;
  for (const char* format : {"kivi2", "qvg2", "quantwm2"}) {
    const int64_t reserved = kv_format_max_bytes(format, g);
    int64_t most = 0;
    for (int r = 0; r < 3; ++r)
      for (int q = 0; q < (r == 0 ? 1 : 6); ++q) {
        auto cache = make_kv_cache(format, g);
        ASSERT_TRUE(cache.ok());
        SyntheticKv data(g, 2);
        std::vector<int> calls(static_cast<size_t>(q), 3);
        if (r > 0) calls.push_back(r);
        int64_t next = 0;
        std::vector<float> q8, k, v, kb, vb;
        for (size_t i = 0; next < 36; ++i) {
          const int n = i < calls.size() ? calls[i] : 3;
          kb.clear();
          vb.clear();
          for (int f = 0; f < n; ++f) {
            data.frame(next + f, &k, &v);
            kb.insert(kb.end(), k.begin(), k.end());
            vb.insert(vb.end(), v.begin(), v.end());
          }
          data.queries(next, 8, &q8);
          (*cache)->observe_queries(0, q8.data(), 8);
          ASSERT_TRUE((*cache)->append(0, kb.data(), vb.data(), next, n).ok());
          next += n;
          const int64_t b = (*cache)->bytes().total();
          EXPECT_LE(b, reserved) << format << " r=" << r << " q=" << q << " after frame " << next;
          most = std::max(most, b);
        }
      }
    EXPECT_EQ(most, reserved) << format;
  }
}

TEST(Formats, SessionsShorterThanAGroupOrSpanStayFp16) {
  const KvGeometry g = kv_case_geometry(64, 2, 8, 4, 0);
  KvFormatOptions o;
  o.span_frames = 4;
  for (const char* f : {"kivi2", "qvg2", "quantwm2"}) {
    auto cache = make_kv_cache(f, g, o);
    auto fp16 = make_kv_cache("fp16", g);
    ASSERT_TRUE(cache.ok() && fp16.ok());
    SyntheticKv data(g, 3);
    ASSERT_TRUE(fill_cache(cache->get(), data, 2, 8).ok());  // 16 tokens < G = 32, 2 frames < span 4
    ASSERT_TRUE(fill_cache(fp16->get(), data, 2, 8).ok());
    EXPECT_EQ((*cache)->bytes().total(), (*fp16)->bytes().total()) << f;
    EXPECT_EQ((*cache)->bytes().codes, 0) << f;
    std::vector<float> q, kc, vc, a(16 * 2 * 64), b(a.size());
    data.queries(5, 16, &q);
    data.block(5, 16, &kc, &vc);
    (*cache)->attend(0, q.data(), kc.data(), vc.data(), 16, a.data());
    (*fp16)->attend(0, q.data(), kc.data(), vc.data(), 16, b.data());
    EXPECT_LT(rel_l2(a, b), 1e-6) << f;
  }
}

TEST(Formats, ZeroAndConstantChannelsStayBounded) {
  const KvGeometry g = kv_case_geometry(64, 1, 64, 4, 0);
  for (const char* f : {"kivi2", "qvg2", "quantwm2"}) {
    auto cache = make_kv_cache(f, g);
    ASSERT_TRUE(cache.ok());
    SyntheticKv data(g, 4);
    std::vector<float> k, v, q;
    for (int fr = 0; fr < 3; ++fr) {
      data.frame(fr, &k, &v);
      for (int t = 0; t < 64; ++t) {
        k[static_cast<size_t>(t) * 64 + 3] = 0.0f;
        k[static_cast<size_t>(t) * 64 + 5] = 2.5f;
        v[static_cast<size_t>(t) * 64 + 7] = 0.0f;
      }
      data.queries(fr, 16, &q);
      (*cache)->observe_queries(0, q.data(), 16);
      ASSERT_TRUE((*cache)->append(0, k.data(), v.data(), fr, 1).ok());
    }
    std::vector<float> rk, rv, fk, fv;
    (*cache)->reconstruct(0, &rk, &rv);
    // the same frames without the special channels' values, for the average error
    auto ref = make_kv_cache("fp32", g);
    for (int fr = 0; fr < 3; ++fr) {
      data.frame(fr, &k, &v);
      for (int t = 0; t < 64; ++t) {
        k[static_cast<size_t>(t) * 64 + 3] = 0.0f;
        k[static_cast<size_t>(t) * 64 + 5] = 2.5f;
        v[static_cast<size_t>(t) * 64 + 7] = 0.0f;
      }
      ASSERT_TRUE((*ref)->append(0, k.data(), v.data(), fr, 1).ok());
    }
    (*ref)->reconstruct(0, &fk, &fv);
    auto channel_err = [](const std::vector<float>& a, const std::vector<float>& r, int ch) {
      double e = 0;
      size_t n = 0;
      for (size_t t = 0; t < a.size() / 64; ++t)
        for (int c = 0; c < 64; ++c)
          if (ch < 0 || c == ch) {
            e += std::fabs(static_cast<double>(a[t * 64 + c]) - r[t * 64 + c]);
            ++n;
          }
      return e / static_cast<double>(n);
    };
    const double avg_k = channel_err(rk, fk, -1), avg_v = channel_err(rv, fv, -1);
    // kivi's per-channel key groups hold a constant channel exactly. In the
    // span formats the centroid holds it and its residual is nil, which the
    // mid-rise level set codes as +-half a step (the ternary set, when the
    // block picks it, codes it exactly): bounded by about twice the average
    // channel's error. The same holds for a zero channel inside a value group.
    if (std::string(f) == "kivi2") {
      EXPECT_LE(channel_err(rk, fk, 3), 1e-6) << f;
      EXPECT_LE(channel_err(rk, fk, 5), 1e-6) << f;
    } else {
      EXPECT_LE(channel_err(rk, fk, 3), 2.5 * avg_k) << f;
      EXPECT_LE(channel_err(rk, fk, 5), 2.5 * avg_k) << f;
    }
    EXPECT_LE(channel_err(rv, fv, 7), 2.5 * avg_v) << f;
  }
  // all-zero and all-constant frames are exact in every format
  for (float c : {0.0f, 2.5f})
    for (const char* f : {"kivi2", "qvg2", "quantwm2"}) {
      auto cache = make_kv_cache(f, g);
      std::vector<float> z(64 * 64, c), rk, rv;
      for (int fr = 0; fr < 2; ++fr) {
        (*cache)->observe_queries(0, z.data(), 64);
        ASSERT_TRUE((*cache)->append(0, z.data(), z.data(), fr, 1).ok());
      }
      (*cache)->reconstruct(0, &rk, &rv);
      for (float x : rk) ASSERT_EQ(x, c) << f;
      for (float x : rv) ASSERT_EQ(x, c) << f;
    }
}

// one token with a huge value (or NaN/inf): everything stays finite and the
// other tokens' error stays bounded
void poisoned_run(const char* format, float bad, double* other_err, double* clean_err, bool* finite) {
  const KvGeometry g = kv_case_geometry(64, 2, 64, 4, 0);
  double errs[2];
  for (int run = 0; run < 2; ++run) {
    auto cache = make_kv_cache(format, g);
    auto ref = make_kv_cache("fp32", g);
    SyntheticKv data(g, 6);
    std::vector<float> k, v, q;
    for (int fr = 0; fr < 3; ++fr) {
      data.frame(fr, &k, &v);
      std::vector<float> kr = k, vr = v;
      if (run == 1 && fr == 1) {
        k[static_cast<size_t>(10) * 128 + 4] = bad;
        v[static_cast<size_t>(10) * 128 + 4] = bad;
      }
      data.queries(fr, 8, &q);
      (*cache)->observe_queries(0, q.data(), 8);
      ASSERT_TRUE((*cache)->append(0, k.data(), v.data(), fr, 1).ok());
      ASSERT_TRUE((*ref)->append(0, kr.data(), vr.data(), fr, 1).ok());
    }
    std::vector<float> ck, cv, rk, rv;
    (*cache)->reconstruct(0, &ck, &cv);
    (*ref)->reconstruct(0, &rk, &rv);
    if (run == 1) *finite = all_finite(ck) && all_finite(cv);
    // error over every token but the bad one (frame 1, token 10, both heads)
    double num = 0, den = 0;
    for (size_t i = 0; i < ck.size(); ++i) {
      const size_t tok = i / 128;
      if (tok == 64 + 10) continue;
      if (!std::isfinite(ck[i])) continue;
      num += (ck[i] - rk[i]) * (ck[i] - rk[i]);
      den += rk[i] * rk[i];
    }
    errs[run] = std::sqrt(num / den);
    std::vector<float> q2, kc, vc, out(8 * 128);
    data.queries(50, 8, &q2);
    data.block(50, 8, &kc, &vc);
    (*cache)->attend(0, q2.data(), kc.data(), vc.data(), 8, out.data());
    if (run == 1) *finite = *finite && all_finite(out);
  }
  *clean_err = errs[0];
  *other_err = errs[1];
}

TEST(Formats, HugeOutliersStayLocal) {
  for (const char* f : {"kivi2", "qvg2", "quantwm2"}) {
    double other = 0, clean = 0;
    bool finite = false;
    poisoned_run(f, 1e4f, &other, &clean, &finite);
    EXPECT_TRUE(finite) << f;
    // kivi's key groups run over tokens, so the outlier's channel group loses
    // precision for its 31 neighbours (bounded); the span formats keep it local
    EXPECT_LT(other, std::string(f) == "kivi2" ? 4 * clean : 1.25 * clean) << f;
  }
}

TEST(Formats, NanAndInfDoNotPoisonOtherTokens) {
  for (float bad : {NAN, INFINITY, -INFINITY})
    for (const char* f : {"kivi2", "qvg2", "quantwm2", "quantwm2-k", "kivi2-v"}) {
      double other = 0, clean = 0;
      bool finite = false;
      poisoned_run(f, bad, &other, &clean, &finite);
      EXPECT_TRUE(finite) << f << " " << bad;
      EXPECT_LT(other, std::isnan(bad) ? 1.25 * clean : (std::string(f).rfind("kivi2", 0) == 0 ? 6 * clean : 1.25 * clean) + 1e-6)
          << f << " " << bad;
    }
}

TEST(Formats, NamesOptionsAndErrors) {
  const KvGeometry g = kv_case_geometry(64, 2, 16, 4, 1);
  for (const std::string& f : kv_format_variants()) {
    auto c = make_kv_cache(f, g);
    ASSERT_TRUE(c.ok()) << f << ": " << c.status();
    EXPECT_EQ((*c)->format(), f);
    EXPECT_TRUE(kv_format_known(f));
    EXPECT_GT(kv_format_max_bytes(f, g), 0) << f;
  }
  EXPECT_FALSE(kv_format_known("qvg3"));
  EXPECT_EQ(make_kv_cache("qvg3", g).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(kv_format_max_bytes("qvg3", g), 0);
  auto o = kv_format_options("quantwm2-psac-k");
  ASSERT_TRUE(o.ok());
  EXPECT_FALSE(o->qsac);
  EXPECT_TRUE(o->psac);
  EXPECT_FALSE(o->quantize_values);
  KvFormatOptions bad;
  bad.block = 48;
  EXPECT_EQ(make_kv_cache("qvg2", g, bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad = {};
  bad.kivi_residual = 40;
  EXPECT_EQ(make_kv_cache("kivi2", g, bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad = {};
  bad.span_frames = 5;  // longer than the window
  EXPECT_EQ(make_kv_cache("qvg2", g, bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad = {};
  bad.psac_rank = 4;
  EXPECT_EQ(make_kv_cache("quantwm2", g, bad).status().code(), absl::StatusCode::kInvalidArgument);
  // every option is checked as given (256 is not capped to head_dim and accepted), the message quotes it
  auto message = [&](const char* f, const KvFormatOptions& o) { return std::string(make_kv_cache(f, g, o).status().message()); };
  for (int block : {3, 256, 1000000}) {
    bad = {};
    bad.block = block;
    EXPECT_NE(message("qvg2", bad).find(absl::StrCat("block ", block, " is not 16, 32, 64 or 128")), std::string::npos)
        << message("qvg2", bad);
  }
  bad = {};
  bad.span_frames = -1;
  EXPECT_NE(message("qvg2", bad).find("span_frames -1 must be within 0..window (4"), std::string::npos)
      << message("qvg2", bad);
  bad = {};
  bad.kivi_residual = 32000000;
  EXPECT_NE(message("kivi2", bad).find("residual 32000000"), std::string::npos) << message("kivi2", bad);
  bad = {};
  bad.psac_refresh_frames = 3;
  bad.span_frames = 4;
  bad.kmeans_iters = 2000000000;
  EXPECT_NE(message("quantwm2", bad).find("kmeans_iters 2000000000"), std::string::npos) << message("quantwm2", bad);
  // spans, blocks and refreshes that line up only after millions of frames
  const KvGeometry wide = kv_case_geometry(64, 2, 16, 1024, 1);
  bad = {};
  bad.span_frames = 1021;
  bad.psac_refresh_frames = 1024;
  EXPECT_EQ(make_kv_cache("quantwm2", wide, bad).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(kv_format_max_bytes("quantwm2", wide, bad), 0);
  // the PSAC period binds only formats that refresh a basis
  EXPECT_TRUE(make_kv_cache("qvg2", wide, bad).ok());
  EXPECT_TRUE(make_kv_cache("quantwm2-qsac", wide, bad).ok());
  EXPECT_TRUE(make_kv_cache("quantwm2-v", wide, bad).ok());
  // a head_dim that caps the block below the codec's sizes has no span format
  // (the codec would code nothing): 64 capped at 48, or at 8
  for (const int hd : {8, 24, 48, 56}) {
    const KvGeometry odd = kv_case_geometry(hd, 2, 16, 4, 1);
    for (const char* f : {"qvg2", "quantwm2"}) {
      EXPECT_EQ(make_kv_cache(f, odd).status().code(), absl::StatusCode::kInvalidArgument) << f << " hd " << hd;
      EXPECT_EQ(kv_format_max_bytes(f, odd), 0) << f << " hd " << hd;
    }
  }
  // an option of another family does not stretch the worst-case replay (these hung)
  KvFormatOptions other = {};
  other.span_frames = 2147483647;
  other.psac_refresh_frames = 2147483647;
  EXPECT_EQ(kv_format_max_bytes("kivi2", g, other), kv_format_max_bytes("kivi2", g));
  other = {};
  other.kivi_residual = 32000000;
  EXPECT_EQ(kv_format_max_bytes("qvg2", g, other), kv_format_max_bytes("qvg2", g));
  // appends must be contiguous
  auto c = make_kv_cache("qvg2", g);
  std::vector<float> k(16 * 2 * 64, 0.5f);
  ASSERT_TRUE((*c)->append(0, k.data(), k.data(), 0, 1).ok());
  EXPECT_EQ((*c)->append(0, k.data(), k.data(), 5, 1).code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace wm
