// The CPU attention's score blocks are bounded: a block of many tokens
// attends in row chunks of its queries and column chunks of its own keys,
// cached tiles in groups of up to ScoreLimits::group_keys keys, and it
// gives the same output however it is cut.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "quant/attention_cpu.h"
#include "quant/kv_cache.h"
#include "quant/kv_cases.h"

namespace wm {
namespace {

std::vector<float> randn(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// cached tiles of uneven widths, with a logit correction that depends on
// each query row (as PSAC's does): a chunk given the wrong rows shows
struct BiasedTiles {
  int heads = 0, head_dim = 0;
  std::vector<int> widths;
  std::vector<std::vector<float>> k, v;  // per tile, [tokens, heads, head_dim]
  int tiles() const { return static_cast<int>(widths.size()); }
  int tile_tokens(int t) const { return widths[static_cast<size_t>(t)]; }
  void load(int t, int head, float* kt, float* vt) const {
    for (int i = 0; i < widths[static_cast<size_t>(t)]; ++i)
      for (int d = 0; d < head_dim; ++d) {
        const size_t at = (static_cast<size_t>(i) * heads + head) * head_dim + d;
        kt[static_cast<size_t>(i) * head_dim + d] = k[static_cast<size_t>(t)][at];
        vt[static_cast<size_t>(i) * head_dim + d] = v[static_cast<size_t>(t)][at];
      }
  }
  void add_logit_bias(int t, int, const float* q, int q_stride, int n, float* s, int s_stride) const {
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < widths[static_cast<size_t>(t)]; ++j)
        s[static_cast<size_t>(i) * s_stride + j] += 0.5f * q[static_cast<size_t>(i) * q_stride] * static_cast<float>(j % 3);
  }
};

TEST(AttentionChunks, ChunkedScoreBlocksGiveTheUnchunkedOutput) {
  std::mt19937 rng(7);
  BiasedTiles src;
  src.heads = 2;
  src.head_dim = 16;
  src.widths = {5, 0, 13, 8};
  for (int w : src.widths) {
    src.k.push_back(randn(static_cast<size_t>(w) * src.heads * src.head_dim, rng));
    src.v.push_back(randn(static_cast<size_t>(w) * src.heads * src.head_dim, rng));
  }
  const int n = 37;
  const size_t vals = static_cast<size_t>(n) * src.heads * src.head_dim;
  const auto q = randn(vals, rng), kc = randn(vals, rng), vc = randn(vals, rng);
  std::vector<float> whole(vals), chunked(vals);
  attend_all_heads(src, src.heads, src.head_dim, q.data(), kc.data(), vc.data(), n, whole.data());
  // the cached tiles one score block each (group_keys 1), or grouped as
  // {5, 0} {13} {8} (13) or all together (the default); 13 keys at most ->
  // 4 query rows per score block; the block's own 37 keys in 6 chunks
  for (const ScoreLimits limits : {ScoreLimits{52, 7, 1}, ScoreLimits{1, 1, 1}, ScoreLimits{13 * 37, 37, 1},
                                   ScoreLimits{52, 7, 13}, ScoreLimits{26 * 3, 37}, ScoreLimits{1, 1}}) {
    attend_all_heads(src, src.heads, src.head_dim, q.data(), kc.data(), vc.data(), n, chunked.data(), limits);
    for (size_t i = 0; i < vals; ++i)
      ASSERT_NEAR(chunked[i], whole[i], 2e-5f) << "limits " << limits.max_floats << "/" << limits.block_keys << "/"
                                               << limits.group_keys << " at " << i;
  }
}

// A 4096-token block over QuantWM-2 spans with a PSAC basis: 2 row chunks
// at the default limits. Each query's output depends on that query alone,
// so swapping the two halves of the block's queries swaps the two halves of
// the output; a chunk whose logit correction used another chunk's queries
// would not.
TEST(AttentionChunks, QuantWmSpansAttendALongBlockRowByRow) {
  const int T = 4096;
  const KvGeometry g = kv_case_geometry(64, 1, T, 2, 0);
  auto cache = make_kv_cache("quantwm2", g);
  ASSERT_TRUE(cache.ok()) << cache.status();
  SyntheticKv data(g, 3);
  ASSERT_TRUE(fill_cache(cache->get(), data, 3, 64).ok());
  ASSERT_GT((*cache)->bytes().bases, 0) << "the spans need a PSAC basis for this test";
  std::vector<float> q, kc, vc;
  data.queries(50, T, &q);
  data.block(50, T, &kc, &vc);
  const size_t half = static_cast<size_t>(T / 2) * g.head_dim;
  std::vector<float> swapped(q.size());
  std::copy(q.begin() + static_cast<std::ptrdiff_t>(half), q.end(), swapped.begin());
  std::copy(q.begin(), q.begin() + static_cast<std::ptrdiff_t>(half), swapped.begin() + static_cast<std::ptrdiff_t>(half));
  std::vector<float> a(q.size()), b(q.size());
  (*cache)->attend(0, q.data(), kc.data(), vc.data(), T, a.data());
  (*cache)->attend(0, swapped.data(), kc.data(), vc.data(), T, b.data());
  for (size_t i = 0; i < a.size(); ++i) {
    const size_t j = i < half ? i + half : i - half;
    ASSERT_NEAR(b[i], a[j], 1e-5f) << "value " << i;
  }
}

}  // namespace
}  // namespace wm
