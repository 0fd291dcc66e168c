// The span coder's clustering on the host (quant/kmeans.h, quant/span_codec.h):
// k-means alone, and the whole coding of one (span, head, side), which adds
// each token's nearest centroids (QSAC's candidates), its residual blocks
// and, for QuantWM-2's keys, its PSAC coefficients. The CPU cache codes
// every span this way; the CUDA backend codes the same bits on the device.
// Shapes: a Matrix-Game-2 block (3 frames x 880 tokens, 128 channels,
// k = 41) and the default model's frame (64 tokens, 64 channels) with 16
// tokens per centroid (k = 4); keys with QSAC's weights, values without.
//
//   span_coder_bench [--benchmark_filter=...]
#include <benchmark/benchmark.h>

#include <cmath>
#include <random>
#include <vector>

#include "common/half.h"
#include "quant/kmeans.h"
#include "quant/kv_layouts.h"
#include "quant/span_codec.h"

namespace {

struct Shape {
  std::vector<float> x, w, basis;
};

// fp16-valued rows (what the caches hold), positive weights, an orthonormal-ish fp16 basis
Shape shape(int n, int d) {
  std::mt19937 rng(1);
  std::normal_distribution<float> g(0.0f, 1.0f);
  Shape s;
  s.x.resize(static_cast<size_t>(n) * d);
  for (float& v : s.x) v = wm::f16_to_f32(wm::f32_to_f16(g(rng)));
  s.w.resize(static_cast<size_t>(d));
  for (float& v : s.w) v = std::abs(g(rng)) + 0.1f;
  s.basis.assign(static_cast<size_t>(wm::kPsacRank) * d, 0.0f);
  for (int r = 0; r < wm::kPsacRank; ++r) s.basis[static_cast<size_t>(r) * d + r] = 1.0f;
  return s;
}

// args: tokens, head_dim, centroids, weighted
void BM_Kmeans(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0)), d = static_cast<int>(state.range(1));
  const int k = static_cast<int>(state.range(2));
  const Shape s = shape(n, d);
  std::vector<float> cen;
  uint64_t seed = 1;
  for (auto _ : state) {
    wm::kmeans(s.x.data(), n, d, d, state.range(3) != 0 ? s.w.data() : nullptr, k, 4, seed++, &cen, nullptr);
    benchmark::DoNotOptimize(cen.data());
  }
}

// args: tokens, head_dim, centroids, key (QSAC weights, 4 candidates, PSAC)
void BM_SpanEncode(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0)), d = static_cast<int>(state.range(1));
  const Shape s = shape(n, d);
  wm::SpanCodecParams p;
  p.block = 64;
  p.centroids = static_cast<int>(state.range(2));
  if (state.range(3) != 0) {
    p.weights = s.w.data();
    p.candidates = 4;
    p.basis = s.basis.data();
  }
  wm::SpanHeadCodes out;
  for (auto _ : state) {
    wm::span_encode(s.x.data(), n, d, d, p, &out);
    benchmark::DoNotOptimize(out.blocks.data());
    ++p.seed;
  }
}

}  // namespace

BENCHMARK(BM_Kmeans)->Args({2640, 128, 41, 1})->Args({2640, 128, 41, 0})->Args({64, 64, 4, 1})->Unit(benchmark::kMillisecond);
BENCHMARK(BM_SpanEncode)
    ->Args({2640, 128, 41, 1})
    ->Args({2640, 128, 41, 0})
    ->Args({64, 64, 4, 1})
    ->Args({64, 64, 1, 1})
    ->Unit(benchmark::kMillisecond);
BENCHMARK_MAIN();
