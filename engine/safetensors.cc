#include "engine/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/half.h"
#include "common/json_scan.h"
#include "common/status_macros.h"

namespace wm {
namespace {

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // the reference implementation's limit
constexpr int kMaxJsonDepth = 16;
// about 9 values a tensor: 200k tensors, far above any model (a 256-layer one
// has 4k), in about 250 MB of parsed header at most
constexpr int64_t kMaxJsonValues = int64_t{1} << 21;
constexpr size_t kMaxQuotedName = 64;
constexpr int kMaxDims = 8;

bool parse_dtype(absl::string_view s, DType* d) {
  static const std::pair<absl::string_view, DType> table[] = {
      {"F32", DType::f32}, {"F16", DType::f16}, {"BF16", DType::bf16},
      {"U8", DType::u8},   {"I32", DType::i32}, {"I64", DType::i64}};
  for (const auto& [name, dt] : table) {
    if (s == name) {
      *d = dt;
      return true;
    }
  }
  return false;
}

std::string shape_str(const std::vector<int64_t>& s) { return absl::StrCat("[", absl::StrJoin(s, ", "), "]"); }

}  // namespace

std::string quote_tensor_name(absl::string_view name) { return quote_text(name, kMaxQuotedName); }

absl::string_view dtype_name(DType d) {
  switch (d) {
    case DType::f32: return "F32";
    case DType::f16: return "F16";
    case DType::bf16: return "BF16";
    case DType::u8: return "U8";
    case DType::i32: return "I32";
    case DType::i64: return "I64";
  }
  return "?";
}

size_t dtype_size(DType d) {
  switch (d) {
    case DType::f32: return 4;
    case DType::f16: return 2;
    case DType::bf16: return 2;
    case DType::u8: return 1;
    case DType::i32: return 4;
    case DType::i64: return 8;
  }
  return 0;
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

namespace {

// the little-endian length before the header, checked against the file's
// size (first8: the file's first min(size, 8) bytes)
absl::StatusOr<uint64_t> header_length(const std::string& source, const uint8_t* first8, uint64_t size) {
  if (size < 8)
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": file is ", size, " bytes, shorter than the 8-byte header length"));
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | first8[i];
  if (n > kMaxHeaderBytes)
    return absl::InvalidArgumentError(absl::StrCat(source, ": header length ", n, " exceeds the 100 MiB limit"));
  if (n > size - 8)
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": header length ", n, " runs past the end of the ", size, "-byte file (truncated?)"));
  return n;
}

}  // namespace

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::open(const std::string& path) {
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->source_ = path;
  // non-blocking: a FIFO opens at once (and is refused below) instead of
  // waiting forever for a writer
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  f->fd_ = fd;
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  // read, never mapped: a file cut short while it loads (a copy over it) is
  // then a short read and an error, where a mapping's missing pages would be
  // SIGBUS
  uint8_t len[8] = {};
  WM_RETURN_IF_ERROR(f->read_at(0, std::min<uint64_t>(size, 8), len));
  WM_ASSIGN_OR_RETURN(const uint64_t header_len, header_length(path, len, size));
  std::string header(static_cast<size_t>(header_len), '\0');
  WM_RETURN_IF_ERROR(f->read_at(8, header_len, reinterpret_cast<uint8_t*>(header.data())));
  if (auto st2 = f->init(header, size - 8 - header_len); !st2.ok()) return st2;
  return f;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::parse(absl::string_view bytes, std::string source) {
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->source_ = std::move(source);
  f->owned_.assign(bytes.data(), bytes.size());
  const uint64_t size = f->owned_.size();
  WM_ASSIGN_OR_RETURN(const uint64_t header_len,
                      header_length(f->source_, reinterpret_cast<const uint8_t*>(f->owned_.data()), size));
  if (auto st = f->init(absl::string_view(f->owned_).substr(8, header_len), size - 8 - header_len); !st.ok()) return st;
  return f;
}

SafetensorsFile::~SafetensorsFile() {
  if (fd_ >= 0) ::close(fd_);
}

absl::Status SafetensorsFile::read_at(uint64_t offset, uint64_t n, uint8_t* out) const {
  if (fd_ < 0) {
    if (offset > owned_.size() || n > owned_.size() - offset)
      return absl::InternalError(absl::StrCat(source_, ": read past the end of the image"));
    std::memcpy(out, owned_.data() + offset, n);
    return absl::OkStatus();
  }
  uint64_t done = 0;
  while (done < n) {
    const size_t want = static_cast<size_t>(std::min<uint64_t>(n - done, 1u << 30));
    const ssize_t got = ::pread(fd_, out + done, want, static_cast<off_t>(offset + done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0)
      return absl::DataLossError(absl::StrCat(source_, ": read failed at byte ", offset + done, ": ", std::strerror(errno)));
    if (got == 0)
      return absl::DataLossError(absl::StrCat(source_, ": the file ends at byte ", offset + done, ", short of the ",
                                              offset + n, " its header promised (cut short while loading?)"));
    done += static_cast<uint64_t>(got);
  }
  return absl::OkStatus();
}

absl::Status SafetensorsFile::init(absl::string_view header, uint64_t data_size) {
  auto fail = [&](absl::string_view why) { return absl::InvalidArgumentError(absl::StrCat(source_, ": ", why)); };
  data_begin_ = 8 + header.size();
  // the parser takes a NUL for the end of its input: what follows would go unread
  if (const size_t nul = header.find('\0'); nul != absl::string_view::npos)
    return fail(absl::StrCat("header holds a NUL byte at offset ", nul, " (damaged?)"));
  // bounded before a tree is built: the tree costs up to ~100 bytes a
  // value, and nlohmann's callback parser scans every parent on each
  // object's end (quadratic in the number of tensors)
  if (absl::Status st = scan_json(header, {kMaxJsonValues, kMaxJsonDepth}, "header"); !st.ok())
    return fail(st.message());
  nlohmann::json j = nlohmann::json::parse(header, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return fail("header is not valid JSON");
  if (!j.is_object()) return fail("header is not a JSON object");

  struct Range {
    uint64_t begin, end;
    size_t index;
  };
  std::vector<Range> ranges;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    if (name == "__metadata__") {
      if (!it->is_object()) return fail("__metadata__ is not an object");
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string())
          return fail(absl::StrCat("__metadata__ value for ", quote_tensor_name(m.key()), " is not a string"));
        metadata_[m.key()] = m->get<std::string>();
      }
      continue;
    }
    auto tfail = [&](absl::string_view why) { return fail(absl::StrCat("tensor ", quote_tensor_name(name), ": ", why)); };
    const nlohmann::json& e = *it;
    if (!e.is_object()) return tfail("entry is not an object");
    if (!e.contains("dtype") || !e["dtype"].is_string()) return tfail("missing dtype");
    TensorView t;
    t.name = name;
    if (!parse_dtype(e["dtype"].get<std::string>(), &t.dtype))
      return tfail(absl::StrCat("unsupported dtype ", quote_tensor_name(e["dtype"].get<std::string>())));
    if (!e.contains("shape") || !e["shape"].is_array()) return tfail("missing shape");
    if (e["shape"].size() > kMaxDims) return tfail("too many dimensions");
    uint64_t numel = 1;
    for (const auto& d : e["shape"]) {
      if (!d.is_number_unsigned()) return tfail("shape holds a value that is not a non-negative integer");
      const uint64_t v = d.get<uint64_t>();
      if (v > (1ull << 40) || (v != 0 && numel > (1ull << 48) / v)) return tfail("shape is absurdly large");
      numel *= v;
      t.shape.push_back(static_cast<int64_t>(v));
    }
    if (!e.contains("data_offsets") || !e["data_offsets"].is_array() || e["data_offsets"].size() != 2 ||
        !e["data_offsets"][0].is_number_unsigned() || !e["data_offsets"][1].is_number_unsigned())
      return tfail("data_offsets must be two non-negative integers");
    const uint64_t begin = e["data_offsets"][0].get<uint64_t>();
    const uint64_t end = e["data_offsets"][1].get<uint64_t>();
    if (begin > end) return tfail(absl::StrCat("data_offsets [", begin, ", ", end, "] are reversed"));
    if (end > data_size)
      return tfail(absl::StrCat("data_offsets end ", end, " is past the ", data_size, "-byte data area (truncated?)"));
    const uint64_t expect = numel * dtype_size(t.dtype);
    if (end - begin != expect)
      return tfail(absl::StrCat("holds ", end - begin, " bytes but ", dtype_name(t.dtype), " ", shape_str(t.shape),
                                " needs ", expect));
    t.offset = begin;
    t.bytes = static_cast<size_t>(expect);
    ranges.push_back({begin, end, tensors_.size()});
    tensors_.push_back(std::move(t));
  }
  // by start, each against the last non-empty one before it: an empty tensor
  // (which holds no bytes) between two would otherwise hide their overlap
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) { return a.begin < b.begin; });
  const Range* last = nullptr;
  for (const Range& r : ranges) {
    if (r.end == r.begin) continue;
    if (last != nullptr && r.begin < last->end)
      return fail(absl::StrCat("tensors ", quote_tensor_name(tensors_[last->index].name), " and ",
                               quote_tensor_name(tensors_[r.index].name), " overlap"));
    last = &r;
  }
  std::sort(tensors_.begin(), tensors_.end(), [](const TensorView& a, const TensorView& b) { return a.name < b.name; });
  return absl::OkStatus();
}

