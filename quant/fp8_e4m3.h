// FP8 E4M3 (the OCP "e4m3fn" variant: 1 sign, 4 exponent bits with bias 7,
// 3 mantissa bits, no infinities, 0x7f/0xff are NaN, largest finite 448,
// smallest subnormal 2^-9). Host and device.
//
// Encoding rounds to nearest, ties to even, and saturates: anything at or
// above 448 in magnitude (infinity included) becomes +-448; NaN stays NaN.
#pragma once

#include <cstdint>
#include <cstring>

#include "common/hd.h"

namespace wm {

WM_HD inline uint32_t f32_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t b;
  std::memcpy(&b, &x, 4);
  return b;
#endif
}

WM_HD inline float f32_from_bits(uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(b);
#else
  float x;
  std::memcpy(&x, &b, 4);
  return x;
#endif
}

inline constexpr float kE4m3Max = 448.0f;
inline constexpr uint8_t kE4m3MaxCode = 0x7e;

WM_HD inline uint8_t e4m3_encode(float x) {
  const uint32_t b = f32_bits(x);
  const uint8_t sign = static_cast<uint8_t>((b >> 24) & 0x80u);
  const uint32_t a = b & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint8_t>(sign | 0x7fu);          // nan
  if (a >= 0x43e00000u) return static_cast<uint8_t>(sign | kE4m3MaxCode);  // >= 448 (and inf): saturate
  const int e = static_cast<int>(a >> 23) - 127;
  if (e < -6) {
    // subnormal result: |x| * 2^9 is exact in fp32 (or underflows to a value
    // far below the rounding point); round half to even to an integer 0..8,
    // where 8 is exactly the smallest normal's code
    const float y = f32_from_bits(a) * 512.0f;
    uint32_t q = static_cast<uint32_t>(y);
    const float frac = y - static_cast<float>(q);
    if (frac > 0.5f || (frac == 0.5f && (q & 1u))) ++q;
    return static_cast<uint8_t>(sign | q);
  }
  // normal: keep 3 of the 23 mantissa bits, round half to even; a carry
  // into the exponent field is the correct next binade
  const uint32_t mant = a & 0x7fffffu;
  uint32_t r = (static_cast<uint32_t>(e + 7) << 3) | (mant >> 20);
  const uint32_t rem = mant & 0xfffffu;
  if (rem > 0x80000u || (rem == 0x80000u && (r & 1u))) ++r;
  if (r > kE4m3MaxCode) r = kE4m3MaxCode;
  return static_cast<uint8_t>(sign | r);
}

WM_HD inline float e4m3_decode(uint8_t c) {
  const uint32_t sign = static_cast<uint32_t>(c & 0x80u) << 24;
  const uint32_t e = (c >> 3) & 0xfu;
  const uint32_t m = c & 0x7u;
  if (e == 15 && m == 7) return f32_from_bits(sign | 0x7fc00000u);
  if (e == 0) {
    const float v = static_cast<float>(m) * (1.0f / 512.0f);
    return sign != 0 ? -v : v;
  }
  return f32_from_bits(sign | ((e - 7 + 127) << 23) | (m << 20));
}

}  // namespace wm
