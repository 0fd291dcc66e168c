#include "sim/npy.h"

#include <bit>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"

namespace wm::sim {

// the data is written in host order and declared little-endian
static_assert(std::endian::native == std::endian::little, "the npy writer assumes a little-endian host");

namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicLen = 6;
constexpr size_t kPreludeLen = kMagicLen + 2 + 2;  // magic, version, header length
constexpr size_t kAlign = 64;

absl::StatusOr<size_t> element_count(const std::vector<int64_t>& shape) {
  size_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return absl::InvalidArgumentError(absl::StrCat("npy shape has a negative dimension ", d));
    if (d != 0 && n > (size_t{1} << 48) / static_cast<size_t>(d)) return absl::InvalidArgumentError("npy array too large");
    n *= static_cast<size_t>(d);
  }
  return n;
}

// a truncated array is worse than none (but never remove a device or a link's target)
void remove_partial(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_regular_file(std::filesystem::symlink_status(path, ec))) std::filesystem::remove(path, ec);
}

}  // namespace

size_t npy_dtype_size(NpyDtype dtype) { return dtype == NpyDtype::kUint8 ? 1 : 4; }
const char* npy_descr(NpyDtype dtype) { return dtype == NpyDtype::kUint8 ? "|u1" : "<f4"; }

std::string npy_header(NpyDtype dtype, const std::vector<int64_t>& shape) {
  std::string dict = absl::StrCat("{'descr': '", npy_descr(dtype), "', 'fortran_order': False, 'shape': (");
  for (size_t i = 0; i < shape.size(); ++i) absl::StrAppend(&dict, i ? ", " : "", shape[i]);
  // a one-element tuple needs its trailing comma in Python
  absl::StrAppend(&dict, shape.size() == 1 ? ",), }" : "), }");
  const size_t unpadded = kPreludeLen + dict.size() + 1;  // +1 for the newline
  const size_t padded = (unpadded + kAlign - 1) / kAlign * kAlign;
  dict.append(padded - unpadded, ' ');
  dict.push_back('\n');
  const size_t header_len = dict.size();
  std::string out(kMagic, kMagicLen);
  out.push_back('\x01');
  out.push_back('\x00');
  out.push_back(static_cast<char>(header_len & 0xff));
  out.push_back(static_cast<char>((header_len >> 8) & 0xff));
  out += dict;
  return out;
}

absl::StatusOr<NpyHeader> npy_parse_header(std::string_view file) {
  if (file.size() < kPreludeLen || file.substr(0, kMagicLen) != std::string_view(kMagic, kMagicLen)) {
    return absl::InvalidArgumentError("not an npy file (bad magic)");
  }
  if (file[6] != 1 || file[7] != 0) return absl::InvalidArgumentError("npy version is not 1.0");
  const size_t len = static_cast<uint8_t>(file[8]) | (static_cast<size_t>(static_cast<uint8_t>(file[9])) << 8);
  if (file.size() < kPreludeLen + len) return absl::InvalidArgumentError("npy header is truncated");
  std::string_view dict = file.substr(kPreludeLen, len);
  if (dict.empty() || dict.back() != '\n') return absl::InvalidArgumentError("npy header does not end in a newline");
  NpyHeader h;
  h.data_offset = kPreludeLen + len;
  if (dict.find("'fortran_order': False") == std::string_view::npos) {
    return absl::InvalidArgumentError("npy array is not C-order");
  }
  if (dict.find("'descr': '|u1'") != std::string_view::npos) {
    h.dtype = NpyDtype::kUint8;
  } else if (dict.find("'descr': '<f4'") != std::string_view::npos) {
    h.dtype = NpyDtype::kFloat32;
  } else {
    return absl::InvalidArgumentError("npy dtype is neither |u1 nor <f4");
  }
  const size_t open = dict.find("'shape': (");
  if (open == std::string_view::npos) return absl::InvalidArgumentError("npy header has no shape");
  const size_t start = open + 10;
  const size_t close = dict.find(')', start);
  if (close == std::string_view::npos) return absl::InvalidArgumentError("npy shape is not closed");
  // comma-separated non-negative integers; a trailing comma is allowed (one-element tuples)
  std::string_view rest = dict.substr(start, close - start);
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    std::string_view tok = rest.substr(0, comma);
    rest = comma == std::string_view::npos ? std::string_view() : rest.substr(comma + 1);
    while (!tok.empty() && tok.front() == ' ') tok.remove_prefix(1);
    while (!tok.empty() && tok.back() == ' ') tok.remove_suffix(1);
    if (tok.empty()) {
      if (!rest.empty()) return absl::InvalidArgumentError("empty npy dimension");
      continue;
    }
    int64_t d = 0;
    const auto [end, ec] = std::from_chars(tok.data(), tok.data() + tok.size(), d);
    if (ec != std::errc() || end != tok.data() + tok.size() || d < 0) {
      return absl::InvalidArgumentError(absl::StrCat("bad npy dimension '", std::string(tok), "'"));
    }
    h.shape.push_back(d);
  }
  return h;
}

