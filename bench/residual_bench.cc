// The span coder's residual quantizer: the scalar reference
// (q2sym_quantize_ref) against the coder's search, which tries the candidate
// scales side by side (span_quantize_residual); the same blocks bit for bit
// (tests/quant/residual_search_test.cc). Per block of B residuals, normal
// values; one token of the default model is one block of 64 per head.
//
//   residual_bench [--benchmark_filter=...]
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "quant/kv_layouts.h"
#include "quant/span_codec.h"

namespace {

constexpr int kRows = 4096;

std::vector<float> rows(int B) {
  std::mt19937 rng(1);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(kRows) * B);
  for (float& v : x) v = g(rng);
  return x;
}

template <int B>
void BM_Reference(benchmark::State& state) {
  const std::vector<float> x = rows(B);
  std::vector<wm::BlockQ2Sym<B>> out(kRows);
  int r = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(wm::q2sym_quantize_ref<B>(x.data() + static_cast<size_t>(r) * B, nullptr, &out[r]));
    r = (r + 1) % kRows;
  }
  state.SetItemsProcessed(state.iterations());
}

template <int B>
void BM_SideBySide(benchmark::State& state) {
  const std::vector<float> x = rows(B);
  std::vector<uint8_t> out(static_cast<size_t>(kRows) * sizeof(wm::BlockQ2Sym<B>));
  int r = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(wm::span_quantize_residual(x.data() + static_cast<size_t>(r) * B, nullptr, B,
                                                        out.data() + static_cast<size_t>(r) * sizeof(wm::BlockQ2Sym<B>)));
    r = (r + 1) % kRows;
  }
  state.SetItemsProcessed(state.iterations());
}

BENCHMARK_TEMPLATE(BM_Reference, 16);
BENCHMARK_TEMPLATE(BM_SideBySide, 16);
BENCHMARK_TEMPLATE(BM_Reference, 32);
BENCHMARK_TEMPLATE(BM_SideBySide, 32);
BENCHMARK_TEMPLATE(BM_Reference, 64);
BENCHMARK_TEMPLATE(BM_SideBySide, 64);
BENCHMARK_TEMPLATE(BM_Reference, 128);
BENCHMARK_TEMPLATE(BM_SideBySide, 128);

}  // namespace

BENCHMARK_MAIN();
