#include "common/image_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>

#include <jpeglib.h>

#include "absl/strings/str_cat.h"

namespace wm {
namespace {

struct JpegError {
  jpeg_error_mgr mgr;
  jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

void on_jpeg_error(j_common_ptr cinfo) {
  auto* err = reinterpret_cast<JpegError*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, err->message);
  longjmp(err->jump, 1);
}

// libjpeg's warnings (level -1) are corrupt data it would decode anyway (a
// truncated file comes out grey at the bottom) and print to stderr, where a
// client could flood the server's log: here they are errors. Trace messages
// (level >= 0) are dropped.
void on_jpeg_message(j_common_ptr cinfo, int level) {
  if (level < 0) on_jpeg_error(cinfo);
}

void install(JpegError& err, j_common_ptr cinfo) {
  cinfo->err = jpeg_std_error(&err.mgr);
  err.mgr.error_exit = on_jpeg_error;
  err.mgr.emit_message = on_jpeg_message;
}

}  // namespace

absl::StatusOr<std::string> jpeg_encode(const uint8_t* rgb, int width, int height, int quality) {
  if (width <= 0 || height <= 0 || quality < 1 || quality > 100)
    return absl::InvalidArgumentError("jpeg_encode: bad size or quality");
  jpeg_compress_struct cinfo;
  JpegError err;
  install(err, reinterpret_cast<j_common_ptr>(&cinfo));
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  if (setjmp(err.jump)) {
    jpeg_destroy_compress(&cinfo);
    free(buf);
    return absl::InternalError(absl::StrCat("jpeg encode: ", err.message));
  }
  jpeg_create_compress(&cinfo);
  jpeg_mem_dest(&cinfo, &buf, &size);
  cinfo.image_width = static_cast<JDIMENSION>(width);
  cinfo.image_height = static_cast<JDIMENSION>(height);
  cinfo.input_components = 3;
  cinfo.in_color_space = JCS_RGB;
  jpeg_set_defaults(&cinfo);
  jpeg_set_quality(&cinfo, quality, TRUE);
  jpeg_start_compress(&cinfo, TRUE);
  while (cinfo.next_scanline < cinfo.image_height) {
    JSAMPROW row = const_cast<JSAMPROW>(rgb + static_cast<size_t>(cinfo.next_scanline) * width * 3);
    jpeg_write_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_compress(&cinfo);
  jpeg_destroy_compress(&cinfo);
  std::string out(reinterpret_cast<char*>(buf), size);
  free(buf);
  return out;
}

absl::StatusOr<Rgb8Image> jpeg_decode(const void* data, size_t size, int64_t max_pixels) {
  if (size == 0) return absl::InvalidArgumentError("jpeg decode: empty input");
  jpeg_decompress_struct cinfo;
  JpegError err;
  install(err, reinterpret_cast<j_common_ptr>(&cinfo));
  Rgb8Image img;
  if (setjmp(err.jump)) {
    jpeg_destroy_decompress(&cinfo);
    return absl::InvalidArgumentError(absl::StrCat("jpeg decode: ", err.message));
  }
  jpeg_create_decompress(&cinfo);
  jpeg_mem_src(&cinfo, static_cast<const unsigned char*>(data), static_cast<unsigned long>(size));
  jpeg_read_header(&cinfo, TRUE);
  if (static_cast<int64_t>(cinfo.image_width) * cinfo.image_height > max_pixels) {
    jpeg_destroy_decompress(&cinfo);
    return absl::InvalidArgumentError(
        absl::StrCat("jpeg decode: image ", cinfo.image_width, "x", cinfo.image_height, " is too large"));
  }
  cinfo.out_color_space = JCS_RGB;
  jpeg_start_decompress(&cinfo);
  img.width = static_cast<int>(cinfo.output_width);
  img.height = static_cast<int>(cinfo.output_height);
  img.pixels.resize(static_cast<size_t>(img.width) * img.height * 3);
  while (cinfo.output_scanline < cinfo.output_height) {
    JSAMPROW row = img.pixels.data() + static_cast<size_t>(cinfo.output_scanline) * img.width * 3;
    jpeg_read_scanlines(&cinfo, &row, 1);
  }
  jpeg_finish_decompress(&cinfo);
  jpeg_destroy_decompress(&cinfo);
  return img;
}

absl::Status write_file(const std::string& path, const void* data, size_t size) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return absl::UnavailableError(absl::StrCat("cannot write ", path, ": ", std::strerror(errno)));
  int err = 0;
  if (std::fwrite(data, 1, size, f) != size) err = errno;
  // buffered bytes reach the file only here: a full disk shows at the flush
  if (std::fflush(f) != 0 && err == 0) err = errno;
  if (std::fclose(f) != 0 && err == 0) err = errno;
  if (err == 0) return absl::OkStatus();
  // leave no truncated output behind (but never remove a device or a link's target)
  std::error_code ec;
  if (std::filesystem::is_regular_file(std::filesystem::symlink_status(path, ec))) std::filesystem::remove(path, ec);
  return absl::UnavailableError(absl::StrCat("write failed: ", path, ": ", std::strerror(err)));
}

absl::Status flush_stdout() {
  errno = 0;
  const bool flushed = std::fflush(stdout) == 0;
  const int err = errno;
  if (flushed && !std::ferror(stdout)) return absl::OkStatus();
  return absl::UnavailableError(
      absl::StrCat("write failed: stdout: ", err != 0 ? std::strerror(err) : "an earlier write failed"));
}

absl::StatusOr<std::string> read_file(const std::string& path, size_t max_bytes) {
  if (path.empty()) return absl::InvalidArgumentError("an empty file name");
  // non-blocking: a FIFO opens at once (and is refused below) instead of
  // waiting forever for a writer
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return absl::NotFoundError(absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  const std::unique_ptr<const int, void (*)(const int*)> closer(&fd, [](const int* f) { ::close(*f); });
  struct stat st;
  if (fstat(fd, &st) != 0) return absl::InternalError(absl::StrCat(path, ": cannot stat: ", std::strerror(errno)));
  if (S_ISDIR(st.st_mode)) return absl::InvalidArgumentError(absl::StrCat(path, " is a directory, not a file"));
  if (!S_ISREG(st.st_mode)) return absl::InvalidArgumentError(absl::StrCat(path, " is not a regular file"));
  const size_t size = static_cast<size_t>(st.st_size);
  if (size > max_bytes)
    return absl::InvalidArgumentError(absl::StrCat(path, ": file too large (", size, " bytes; at most ", max_bytes, ")"));
  std::string out(size, '\0');
  size_t got = 0;
  while (got < size) {
    const ssize_t r = ::read(fd, out.data() + got, size - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += static_cast<size_t>(r);
  }
  if (got != size) return absl::DataLossError(absl::StrCat(path, ": short read (", got, " of ", size, " bytes)"));
  return out;
}

}  // namespace wm
