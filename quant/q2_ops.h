// The arithmetic of the 2-bit symmetric residual block (kv_layouts.h:
// BlockQ2Sym) that the CPU coder and its device twin (cuda/span_encode.cu)
// share: the NaN guard, the code packing, the level sets and the scale
// search. Host and device; the units that quantize with it are built without
// fused multiply-adds on both sides (quant/CMakeLists.txt, cuda/CMakeLists.txt),
// so both sides choose the same scale and codes bit for bit.
#pragma once

#include <cmath>
#include <cstdint>

#include "quant/fp8_e4m3.h"

namespace wm {

// largest finite fp16; every quantized format clamps its inputs to it
inline constexpr float kF16Max = 65504.0f;

// the NaN guard of every quantized format: NaN becomes 0 and anything beyond
// fp16's range (infinity included) is clamped, so one bad value can neither
// poison the scales of its neighbours nor reach the softmax
WM_HD inline float kv_sanitize(float x) {
  if (x != x) return 0.0f;
  return x < -kF16Max ? -kF16Max : (x > kF16Max ? kF16Max : x);  // std::min / std::max, -0 kept
}

// 2-bit codes, four per byte: code i lives at bits 2*(i%4) of byte i/4
WM_HD inline int q2_get(const uint8_t* codes, int i) { return (codes[i >> 2] >> ((i & 3) * 2)) & 3; }
WM_HD inline void q2_set(uint8_t* codes, int i, int code) {
  const int sh = (i & 3) * 2;
  codes[i >> 2] = static_cast<uint8_t>((codes[i >> 2] & ~(3 << sh)) | ((code & 3) << sh));
}

inline constexpr uint8_t kQ2Ternary = 0x80;  // the scale byte's sign bit

// the level offset of a scale byte: 1.5 (mid-rise) or 1 (ternary)
WM_HD inline float q2sym_offset(uint8_t scale) { return (scale & kQ2Ternary) ? 1.0f : 1.5f; }
WM_HD inline float q2sym_scale(uint8_t scale) { return e4m3_decode(static_cast<uint8_t>(scale & 0x7f)); }

WM_HD inline int q2sym_code(float v, float s, bool ternary) {
  if (ternary) return v >= 0.5f * s ? 2 : (v > -0.5f * s ? 1 : 0);
  return v >= s ? 3 : (v >= 0.0f ? 2 : (v >= -s ? 1 : 0));
}
WM_HD inline float q2sym_level(int code, float s, float offset) { return (static_cast<float>(code) - offset) * s; }

// the pieces of q2sym_quantize_bytes that a search trying its candidates
// otherwise (span_codec.cc: side by side) shares with it:
// xs = the sanitized values; returns their absmax, *zero_err the error of
// coding them all as 0 (weighted: w may be null)
WM_HD inline float q2sym_prepare(const float* x, const float* w, int B, float* xs, float* zero_err) {
  float amax = 0.0f;
  for (int i = 0; i < B; ++i) {
    xs[i] = kv_sanitize(x[i]);
    const float a = fabsf(xs[i]);
    amax = amax < a ? a : amax;
  }
  float err = 0.0f;
  for (int i = 0; i < B; ++i) err += (w != nullptr ? w[i] : 1.0f) * xs[i] * xs[i];
  *zero_err = err;
  return amax;
}

// the fp8 codes a level set tries, from *hi down to *lo: one fp8 step above
// the absmax scale (absmax / 1.5 for mid-rise, absmax for ternary) down to
// five below (clip ratios ~1.07 .. 0.55); amax > 0
WM_HD inline void q2sym_candidates(float amax, bool ternary, int* hi, int* lo) {
  const int c0 = e4m3_encode(ternary ? amax : amax / 1.5f);
  *hi = c0 + 1 < kE4m3MaxCode ? c0 + 1 : kE4m3MaxCode;
  *lo = c0 - 5 > 1 ? c0 - 5 : 1;
}

// the block of the chosen scale byte (0: none, every value decodes to 0)
WM_HD inline void q2sym_write(const float* xs, int B, uint8_t best, uint8_t* blk) {
  const float s = q2sym_scale(best);
  const bool ternary = (best & kQ2Ternary) != 0;
  // code i at bits 2 (i % 4) of byte i / 4 (q2_set's order), a byte at a time;
  // scale 0 decodes every code to 0 in the ternary set only: code 1 there
  for (int j = 0; j < B / 4; ++j) {
    int packed = 0;
    for (int q = 0; q < 4; ++q) packed |= (best == 0 ? 1 : q2sym_code(xs[4 * j + q], s, ternary)) << (2 * q);
    blk[1 + j] = static_cast<uint8_t>(packed);
  }
  blk[0] = best == 0 ? kQ2Ternary : best;
}

// quantizes B <= MaxB values into blk (the scale byte, then B/4 code bytes:
// BlockQ2Sym<B>'s bytes) with the level set and fp8 scale (among the few
// around absmax / 1.5 for mid-rise, absmax for ternary) that minimise the
// weighted squared error sum w_i (x_i - q_i)^2; w may be null (uniform).
// Returns that error. Ties keep the earlier candidate: mid-rise first, larger
// scales first.
template <int MaxB>
WM_HD inline float q2sym_quantize_bytes(const float* x, const float* w, int B, uint8_t* blk) {
  float xs[MaxB];
  float best_err;
  const float amax = q2sym_prepare(x, w, B, xs, &best_err);
  uint8_t best = 0;
  if (amax > 0.0f) {
    for (int mode = 0; mode < 2; ++mode) {
      const bool ternary = mode == 1;
      int hi, lo;
      q2sym_candidates(amax, ternary, &hi, &lo);
      for (int c = hi; c >= lo; --c) {
        const float s = e4m3_decode(static_cast<uint8_t>(c));
        const float off = ternary ? 1.0f : 1.5f;
        float err = 0.0f;
        for (int i = 0; i < B; ++i) {
          const float d = xs[i] - q2sym_level(q2sym_code(xs[i], s, ternary), s, off);
          err += (w != nullptr ? w[i] : 1.0f) * d * d;
        }
        if (err < best_err) {
          best_err = err;
          best = static_cast<uint8_t>(c | (ternary ? kQ2Ternary : 0));
        }
      }
    }
  }
  q2sym_write(xs, B, best, blk);
  return best_err;
}

// decodes the B values of a block written by q2sym_quantize_bytes
WM_HD inline void q2sym_dequantize_bytes(const uint8_t* blk, int B, float* x) {
  const float s = q2sym_scale(blk[0]), off = q2sym_offset(blk[0]);
  for (int i = 0; i < B; ++i) x[i] = q2sym_level(q2_get(blk + 1, i), s, off);
}

}  // namespace wm
