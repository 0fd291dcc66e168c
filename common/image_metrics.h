// Frame quality metrics on RGB8 images: PSNR and SSIM (on luma, 8x8 windows
// with stride 4, the usual constants C1 = (0.01 * 255)^2, C2 = (0.03 * 255)^2).
#pragma once

#include <cstddef>
#include <cstdint>

namespace wm {

// the sum of squared differences of two 8-bit images' values
double squared_error_u8(const uint8_t* a, const uint8_t* b, size_t bytes);
// identical images give +infinity; callers cap it for averages
double psnr_rgb8(const uint8_t* a, const uint8_t* b, size_t bytes);
double ssim_rgb8(const uint8_t* a, const uint8_t* b, int width, int height);

}  // namespace wm
