// fp16 <-> fp32 rows on the CPU (F16C where the build has it), shared by the
// tile loaders of every format.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "common/half.h"

namespace wm {

inline void load_row(const float* src, float* dst, int n) { std::copy(src, src + n, dst); }

inline void load_row(const uint16_t* src, float* dst, int n) {
  int i = 0;
#if defined(__F16C__)
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
#endif
  for (; i < n; ++i) dst[i] = f16_to_f32(src[i]);
}

inline void store_row(const float* src, uint16_t* dst, int n) {
  for (int i = 0; i < n; ++i) dst[i] = f32_to_f16(src[i]);
}

}  // namespace wm
