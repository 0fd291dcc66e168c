#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "quant/kv_cache.h"

namespace wm {
namespace {

std::vector<float> randn(size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// softmax(q k^T / sqrt(d)) v over the given keys, in double
void naive_attention(const std::vector<float>& q, int n, const std::vector<float>& k, const std::vector<float>& v,
                     int m, int heads, int hd, std::vector<float>* out) {
  out->assign(static_cast<size_t>(n) * heads * hd, 0.0f);
  for (int h = 0; h < heads; ++h)
    for (int i = 0; i < n; ++i) {
      std::vector<double> s(static_cast<size_t>(m));
      double mx = -1e300;
      for (int j = 0; j < m; ++j) {
        double dot = 0;
        for (int d = 0; d < hd; ++d)
          dot += static_cast<double>(q[(static_cast<size_t>(i) * heads + h) * hd + d]) * k[(static_cast<size_t>(j) * heads + h) * hd + d];
        s[static_cast<size_t>(j)] = dot / std::sqrt(static_cast<double>(hd));
        mx = std::max(mx, s[static_cast<size_t>(j)]);
      }
      double z = 0;
      for (double& x : s) z += (x = std::exp(x - mx));
      for (int d = 0; d < hd; ++d) {
        double acc = 0;
        for (int j = 0; j < m; ++j) acc += s[static_cast<size_t>(j)] * v[(static_cast<size_t>(j) * heads + h) * hd + d];
        (*out)[(static_cast<size_t>(i) * heads + h) * hd + d] = static_cast<float>(acc / z);
      }
    }
}

KvGeometry geometry(int hd) {
  KvGeometry g;
  g.layers = 2;
  g.heads = 3;
  g.head_dim = hd;
  g.tokens_per_frame = 5;
  g.window_frames = 3;
  g.sink_frames = 1;
  return g;
}

class FpCacheTest : public ::testing::TestWithParam<std::tuple<const char*, int>> {};

TEST_P(FpCacheTest, MatchesNaiveAttentionAcrossEviction) {
  const auto [format, hd] = GetParam();
  const KvGeometry g = geometry(hd);
  auto cache = make_kv_cache(format, g);
  ASSERT_TRUE(cache.ok());
  std::mt19937 rng(42);
  const size_t frame_vals = static_cast<size_t>(g.tokens_per_frame) * g.heads * g.head_dim;
  std::vector<std::vector<float>> ks, vs;  // per frame, layer 1
  const float tol = std::string(format) == "fp32" ? 2e-5f : 3e-3f;
  for (int f = 0; f < 7; ++f) {
    // attend with a block of 2 frames' worth of queries before appending frame f
    const int n = 2 * g.tokens_per_frame;
    auto q = randn(static_cast<size_t>(n) * g.heads * hd, rng);
    auto kc = randn(q.size(), rng), vc = randn(q.size(), rng);
    std::vector<float> out(q.size());
    (*cache)->attend(1, q.data(), kc.data(), vc.data(), n, out.data());
    // reference: sink frame 0 + last 3 frames + current block
    std::vector<float> kall, vall;
    std::vector<int64_t> expect_frames;
    for (int j = 0; j < f; ++j) {
      if (j < g.sink_frames || j >= f - g.window_frames) {
        kall.insert(kall.end(), ks[static_cast<size_t>(j)].begin(), ks[static_cast<size_t>(j)].end());
        vall.insert(vall.end(), vs[static_cast<size_t>(j)].begin(), vs[static_cast<size_t>(j)].end());
        expect_frames.push_back(j);
      }
    }
    EXPECT_EQ((*cache)->frames(1), expect_frames);
    kall.insert(kall.end(), kc.begin(), kc.end());
    vall.insert(vall.end(), vc.begin(), vc.end());
    std::vector<float> ref;
    naive_attention(q, n, kall, vall, static_cast<int>(kall.size() / (g.heads * hd)), g.heads, hd, &ref);
    for (size_t i = 0; i < ref.size(); ++i) ASSERT_NEAR(out[i], ref[i], tol) << "frame " << f << " index " << i;
    auto k = randn(frame_vals, rng), v = randn(frame_vals, rng);
    for (int l = 0; l < g.layers; ++l) ASSERT_TRUE((*cache)->append(l, k.data(), v.data(), f, 1).ok());
    ks.push_back(k);
    vs.push_back(v);
  }
  // 1 sink + 3 window frames, both layers, K and V
  const int64_t per_value = std::string(format) == "fp32" ? 4 : 2;
  EXPECT_EQ((*cache)->bytes().total(), 4 * 2 * g.layers * static_cast<int64_t>(frame_vals) * per_value);
  EXPECT_EQ((*cache)->bytes().total(), kv_format_max_bytes(format, g));
  // appending an old frame again is refused
  std::vector<float> z(frame_vals);
  EXPECT_FALSE((*cache)->append(0, z.data(), z.data(), 3, 1).ok());
}

// named by value: a const char* parameter would print as its address, which changes with every build
INSTANTIATE_TEST_SUITE_P(Formats, FpCacheTest,
                         ::testing::Combine(::testing::Values("fp32", "fp16"), ::testing::Values(64, 128)),
                         [](const ::testing::TestParamInfo<FpCacheTest::ParamType>& info) {
                           return std::string(std::get<0>(info.param)) + "_hd" + std::to_string(std::get<1>(info.param));
                         });

TEST(KvFactory, UnknownFormatIsNotFound) {
  auto c = make_kv_cache("int3", geometry(64));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kNotFound);
}

// a low-bit format's worst case is replayed once per format, geometry and
// options; the fp formats' is arithmetic, never replayed
TEST(KvFactory, WorstCasesAreReplayedOncePerQuestion) {
  KvGeometry g = geometry(64);
  g.window_frames = 7;  // a geometry no other test here asks about
  const int64_t before = kv_format_max_bytes_replays();
  const int64_t q = kv_format_max_bytes("quantwm2", g);
  ASSERT_GT(q, 0);
  EXPECT_EQ(kv_format_max_bytes_replays(), before + 1);
  EXPECT_EQ(kv_format_max_bytes("quantwm2", g), q);
  EXPECT_GT(kv_format_max_bytes("fp16", g), 0);
  EXPECT_EQ(kv_format_max_bytes_replays(), before + 1);
  // any field of the question is a new one, with its own answer
  KvFormatOptions o;
  o.psac_bits = 4;
  EXPECT_NE(kv_format_max_bytes("quantwm2", g, o), q);
  EXPECT_EQ(kv_format_max_bytes_replays(), before + 2);
  g.sink_frames = 2;
  EXPECT_NE(kv_format_max_bytes("quantwm2", g), q);
  EXPECT_EQ(kv_format_max_bytes_replays(), before + 3);
}

}  // namespace
}  // namespace wm
