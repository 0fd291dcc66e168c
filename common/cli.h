// Command-line parsing shared by the tools: absl flags, and a word that is
// not a flag is an error (a value whose flag was mistyped, or a stray word)
// instead of being ignored.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"

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

}  // namespace wm
