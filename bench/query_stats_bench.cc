// QuantWM's query statistics (quant/query_stats.h): one attention call's
// add() per head, and the PSAC bases of a layer's heads (the top-8
// eigenvectors of each head's G / count), which a write pass computes on
// the host at every basis refresh, on the CPU backend and for the CUDA
// backend alike. Shapes: the default model (4 heads x 64) and
// Matrix-Game-2 (12 heads x 128); bases with 1 and 2 OpenMP threads.
//
//   query_stats_bench [--benchmark_filter=...]
#include <benchmark/benchmark.h>
#include <omp.h>

#include <random>
#include <vector>

#include "quant/query_stats.h"

namespace {

std::vector<float> queries(int rows, int d, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> q(static_cast<size_t>(rows) * d);
  for (float& v : q) v = g(rng);
  return q;
}

// args: rows, head_dim
void BM_Add(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0)), d = static_cast<int>(state.range(1));
  const std::vector<float> q = queries(n, d, 1);
  wm::QueryStats s(d);
  for (auto _ : state) s.add(q.data(), d, n);
  benchmark::DoNotOptimize(s.lower().data());
}
BENCHMARK(BM_Add)->Args({64, 64})->Args({2640, 128})->Unit(benchmark::kMicrosecond);

// args: heads, head_dim, threads
void BM_Bases(benchmark::State& state) {
  const int H = static_cast<int>(state.range(0)), d = static_cast<int>(state.range(1));
  std::vector<wm::QueryStats> heads;
  for (int h = 0; h < H; ++h) {
    heads.emplace_back(d);
    const std::vector<float> q = queries(4 * d, d, 10 + static_cast<uint32_t>(h));
    heads.back().add(q.data(), d, 4 * d);
  }
  omp_set_num_threads(static_cast<int>(state.range(2)));
  for (auto _ : state) benchmark::DoNotOptimize(wm::principal_bases_f16(heads, 8));
}
BENCHMARK(BM_Bases)
    ->Args({4, 64, 1})
    ->Args({4, 64, 2})
    ->Args({12, 128, 1})
    ->Args({12, 128, 2})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
