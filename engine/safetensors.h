// Safetensors reading (validated; tensors read on demand) and writing.
//
// Every check a hostile or damaged file can fail returns an error naming the
// file, the tensor and the reason: header length, JSON syntax and nesting,
// dtype, shape overflow, offsets inside the data area, sizes matching
// dtype x shape, and no two tensors overlapping.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/statusor.h"

namespace wm {

enum class DType : int32_t { f32 = 0, f16 = 1, bf16 = 2, u8 = 3, i32 = 4, i64 = 5 };

absl::string_view dtype_name(DType d);       // safetensors spelling: "F32", ...
size_t dtype_size(DType d);

// a name read from a file, as an error quotes it: escaped and cut short (a
// hostile file's names can be megabytes long and hold terminal escapes)
std::string quote_tensor_name(absl::string_view name);

struct TensorView {
  std::string name;
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  uint64_t offset = 0;             // of its first byte, within the data area
  size_t bytes = 0;
  int64_t numel() const;
};

class SafetensorsFile {
 public:
  // reads and validates the header; tensors are read by read_f32 / read_bytes
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> open(const std::string& path);
  // validates an in-memory image (copied); `source` names it in errors
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> parse(absl::string_view bytes, std::string source);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& source() const { return source_; }
  const std::vector<TensorView>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const TensorView* find(absl::string_view name) const;

  // the checks read_f32 makes, without reading: present, this shape, a float dtype
  absl::Status check_f32(absl::string_view name, const std::vector<int64_t>& expected_shape) const;
  // copies a tensor into fp32 after checking its shape; errors name file and tensor
  absl::Status read_f32(absl::string_view name, const std::vector<int64_t>& expected_shape, float* out) const;
  // a tensor's raw bytes (t.bytes of them); a file cut short since it was
  // opened is a DataLossError, not a crash
  absl::Status read_bytes(const TensorView& t, uint8_t* out) const {
    return read_at(data_begin_ + t.offset, t.bytes, out);
  }

 private:
  SafetensorsFile() = default;
  absl::Status init(absl::string_view header, uint64_t data_size);
  absl::Status read_at(uint64_t offset, uint64_t n, uint8_t* out) const;

  std::string source_;
  int fd_ = -1;           // the file, or
  std::string owned_;     // the image parse() was given
  uint64_t data_begin_ = 0;
  std::vector<TensorView> tensors_;
  std::map<std::string, std::string> metadata_;
};

struct TensorToWrite {
  std::string name;
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  const void* data = nullptr;  // dtype x shape bytes
};

absl::Status write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                               const std::map<std::string, std::string>& metadata = {});

// converts `count` values of dtype `d` to fp32
void convert_to_f32(DType d, const void* src, int64_t count, float* out);

}  // namespace wm
