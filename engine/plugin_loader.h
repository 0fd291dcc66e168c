// Compute-backend plugins: loading libwm_cuda.so with dlopen behind the
// versioned C ABI of engine/plugin_api.h, and the engine Backend over it.
// DESIGN.md section 8 says why CUDA must live in a dlopen'ed plugin (cuBLASLt's
// static TLS breaks prometheus-cpp's HTTP server when linked into wmserve).
//
// The loader rejects a library that is missing, has no entry symbol, or speaks
// another ABI version, with a message that says which and what to do.
// Threading: loading is thread-safe (dlopen); a PluginBackend is used by one
// thread at a time, like every Backend.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "engine/backend.h"
#include "engine/plugin_api.h"

namespace wm {

inline constexpr const char* kCudaPluginFile = "libwm_cuda.so";

// a plugin whose ABI matched; the library stays mapped until the process
// exits (CUDA libraries do not survive being unloaded and loaded again)
class LoadedPlugin {
 public:
  LoadedPlugin(std::string path, const WmPluginApi* api) : path_(std::move(path)), api_(api) {}
  const WmPluginApi& api() const { return *api_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const WmPluginApi* api_;
};

// where a plugin is looked for, in order: `explicit_path` alone when set;
// else `file_name` beside the running executable, then `file_name` through
// the dynamic loader's own search (LD_LIBRARY_PATH, ld.so.cache)
std::vector<std::string> plugin_candidates(const std::string& explicit_path, const std::string& file_name);

// NOT_FOUND: dlopen failed (the message carries dlerror); FAILED_PRECONDITION:
// not a wmserve plugin (no entry symbol) or another ABI version
absl::StatusOr<std::shared_ptr<const LoadedPlugin>> load_plugin(const std::string& path);
// the first candidate that loads; a file that exists but is rejected stops
// the search with its own error; NOT_FOUND lists every place tried
absl::StatusOr<std::shared_ptr<const LoadedPlugin>> find_plugin(const std::string& explicit_path,
                                                                const std::string& file_name);

struct PluginBackendOptions {
  std::string path;                             // empty: find_plugin's search for libwm_cuda.so
  int device = 0;                               // CUDA device ordinal
  int64_t kv_pool_bytes = int64_t{2} << 30;     // the device KV page pool, allocated once at creation
  int64_t kv_page_bytes = int64_t{64} << 10;    // a multiple of 32 KiB
  int64_t reserve_bytes = 0;                    // device memory the model will need besides the pool
  // the Backend ops return nothing: a device failure in one aborts with the
  // plugin's message (the CUDA context is lost anyway); tests turn this off
  // and read status() instead
  bool abort_on_error = true;
};

// a Backend implemented by a plugin, plus what only a device backend has
class PluginBackend : public Backend {
 public:
  virtual const LoadedPlugin& plugin() const = 0;
  virtual const WmPluginDeviceInfo& device_info() const = 0;
  // the first failure of an op (abort_on_error off), else OK
  virtual absl::Status status() const = 0;
  // returns status() and forgets it, so that a test can tell which case
  // failed (a lost device context fails the next op again anyway)
  virtual absl::Status take_status() = 0;
  virtual absl::Status synchronize() = 0;
  // named knobs for tests and benchmarks (docs/CUDA.md)
  virtual absl::Status set_tuning(absl::string_view key, int64_t value) = 0;
  // named event counters since creation (docs/CUDA.md), e.g. "attention.plans"
  virtual absl::StatusOr<int64_t> counter(absl::string_view name) const = 0;
  // device time of the work enqueued between the two calls
  virtual absl::Status timer_start() = 0;
  virtual absl::StatusOr<double> timer_stop_ms() = 0;

  // the attention kernel that runs head_dim now: "mma", "wgmma", "overlap", "ws"
  // (the plugin's attention.kernel.head_dim_N), "" if none or unknown
  std::string attention_kernel(int head_dim) const {
    const absl::StatusOr<int64_t> k = counter("attention.kernel.head_dim_" + std::to_string(head_dim));
    if (!k.ok()) return "";
    return *k == 1 ? "mma" : *k == 2 ? "wgmma" : *k == 3 ? "overlap" : *k == 4 ? "ws" : "";
  }
};

// loads the plugin, checks for a usable device, creates the backend;
// UNAVAILABLE when there is no usable GPU, RESOURCE_EXHAUSTED when the pool
// and the model do not fit its memory
absl::StatusOr<std::unique_ptr<PluginBackend>> make_plugin_backend(const PluginBackendOptions& options);

}  // namespace wm
