// Shared by the benchmarks: flags, the backend under test (CUDA plugin, or
// the CPU for a dry run of the harness), timing, and fast random weights.
#pragma once

#include <omp.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench_flags.h"
#include "engine/backend.h"
#include "engine/noise.h"
#include "engine/plugin_loader.h"
#include "engine/weights.h"

namespace wm::bench {

// device copies of host arrays, freed together at scope end (synchronize first)
class DeviceArrays {
 public:
  explicit DeviceArrays(Backend& b) : b_(b) {}
  DeviceArrays(const DeviceArrays&) = delete;
  DeviceArrays& operator=(const DeviceArrays&) = delete;
  ~DeviceArrays() {
    for (void* p : owned_) b_.free(p);
  }
  float* put(const std::vector<float>& h) {
    void* p = b_.alloc(h.size() * sizeof(float));
    b_.upload(p, h.data(), h.size() * sizeof(float));
    owned_.push_back(p);
    return static_cast<float*>(p);
  }

 private:
  Backend& b_;
  std::vector<void*> owned_;
};

// the backend under test; `plugin` is null on the CPU
struct Device {
  std::unique_ptr<Backend> owned;
  Backend* backend = nullptr;
  PluginBackend* plugin = nullptr;
  std::string name;
  void sync() {
    if (plugin != nullptr) {
      const absl::Status s = plugin->synchronize();
      if (!s.ok()) {
        std::fprintf(stderr, "device error: %s\n", s.ToString().c_str());
        std::exit(3);
      }
    }
  }
  // the benchmark's exit code: 3 (after saying why) when a device op failed
  int exit_code() const {
    if (plugin == nullptr || plugin->status().ok()) return 0;
    std::fprintf(stderr, "device error: %s\n", plugin->status().ToString().c_str());
    return 3;
  }
};

// --device=cuda|cpu and --plugin=PATH, read with the benchmark's other flags
struct DeviceFlags {
  bool cpu = false;
  std::string plugin;
};
inline DeviceFlags read_device_flags(Flags& f) {
  DeviceFlags d;
  d.cpu = f.choice("device", "cuda", {"cuda", "cpu"}) == "cpu";
  d.plugin = f.str("plugin", "");
  return d;
}

// the backend --device names (cuda by default, through --plugin), with a KV
// pool of pool_bytes and reserve_bytes kept for the model
inline absl::StatusOr<Device> try_open_device(const DeviceFlags& f, int64_t pool_bytes, int64_t reserve_bytes) {
  Device d;
  if (f.cpu) {
    d.owned = make_cpu_backend(0);
    d.backend = d.owned.get();
    d.name = "cpu";
    return d;
  }
  PluginBackendOptions o;
  o.path = f.plugin;
  o.kv_pool_bytes = pool_bytes;
  o.reserve_bytes = reserve_bytes;
  auto b = make_plugin_backend(o);
  if (!b.ok()) return b.status();
  d.plugin = b->get();
  d.name = d.plugin->device_info().name;
  d.owned = std::move(*b);
  d.backend = d.owned.get();
  return d;
}

// the same, or exit 2 after saying why
inline Device open_device(const DeviceFlags& f, int64_t pool_bytes, int64_t reserve_bytes) {
  auto d = try_open_device(f, pool_bytes, reserve_bytes);
  if (!d.ok()) {
    std::fprintf(stderr, "no CUDA backend: %s\n", d.status().ToString().c_str());
    std::exit(2);
  }
  return std::move(*d);
}

// --tuning=key=value[,key=value...] (spec): plugin tunings (docs/CUDA.md,
// "Tuning") set before anything runs, so that one device call can time a
// setting against the default; what was set, as "key=value,..." (empty: none)
inline absl::StatusOr<std::string> apply_tuning(const std::string& spec, Device& d) {
  if (spec.empty()) return std::string();
  if (d.plugin == nullptr) return absl::InvalidArgumentError("--tuning: the CPU backend has no tunings");
  size_t at = 0;
  while (at < spec.size()) {
    size_t comma = spec.find(',', at);
    if (comma == std::string::npos) comma = spec.size();
    const std::string item = spec.substr(at, comma - at);
    const size_t eq = item.find('=');
    char* end = nullptr;
    const long long value = eq == std::string::npos ? 0 : std::strtoll(item.c_str() + eq + 1, &end, 10);
    if (eq == std::string::npos || eq == 0 || end == item.c_str() + eq + 1 || *end != '\0')
      return absl::InvalidArgumentError("--tuning: expected key=integer, got \"" + item + "\"");
    if (absl::Status s = d.plugin->set_tuning(item.substr(0, eq), value); !s.ok()) return s;
    at = comma + 1;
  }
  return spec;
}

inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// random weights with the same shapes and scales as random_host_weights
// (engine/weights.cc) but uniform from a counter-based generator filled by
// every core: seconds, not minutes, for 1.4B parameters
inline HostWeights fast_random_weights(const ModelConfig& c, uint64_t seed) {
  HostWeights w;
  w.specs = model_tensor_specs(c);
  w.values.resize(w.specs.size());
  for (size_t i = 0; i < w.specs.size(); ++i) {
    const TensorSpec& s = w.specs[i];
    std::vector<float>& v = w.values[i];
    v.resize(static_cast<size_t>(s.numel()));
    if (s.name.find("_norm.weight") != std::string::npos) {
      std::fill(v.begin(), v.end(), 1.0f);
      continue;
    }
    float stddev = 0.02f;
    if (s.shape.size() == 2 && s.name.find("modulation") == std::string::npos)
      stddev = 1.0f / std::sqrt(static_cast<float>(s.shape[1]));
    if (s.shape.size() == 1) stddev = 0.01f;
    const float a = stddev * std::sqrt(3.0f);  // uniform [-a, a] has this standard deviation
    const int64_t n = static_cast<int64_t>(v.size());
    float* out = v.data();
    const uint64_t key = splitmix64(seed ^ (0x1234567ull * (i + 1)));
#pragma omp parallel for schedule(static)
    for (int64_t j = 0; j < n; ++j) {
      const uint64_t r = splitmix64(key + static_cast<uint64_t>(j));
      out[j] = a * (static_cast<float>(r >> 40) * (2.0f / 16777216.0f) - 1.0f);
    }
  }
  return w;
}

}  // namespace wm::bench