absl::Status npy_write(const std::string& path, NpyDtype dtype, const std::vector<int64_t>& shape, const void* data) {
  auto count = element_count(shape);
  if (!count.ok()) return count.status();
  NpyWriter w;
  if (auto st = w.open(path, dtype, shape); !st.ok()) return st;
  if (auto st = w.append(data, *count * npy_dtype_size(dtype)); !st.ok()) return st;
  return w.finish();
}

NpyWriter::~NpyWriter() {
  if (file_ != nullptr) abandon(0).IgnoreError();
}

absl::Status NpyWriter::open(const std::string& path, NpyDtype dtype, const std::vector<int64_t>& shape) {
  if (file_ != nullptr) return absl::FailedPreconditionError("npy writer is already open");
  auto count = element_count(shape);
  if (!count.ok()) return count.status();
  file_ = std::fopen(path.c_str(), "wb");
  if (file_ == nullptr) return absl::UnavailableError(absl::StrCat("cannot create ", path));
  path_ = path;
  expected_ = *count * npy_dtype_size(dtype);
  written_ = 0;
  const std::string header = npy_header(dtype, shape);
  if (std::fwrite(header.data(), 1, header.size(), file_) != header.size()) return abandon(errno);
  return absl::OkStatus();
}

absl::Status NpyWriter::append(const void* data, size_t bytes) {
  if (file_ == nullptr) return absl::FailedPreconditionError("npy writer is not open");
  if (bytes > expected_ - written_) {
    return absl::OutOfRangeError(absl::StrCat(path_, ": more data than the declared shape holds"));
  }
  if (bytes > 0 && std::fwrite(data, 1, bytes, file_) != bytes) return abandon(errno);
  written_ += bytes;
  return absl::OkStatus();
}

absl::Status NpyWriter::finish() {
  if (file_ == nullptr) return absl::FailedPreconditionError("npy writer is not open");
  if (written_ != expected_) {
    abandon(0).IgnoreError();
    return absl::DataLossError(absl::StrCat(path_, ": wrote ", written_, " of ", expected_, " data bytes"));
  }
  // buffered bytes reach the file only here: a full disk shows at the flush
  errno = 0;
  if (std::fflush(file_) != 0) return abandon(errno);
  const bool closed = std::fclose(file_) == 0;
  file_ = nullptr;
  if (!closed) {
    const int err = errno;
    remove_partial(path_);
    return absl::DataLossError(absl::StrCat("write failed: ", path_, ": ", std::strerror(err)));
  }
  return absl::OkStatus();
}

absl::Status NpyWriter::abandon(int err) {
  std::fclose(file_);
  file_ = nullptr;
  remove_partial(path_);
  return absl::DataLossError(
      absl::StrCat("write failed: ", path_, ": ", err != 0 ? std::strerror(err) : "incomplete"));
}

}  // namespace wm::sim
