// Image encode/decode through libjpeg-turbo, and a minimal PPM/PNG-free path:
// frames are RGB8, row-major, 3 bytes per pixel.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace wm {

struct Rgb8Image {
  int width = 0;
  int height = 0;
  std::vector<uint8_t> pixels;  // [height, width, 3]
};

// quality 1..100
absl::StatusOr<std::string> jpeg_encode(const uint8_t* rgb, int width, int height, int quality);
// rejects images larger than max_pixels before allocating
absl::StatusOr<Rgb8Image> jpeg_decode(const void* data, size_t size, int64_t max_pixels = 4096 * 4096);

// every byte reaches the file or the error says why: "write failed: PATH: reason"
// (a regular file left partly written is removed)
absl::Status write_file(const std::string& path, const void* data, size_t size);
// stdout's buffered output, flushed; the same message for stdout
absl::Status flush_stdout();
absl::StatusOr<std::string> read_file(const std::string& path, size_t max_bytes = size_t{1} << 32);

}  // namespace wm
