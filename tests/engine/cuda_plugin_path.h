// Where the tests find the CUDA plugin: WM_CUDA_PLUGIN if set, else the one
// this build made (WM_CUDA_PLUGIN_PATH) where it exists, else "" for the
// loader's own search: beside the test binary (the GPU bundle), then the
// dynamic loader's path.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

namespace wm::test {

inline std::string cuda_plugin_path() {
  if (const char* e = std::getenv("WM_CUDA_PLUGIN"); e != nullptr && *e != '\0') return e;
#ifdef WM_CUDA_PLUGIN_PATH
  if (std::filesystem::exists(WM_CUDA_PLUGIN_PATH)) return WM_CUDA_PLUGIN_PATH;
#endif
  return "";
}

}  // namespace wm::test
