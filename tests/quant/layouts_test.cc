#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "quant/kv_layouts.h"
#include "quant/span_tiles.h"
#include "tests/quant/test_util.h"

namespace wm {
namespace {

TEST(Layouts, TwoBitCodesPackAndUnpackAtEveryPosition) {
  uint8_t codes[8] = {};
  std::mt19937 rng(1);
  std::vector<int> want(32);
  for (int round = 0; round < 50; ++round) {
    for (int i = 0; i < 32; ++i) {
      want[static_cast<size_t>(i)] = static_cast<int>(rng() % 4);
      q2_set(codes, i, want[static_cast<size_t>(i)]);
    }
    for (int i = 0; i < 32; ++i) ASSERT_EQ(q2_get(codes, i), want[static_cast<size_t>(i)]);
  }
  // the documented bit order: code i at bits 2*(i%4) of byte i/4
  uint8_t b[1] = {0};
  q2_set(b, 2, 3);
  EXPECT_EQ(b[0], 0x30);
}

TEST(Layouts, TraitsTableSizesAndBits) {
  struct Want {
    const char* name;
    int values, bytes;
    double bits;
  };
  const Want want[] = {{"q2asym32", 32, 12, 3.0},   {"q2asym64", 64, 20, 2.5},    {"q2asym128", 128, 36, 2.25},
                       {"q2sym16", 16, 5, 2.5},     {"q2sym32", 32, 9, 2.25},     {"q2sym64", 64, 17, 2.125},
                       {"q2sym128", 128, 33, 2.0625}, {"psac8i8", 8, 10, 10.0},   {"psac8i4", 8, 6, 6.0}};
  ASSERT_EQ(kv_block_traits().size(), std::size(want));
  for (const Want& w : want) {
    const KvBlockTraits* t = kv_block_traits(w.name);
    ASSERT_NE(t, nullptr) << w.name;
    EXPECT_EQ(t->values, w.values) << w.name;
    EXPECT_EQ(t->bytes, w.bytes) << w.name;
    EXPECT_DOUBLE_EQ(t->bits_per_value, w.bits) << w.name;
  }
  EXPECT_EQ(kv_block_traits("nope"), nullptr);
}

// every block type: quantize -> dequantize stays within its error budget
// (relative L2 over many Gaussian blocks), and quantizing a dequantized block
// reproduces it exactly (the codes are a fixed point)
TEST(Layouts, ReferenceRoundTripsWithinBudget) {
  std::mt19937 rng(3);
  for (const KvBlockTraits& t : kv_block_traits()) {
    const double budget = t.name[0] == 'p' ? (t.bits_per_value > 8 ? 0.01 : 0.2) : 0.55;
    std::vector<uint8_t> blk(static_cast<size_t>(t.bytes)), blk2(blk.size());
    double num = 0, den = 0;
    for (int r = 0; r < 200; ++r) {
      auto x = testing_util::randn(static_cast<size_t>(t.values), rng, 2.0f);
      std::vector<float> y(x.size()), z(x.size());
      t.quantize_ref(x.data(), blk.data());
      t.dequantize_ref(blk.data(), y.data());
      for (size_t i = 0; i < x.size(); ++i) {
        num += (y[i] - x[i]) * (y[i] - x[i]);
        den += x[i] * x[i];
      }
      t.quantize_ref(y.data(), blk2.data());
      t.dequantize_ref(blk2.data(), z.data());
      for (size_t i = 0; i < x.size(); ++i) ASSERT_NEAR(z[i], y[i], 1e-6f * (1 + std::fabs(y[i]))) << t.name;
    }
    EXPECT_LT(std::sqrt(num / den), budget) << t.name;
  }
}

TEST(Layouts, AsymmetricBlockIsExactOnFourLevelsAndConstants) {
  float x[32], y[32];
  for (int i = 0; i < 32; ++i) x[i] = -1.0f + 0.5f * static_cast<float>(i % 4);  // min -1, scale 0.5
  BlockQ2Asym<32> b;
  q2asym_quantize_ref<32>(x, &b);
  q2asym_dequantize_ref<32>(b, y);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(y[i], x[i]);
  for (float& v : x) v = 2.5f;
  q2asym_quantize_ref<32>(x, &b);
  q2asym_dequantize_ref<32>(b, y);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(y[i], 2.5f);
}

TEST(Layouts, SymmetricBlockScaleSearchBeatsAbsmaxAndHandlesZeros) {
  std::mt19937 rng(5);
  double err_search = 0, err_absmax = 0;
  for (int r = 0; r < 200; ++r) {
    auto x = testing_util::randn(64, rng);
    BlockQ2Sym<64> b;
    err_search += q2sym_quantize_ref<64>(x.data(), nullptr, &b);
    float amax = 0;
    for (float v : x) amax = std::max(amax, std::fabs(v));
    const float s = e4m3_decode(e4m3_encode(amax / 1.5f));
    for (float v : x) {
      const float d = v - q2sym_level(q2sym_code(v, s, false), s, 1.5f);
      err_absmax += d * d;
    }
  }
  EXPECT_LT(err_search, 0.9 * err_absmax);
  float zeros[64] = {}, out[64];
  BlockQ2Sym<64> b;
  EXPECT_EQ(q2sym_quantize_ref<64>(zeros, nullptr, &b), 0.0f);
  q2sym_dequantize_ref<64>(b, out);
  for (float v : out) EXPECT_EQ(v, 0.0f);
}

TEST(Layouts, WeightedSearchFavoursHeavyChannels) {
  // the error on a channel with weight 100 shrinks when the weights are used
  std::mt19937 rng(9);
  double heavy_w = 0, heavy_u = 0;
  std::vector<float> w(32, 1.0f);
  w[0] = 100.0f;
  for (int r = 0; r < 300; ++r) {
    auto x = testing_util::randn(32, rng);
    BlockQ2Sym<32> bw, bu;
    q2sym_quantize_ref<32>(x.data(), w.data(), &bw);
    q2sym_quantize_ref<32>(x.data(), nullptr, &bu);
    float yw[32], yu[32];
    q2sym_dequantize_ref<32>(bw, yw);
    q2sym_dequantize_ref<32>(bu, yu);
    heavy_w += (yw[0] - x[0]) * (yw[0] - x[0]);
    heavy_u += (yu[0] - x[0]) * (yu[0] - x[0]);
  }
  EXPECT_LT(heavy_w, heavy_u);
}

TEST(Layouts, NonFiniteInputsAreSanitized) {
  float x[64];
  for (int i = 0; i < 64; ++i) x[i] = 0.1f * static_cast<float>(i % 7);
  x[3] = NAN;
  x[9] = INFINITY;
  x[10] = -INFINITY;
  BlockQ2Sym<64> s;
  q2sym_quantize_ref<64>(x, nullptr, &s);
  BlockQ2Asym<64> a;
  q2asym_quantize_ref<64>(x, &a);
  float y[64], z[64];
  q2sym_dequantize_ref<64>(s, y);
  q2asym_dequantize_ref<64>(a, z);
  for (int i = 0; i < 64; ++i) {
    EXPECT_TRUE(std::isfinite(y[i]));
    EXPECT_TRUE(std::isfinite(z[i]));
  }
  float alpha[8] = {1, 2, NAN, INFINITY, -3, 0, 0, 0}, back[8];
  PsacCoeffsI8<8> c;
  psac_quantize_ref(alpha, &c);
  psac_dequantize_ref(c, back);
  for (float v : back) EXPECT_TRUE(std::isfinite(v));
}

TEST(Layouts, Int4CoefficientsKeepTheirSigns) {
  float alpha[8] = {7, -7, 3, -3, 1, -1, 0, -6}, back[8];
  PsacCoeffsI4<8> c;
  psac_quantize_ref(alpha, &c);
  psac_dequantize_ref(c, back);
  for (int i = 0; i < 8; ++i) EXPECT_NEAR(back[i], alpha[i], 0.01f) << i;
}

TEST(Layouts, FusedTokenDequantMatchesReference) {
  // the AVX2 tile loader against the scalar reference, B = 16..128
  std::mt19937 rng(11);
  auto check = [&](auto block_tag) {
    constexpr int B = decltype(block_tag)::value;
    const int d = 128;
    auto x = testing_util::randn(d, rng, 1.5f);
    auto c = testing_util::randn(d, rng);
    std::vector<uint16_t> ch(d);
    for (int i = 0; i < d; ++i) ch[static_cast<size_t>(i)] = f32_to_f16(c[static_cast<size_t>(i)]);
    std::vector<BlockQ2Sym<B>> blocks(d / B);
    for (int b = 0; b < d / B; ++b) q2sym_quantize_ref<B>(x.data() + b * B, nullptr, &blocks[static_cast<size_t>(b)]);
    std::vector<float> fast(d), ref(d);
    q2sym_token_dequant<B>(reinterpret_cast<const uint8_t*>(blocks.data()), ch.data(), d, fast.data());
    for (int b = 0; b < d / B; ++b) q2sym_dequantize_ref<B>(blocks[static_cast<size_t>(b)], ref.data() + b * B);
    for (int i = 0; i < d; ++i) EXPECT_FLOAT_EQ(fast[static_cast<size_t>(i)], ref[static_cast<size_t>(i)] + f16_to_f32(ch[static_cast<size_t>(i)])) << B;
  };
  check(std::integral_constant<int, 16>{});
  check(std::integral_constant<int, 32>{});
  check(std::integral_constant<int, 64>{});
  check(std::integral_constant<int, 128>{});
}

}  // namespace
}  // namespace wm