const TensorView* SafetensorsFile::find(absl::string_view name) const {
  auto it = std::lower_bound(tensors_.begin(), tensors_.end(), name,
                             [](const TensorView& t, absl::string_view n) { return t.name < n; });
  if (it == tensors_.end() || it->name != name) return nullptr;
  return &*it;
}

void convert_to_f32(DType d, const void* src, int64_t count, float* out) {
  switch (d) {
    case DType::f32:
      std::memcpy(out, src, static_cast<size_t>(count) * 4);
      break;
    case DType::f16: {
      const auto* s = static_cast<const uint8_t*>(src);
      for (int64_t i = 0; i < count; ++i) {
        uint16_t h;
        std::memcpy(&h, s + 2 * i, 2);
        out[i] = f16_to_f32(h);
      }
      break;
    }
    case DType::bf16: {
      const auto* s = static_cast<const uint8_t*>(src);
      for (int64_t i = 0; i < count; ++i) {
        uint16_t h;
        std::memcpy(&h, s + 2 * i, 2);
        out[i] = bf16_to_f32(h);
      }
      break;
    }
    default:
      for (int64_t i = 0; i < count; ++i) out[i] = 0.0f;
  }
}

absl::Status SafetensorsFile::read_f32(absl::string_view name, const std::vector<int64_t>& expected_shape,
                                       float* out) const {
  WM_RETURN_IF_ERROR(check_f32(name, expected_shape));
  const TensorView* t = find(name);
  // in pieces: a whole tensor's raw bytes would double its memory for a moment
  const size_t width = dtype_size(t->dtype);
  const int64_t chunk = std::max<int64_t>(1, (int64_t{4} << 20) / static_cast<int64_t>(width));
  std::vector<uint8_t> raw(static_cast<size_t>(std::min<int64_t>(chunk, t->numel())) * width);
  for (int64_t i = 0; i < t->numel(); i += chunk) {
    const int64_t n = std::min(chunk, t->numel() - i);
    WM_RETURN_IF_ERROR(read_at(data_begin_ + t->offset + static_cast<uint64_t>(i) * width,
                               static_cast<uint64_t>(n) * width, raw.data()));
    convert_to_f32(t->dtype, raw.data(), n, out + i);
  }
  return absl::OkStatus();
}

