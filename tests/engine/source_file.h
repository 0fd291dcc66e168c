// A file of the checkout for tests: where the build saw it (WM_SOURCE_DIR),
// else relative to the working directory, for test binaries that run from a
// copy of the checkout somewhere else (the GPU bundle, tools/gpu-run.sh).
#pragma once

#include <filesystem>
#include <string>

namespace wm::test {

inline std::string source_file(const std::string& rel) {
  const std::string built = std::string(WM_SOURCE_DIR) + "/" + rel;
  return std::filesystem::exists(built) ? built : rel;
}

}  // namespace wm::test
