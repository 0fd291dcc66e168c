#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "quant/fp8_e4m3.h"

namespace wm {
namespace {

// an independent oracle: the value of a code from its fields with ldexp
double code_value(int c) {
  const int e = (c >> 3) & 15, m = c & 7;
  const double v = e == 0 ? std::ldexp(m, -9) : std::ldexp(1.0 + m / 8.0, e - 7);
  return (c & 0x80) ? -v : v;
}

// nearest non-negative finite code by brute force, ties to the even code, saturating
int oracle_encode_abs(double a) {
  if (a >= 448.0) return 0x7e;
  int best = 0;
  double bd = INFINITY;
  for (int c = 0; c <= 0x7e; ++c) {
    const double d = std::fabs(code_value(c) - a);
    if (d < bd || (d == bd && (c & 1) == 0)) {
      bd = d;
      best = c;
    }
  }
  return best;
}

TEST(E4m3, EveryCodeDecodesToItsValueAndRoundTrips) {
  for (int c = 0; c < 256; ++c) {
    const float v = e4m3_decode(static_cast<uint8_t>(c));
    if ((c & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(v)) << c;
      EXPECT_EQ(e4m3_encode(v) & 0x7f, 0x7f);
      continue;
    }
    EXPECT_EQ(static_cast<double>(v), code_value(c)) << c;
    const uint8_t back = e4m3_encode(v);
    if (c == 0x80) {
      EXPECT_EQ(back, 0x80);  // -0 keeps its sign
    } else {
      EXPECT_EQ(back, c) << c;
    }
  }
  EXPECT_EQ(e4m3_decode(0x7e), 448.0f);
  EXPECT_EQ(e4m3_decode(0x01), std::ldexp(1.0f, -9));
}

TEST(E4m3, EncodeMatchesBruteForceOracleOnAFloatSweep) {
  // every float whose exponent lies in [2^-12, 2^10) with the top 10 of its
  // mantissa bits swept, plus the exact midpoints between adjacent codes and
  // their neighbours one ulp away
  std::vector<float> xs;
  for (int e = -12; e < 10; ++e)
    for (int m = 0; m < 1024; ++m) xs.push_back(std::ldexp(1.0f + m / 1024.0f, e));
  for (int c = 0; c < 0x7e; ++c) {
    const float mid = static_cast<float>((code_value(c) + code_value(c + 1)) / 2);
    xs.push_back(mid);
    xs.push_back(std::nextafter(mid, 0.0f));
    xs.push_back(std::nextafter(mid, 1e9f));
  }
  xs.push_back(0.0f);
  xs.push_back(1e-30f);
  xs.push_back(448.0f);
  xs.push_back(460.0f);
  xs.push_back(1e6f);
  xs.push_back(INFINITY);
  for (float x : xs) {
    const int expect = oracle_encode_abs(static_cast<double>(x));
    EXPECT_EQ(e4m3_encode(x), expect) << x;
    EXPECT_EQ(e4m3_encode(-x), expect | 0x80) << -x;
  }
}

}  // namespace
}  // namespace wm
