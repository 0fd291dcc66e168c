// A small writer (and header reader, for tests and tools) of NumPy .npy files,
// format version 1.0: the magic "\x93NUMPY", version 1.0, a little-endian
// uint16 header length, then a Python dict literal with descr, fortran_order
// and shape, padded with spaces and a final newline so the data starts at a
// multiple of 64 bytes. Data is C-order, little-endian. numpy.load reads the
// files directly.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace wm::sim {

enum class NpyDtype { kUint8, kFloat32 };

size_t npy_dtype_size(NpyDtype dtype);
const char* npy_descr(NpyDtype dtype);  // "|u1" or "<f4"

// the full header (magic to newline) for an array of that dtype and shape
std::string npy_header(NpyDtype dtype, const std::vector<int64_t>& shape);

struct NpyHeader {
  NpyDtype dtype = NpyDtype::kUint8;
  std::vector<int64_t> shape;
  size_t data_offset = 0;  // bytes from the start of the file to the data
};
// parses a version 1.0 header of a C-order uint8 or float32 array
absl::StatusOr<NpyHeader> npy_parse_header(std::string_view file_start);

// writes a whole array; data holds product(shape) elements
absl::Status npy_write(const std::string& path, NpyDtype dtype, const std::vector<int64_t>& shape, const void* data);

// streams an array whose shape is known up front, a chunk at a time, so that
// long renders need not hold every frame in memory. Not copyable. A failed
// write, a failed or short finish() and a destructor before finish() close
// and remove the file, so no truncated array is left behind.
class NpyWriter {
 public:
  NpyWriter() = default;
  ~NpyWriter();
  NpyWriter(const NpyWriter&) = delete;
  NpyWriter& operator=(const NpyWriter&) = delete;

  absl::Status open(const std::string& path, NpyDtype dtype, const std::vector<int64_t>& shape);
  absl::Status append(const void* data, size_t bytes);
  // fails unless exactly the declared number of bytes was appended
  absl::Status finish();

 private:
  // closes and removes the file; the error of a failed write (errno err)
  absl::Status abandon(int err);

  std::FILE* file_ = nullptr;
  std::string path_;
  size_t expected_ = 0;
  size_t written_ = 0;
};

}  // namespace wm::sim
