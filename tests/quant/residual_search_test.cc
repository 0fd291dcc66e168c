// The coder's residual quantizer (span_quantize_residual: the candidate
// scales side by side) against the scalar reference it must equal bit for
// bit. Built without fused multiply-adds, as both the reference's users are
// (tests/quant/CMakeLists.txt).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "quant/kv_layouts.h"
#include "quant/span_codec.h"

namespace wm {
namespace {

// rows of the kinds a residual is: normal at several magnitudes, mostly
// zero, constant, a single spike, subnormal, past fp16's range, NaN and
// infinities, values on a candidate scale's thresholds
std::vector<float> residual_row(int B, int kind, std::mt19937& rng) {
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(B));
  const float mag = std::pow(10.0f, static_cast<float>(static_cast<int>(rng() % 9)) - 4.0f);
  for (float& v : x) v = g(rng) * mag;
  switch (kind % 8) {
    case 1:
      for (size_t i = 0; i < x.size(); ++i)
        if (i % 5 != 0) x[i] = 0.0f;
      break;
    case 2:
      std::fill(x.begin(), x.end(), g(rng));
      break;
    case 3:
      std::fill(x.begin(), x.end(), 0.0f);
      x[rng() % x.size()] = g(rng) * 100.0f;
      break;
    case 4:
      for (float& v : x) v *= 1e-40f;  // subnormal
      break;
    case 5:
      x[0] = 1e6f;
      x[1] = -std::numeric_limits<float>::infinity();
      x[2] = std::numeric_limits<float>::quiet_NaN();
      x[3] = -0.0f;
      break;
    case 6: {
      // values on the thresholds of the scales around absmax / 1.5 and absmax
      const float s = e4m3_decode(e4m3_encode(1.0f));
      for (size_t i = 0; i < x.size(); ++i) {
        const float t[] = {s, -s, 0.5f * s, -0.5f * s, 0.0f, -0.0f, 1.5f * s};
        x[i] = t[i % 7];
      }
      break;
    }
    default:
      break;
  }
  return x;
}

template <int B>
void expect_same_as_reference(int rows, uint32_t seed) {
  SCOPED_TRACE(B);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(0.0f, 3.0f);
  for (int r = 0; r < rows; ++r) {
    const std::vector<float> x = residual_row(B, r, rng);
    std::vector<float> w(static_cast<size_t>(B));
    for (float& v : w) v = u(rng);
    for (const float* weights : {static_cast<const float*>(nullptr), static_cast<const float*>(w.data())}) {
      BlockQ2Sym<B> want{};
      const float want_err = q2sym_quantize_ref<B>(x.data(), weights, &want);
      uint8_t got[sizeof(BlockQ2Sym<B>)];
      const float got_err = span_quantize_residual(x.data(), weights, B, got);
      ASSERT_EQ(std::memcmp(got, &want, sizeof(want)), 0) << "row " << r << (weights ? " weighted" : "");
      uint32_t a, b;
      std::memcpy(&a, &got_err, 4);
      std::memcpy(&b, &want_err, 4);
      ASSERT_EQ(a, b) << "row " << r << ": error " << got_err << " vs " << want_err;
    }
  }
}

TEST(ResidualSearch, SameBlocksAndErrorsAsTheReferenceBitForBit) {
  expect_same_as_reference<16>(4000, 1);
  expect_same_as_reference<32>(4000, 2);
  expect_same_as_reference<64>(4000, 3);
  expect_same_as_reference<128>(2000, 4);
}

}  // namespace
}  // namespace wm
