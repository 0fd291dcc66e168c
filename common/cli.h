// Command-line parsing shared by the tools: absl flags, and a word that is
// not a flag is an error (a value whose flag was mistyped, or a stray word)
// instead of being ignored.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace wm {

// parses the flags (exiting on a bad one, as absl does); the message when
// something else is on the command line
inline std::optional<std::string> parse_flags_only(int argc, char** argv) {
  const std::vector<char*> rest = absl::ParseCommandLine(argc, argv);
  if (rest.size() <= 1) return std::nullopt;
  return absl::StrCat("unexpected argument '", rest[1], "': every setting is a flag (--name=value); see --help");
}

// CPU threads as wmserve takes them: 0 is every core; the OpenMP runtime
// crashes or allocates without bound far above the limit
inline constexpr int kMaxThreads = 1024;
inline constexpr char kThreadsRange[] = "--threads must be 0..1024 (0: all cores)";
inline bool threads_in_range(int threads) { return threads >= 0 && threads <= kMaxThreads; }

// that an output flag's file can be made, checked before a run that takes
// minutes rather than after it: the file opens for writing, an existing one
// untruncated, and one made only to try is removed again. Non-blocking, so
// that a FIFO without a reader is refused, not waited on. The message, or
// nothing when the path is empty (the flag not given) or writable
inline std::optional<std::string> unwritable_output(absl::string_view flag, const std::string& path) {
  if (path.empty()) return std::nullopt;
  std::error_code ec;
  const bool existed = std::filesystem::exists(std::filesystem::symlink_status(path, ec));
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_NONBLOCK | O_CLOEXEC, 0666);
  if (fd < 0) return absl::StrCat("--", flag, "=", path, ": cannot write: ", std::strerror(errno));
  ::close(fd);
  if (!existed) ::unlink(path.c_str());
  return std::nullopt;
}

}  // namespace wm
