// Every quantized KV layout, defined once (STYLE 4). The block structs are
// plain, host- and device-compatible, and their sizes are asserted; the
// reference quantize/dequantize functions below are the scalar oracles the
// fused CPU tile loaders (and later CUDA kernels) are tested against.
//
// Per-span side data that is not a block (docs/QUANT.md has worked examples):
//   ids        u8 per token and quantized side          8 / head_dim bits per value
//   centroids  fp16 [k, head_dim] per (span, head, side) 16 k / span_tokens bits per value
//   basis      fp16 [r, head_dim] per (basis, head)     shared by the spans quantized with it
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>

#include "absl/strings/string_view.h"
#include "common/half.h"
#include "quant/fp8_e4m3.h"
#include "quant/q2_ops.h"

namespace wm {

// KIVI: 2-bit asymmetric min-max over G values, fp16 scale and zero point.
// x = zero + code * scale, scale = (max - min) / 3, zero = min.
// bits per value: 2 + 32/G (G=32: 3.0, G=64: 2.5, G=128: 2.25)
template <int G>
struct BlockQ2Asym {
  static constexpr int kValues = G;
  uint16_t scale;        // fp16
  uint16_t zero;         // fp16
  uint8_t codes[G / 4];  // 2-bit, see q2_get
};
static_assert(sizeof(BlockQ2Asym<32>) == 12, "kivi block, G=32");
static_assert(sizeof(BlockQ2Asym<64>) == 20, "kivi block, G=64");
static_assert(sizeof(BlockQ2Asym<128>) == 36, "kivi block, G=128");

// QVG / QuantWM residual: 2-bit symmetric code with an fp8 e4m3 scale over B
// channels of one token. The scale's sign bit (a scale is never negative)
// selects the level set: clear, mid-rise levels (code - 1.5) * s, all four
// codes used; set, ternary levels (code - 1) * s with codes 0..2, QVG's
// released choice, which keeps an exact zero for channels whose residual is
// nil (constant channels the centroid already holds). The quantizer picks
// whichever has the smaller error.
// bits per value: 2 + 8/B (B=16: 2.5, B=32: 2.25, B=64: 2.125, B=128: 2.0625)
template <int B>
struct BlockQ2Sym {
  static constexpr int kValues = B;
  uint8_t scale;         // fp8 e4m3 magnitude; sign bit: ternary level set
  uint8_t codes[B / 4];  // 2-bit, see q2_get
};
static_assert(sizeof(BlockQ2Sym<16>) == 5, "residual block, B=16");
static_assert(sizeof(BlockQ2Sym<32>) == 9, "residual block, B=32");
static_assert(sizeof(BlockQ2Sym<64>) == 17, "residual block, B=64");
static_assert(sizeof(BlockQ2Sym<128>) == 33, "residual block, B=128");

// PSAC: the R coefficients of one key's remaining error along the basis,
// symmetric int8 with an fp16 scale: alpha_i = c_i * scale.
// bits per key value: (8R + 16) / head_dim (R=8: 1.25 at head_dim 64, 0.625 at 128)
template <int R>
struct PsacCoeffsI8 {
  static constexpr int kRank = R;
  static constexpr int kBits = 8;
  uint16_t scale;  // fp16
  int8_t c[R];     // in [-127, 127]
};
static_assert(sizeof(PsacCoeffsI8<8>) == 10, "psac int8 record, r=8");

// the 4-bit option: two's-complement nibbles in [-7, 7], coefficient i in the
// low nibble of byte i/2 when i is even, the high nibble when odd.
// bits per key value: (4R + 16) / head_dim (R=8: 0.75 at head_dim 64, 0.375 at 128)
template <int R>
struct PsacCoeffsI4 {
  static constexpr int kRank = R;
  static constexpr int kBits = 4;
  uint16_t scale;     // fp16
  uint8_t c[R / 2];
};
static_assert(sizeof(PsacCoeffsI4<8>) == 6, "psac int4 record, r=8");

// the PSAC rank the layout is built for (DESIGN §5: r = 8)
inline constexpr int kPsacRank = 8;

// ---- reference quantize / dequantize (host, scalar) ----

template <int G>
inline void q2asym_quantize_ref(const float* x, BlockQ2Asym<G>* b) {
  float lo = kv_sanitize(x[0]), hi = lo;
  for (int i = 1; i < G; ++i) {
    const float v = kv_sanitize(x[i]);
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  b->zero = f32_to_f16(lo);
  b->scale = f32_to_f16((hi - lo) / 3.0f);
  // codes are chosen against the stored (rounded) scale and zero
  const float z = f16_to_f32(b->zero), s = f16_to_f32(b->scale);
  for (int i = 0; i < G / 4; ++i) b->codes[i] = 0;
  for (int i = 0; i < G; ++i) {
    const float v = kv_sanitize(x[i]);
    const int c = s > 0 ? static_cast<int>(std::lround((v - z) / s)) : 0;
    q2_set(b->codes, i, std::min(3, std::max(0, c)));
  }
}

template <int G>
inline void q2asym_dequantize_ref(const BlockQ2Asym<G>& b, float* x) {
  const float z = f16_to_f32(b.zero), s = f16_to_f32(b.scale);
  for (int i = 0; i < G; ++i) x[i] = z + static_cast<float>(q2_get(b.codes, i)) * s;
}

// QuantWM / QVG residual blocks: the arithmetic is q2_ops.h's, shared with
// the device coder; these give it the block types.
template <int B>
inline float q2sym_quantize_ref(const float* x, const float* w, BlockQ2Sym<B>* b) {
  static_assert(sizeof(BlockQ2Sym<B>) == 1 + B / 4, "scale byte, then the codes");
  return q2sym_quantize_bytes<B>(x, w, B, reinterpret_cast<uint8_t*>(b));
}

template <int B>
inline void q2sym_dequantize_ref(const BlockQ2Sym<B>& b, float* x) {
  q2sym_dequantize_bytes(reinterpret_cast<const uint8_t*>(&b), B, x);
}

template <class Coeffs>
inline void psac_quantize_ref(const float* alpha, Coeffs* c) {
  constexpr int R = Coeffs::kRank;
  constexpr int qmax = Coeffs::kBits == 8 ? 127 : 7;
  float amax = 0.0f;
  for (int i = 0; i < R; ++i) amax = std::max(amax, std::fabs(kv_sanitize(alpha[i])));
  c->scale = f32_to_f16(std::min(kF16Max, amax / qmax));
  const float s = f16_to_f32(c->scale);
  for (int i = 0; i < R; ++i) {
    int q = s > 0 ? static_cast<int>(std::lround(kv_sanitize(alpha[i]) / s)) : 0;
    q = std::min(qmax, std::max(-qmax, q));
    if constexpr (Coeffs::kBits == 8) {
      c->c[i] = static_cast<int8_t>(q);
    } else {
      const int sh = (i & 1) * 4;
      if ((i & 1) == 0) c->c[i / 2] = 0;
      c->c[i / 2] = static_cast<uint8_t>(c->c[i / 2] | ((q & 0xf) << sh));
    }
  }
}

template <class Coeffs>
inline int psac_code(const Coeffs& c, int i) {
  if constexpr (Coeffs::kBits == 8) {
    return c.c[i];
  } else {
    const int nib = (c.c[i / 2] >> ((i & 1) * 4)) & 0xf;
    return nib >= 8 ? nib - 16 : nib;
  }
}

template <class Coeffs>
inline void psac_dequantize_ref(const Coeffs& c, float* alpha) {
  const float s = f16_to_f32(c.scale);
  for (int i = 0; i < Coeffs::kRank; ++i) alpha[i] = static_cast<float>(psac_code(c, i)) * s;
}

// ---- traits table ----

struct KvBlockTraits {
  const char* name;       // "q2asym32", "q2sym64", "psac8i8", ...
  int values;             // values (or coefficients) per block
  int bytes;              // sizeof the block
  double bits_per_value;  // 8 * bytes / values
  void (*quantize_ref)(const float* x, void* block);
  void (*dequantize_ref)(const void* block, float* x);
};

std::span<const KvBlockTraits> kv_block_traits();
const KvBlockTraits* kv_block_traits(absl::string_view name);

}  // namespace wm