absl::Status SafetensorsFile::check_f32(absl::string_view name, const std::vector<int64_t>& expected_shape) const {
  const TensorView* t = find(name);
  if (t == nullptr) return absl::NotFoundError(absl::StrCat(source_, ": tensor '", name, "' is missing"));
  if (t->shape != expected_shape)
    return absl::InvalidArgumentError(absl::StrCat(source_, ": tensor '", name, "' has shape ", shape_str(t->shape),
                                                   ", the config needs ", shape_str(expected_shape)));
  if (t->dtype != DType::f32 && t->dtype != DType::f16 && t->dtype != DType::bf16)
    return absl::InvalidArgumentError(
        absl::StrCat(source_, ": tensor '", name, "' has dtype ", dtype_name(t->dtype), ", need F32, F16 or BF16"));
  return absl::OkStatus();
}

absl::Status write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                               const std::map<std::string, std::string>& metadata) {
  nlohmann::json header = nlohmann::json::object();
  uint64_t offset = 0;
  for (const auto& t : tensors) {
    uint64_t n = 1;
    for (int64_t d : t.shape) n *= static_cast<uint64_t>(d);
    const uint64_t bytes = n * dtype_size(t.dtype);
    header[t.name] = {{"dtype", std::string(dtype_name(t.dtype))}, {"shape", t.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string h = header.dump();
  while (h.size() % 8 != 0) h.push_back(' ');
  // a new or regular file is written beside its place and renamed there when
  // complete, so that a full disk leaves no truncated checkpoint; a device
  // or a link is written in place
  std::error_code ec;
  const auto st = std::filesystem::symlink_status(path, ec);
  const bool atomic = !std::filesystem::exists(st) || std::filesystem::is_regular_file(st);
  static std::atomic<int> serial{0};
  const std::string target = atomic ? absl::StrCat(path, ".tmp-", getpid(), "-", serial++) : path;
  std::FILE* f = nullptr;
  if (atomic) {
    // a fresh file, never one planted at that name (no link followed); a file
    // it replaces keeps its permission bits
    const int fd = ::open(target.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
    if (fd >= 0 && std::filesystem::exists(st)) (void)::fchmod(fd, static_cast<mode_t>(st.permissions()) & 07777);
    if (fd >= 0) f = ::fdopen(fd, "wb");
    if (fd >= 0 && f == nullptr) {
      ::close(fd);
      ::unlink(target.c_str());
    }
  } else {
    f = std::fopen(target.c_str(), "wb");
  }
  if (f == nullptr)
    return absl::UnavailableError(absl::StrCat("cannot write ", path, atomic ? absl::StrCat(" (through ", target, ")") : "",
                                               ": ", std::strerror(errno)));
  int err = 0;
  auto put = [&](const void* data, size_t bytes) {
    if (err == 0 && std::fwrite(data, 1, bytes, f) != bytes) err = errno;
  };
  uint8_t len[8];
  uint64_t hl = h.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(hl >> (8 * i));
  put(len, 8);
  put(h.data(), h.size());
  for (const auto& t : tensors) {
    uint64_t n = 1;
    for (int64_t d : t.shape) n *= static_cast<uint64_t>(d);
    put(t.data, n * dtype_size(t.dtype));
  }
  if (std::fflush(f) != 0 && err == 0) err = errno;
  if (std::fclose(f) != 0 && err == 0) err = errno;
  if (err == 0 && atomic && std::rename(target.c_str(), path.c_str()) != 0) err = errno;
  if (err != 0) {
    if (atomic) std::filesystem::remove(target, ec);
    return absl::UnavailableError(absl::StrCat("write failed: ", path, ": ", std::strerror(err)));
  }
  return absl::OkStatus();
}

}  // namespace wm
