// The model's weights: host fp32 copies of the small conditioning MLPs and
// backend handles of every matrix the transformer body multiplies with.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/backend.h"
#include "engine/model_config.h"
#include "engine/safetensors.h"

namespace wm {

// every tensor of a config with its shape, in a fixed order (docs/MODEL_FORMAT.md)
struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  int64_t numel() const;
};
std::vector<TensorSpec> model_tensor_specs(const ModelConfig& c);

// host fp32 values of every tensor, by spec order
struct HostWeights {
  std::vector<TensorSpec> specs;
  std::vector<std::vector<float>> values;
  const std::vector<float>& get(const std::string& name) const;
};

// how much memory this process may use: the least of the machine's physical
// memory, its address-space limit (ulimit -v) and its container's memory
// limit (cgroup v2 memory.max or v1 memory.limit_in_bytes); `what` names
// the one that binds, for messages. bytes 0: none known
struct MemoryLimit {
  int64_t bytes = 0;
  std::string what;
};
MemoryLimit memory_limit();
// refuses a config whose fp32 weights exceed memory_limit(), before any is
// allocated: a config can validate and still need terabytes
absl::Status check_weights_fit_memory(const ModelConfig& c);

// reads and checks every tensor: missing, extra, wrong shape or dtype fail naming the tensor
absl::StatusOr<HostWeights> load_host_weights(const ModelConfig& c, const SafetensorsFile& file);
// seeded random weights (checkpoint init and benchmarks); check_weights_fit_memory first
HostWeights random_host_weights(const ModelConfig& c, uint64_t seed);
absl::Status save_checkpoint(const ModelConfig& c, const HostWeights& w, const std::string& dir);

struct LayerWeights {
  LinearWeight q, k, v, o, ffn0, ffn2;
  const float* q_norm = nullptr;   // [head_dim], backend memory
  const float* k_norm = nullptr;
  std::vector<float> modulation;   // host [6, D]
};

// the weights as the forward pass uses them, uploaded to a backend
class DeviceWeights {
 public:
  DeviceWeights(Backend& backend, const ModelConfig& c, const HostWeights& host);
  ~DeviceWeights();
  DeviceWeights(const DeviceWeights&) = delete;
  DeviceWeights& operator=(const DeviceWeights&) = delete;

  LinearWeight patch_embed, head;
  std::vector<LayerWeights> layers;
  const float* modulation = nullptr;  // every layer's modulation [L, 6D], backend memory
  // host copies for the per-frame conditioning
  std::vector<float> time0_w, time0_b, time2_w, time2_b;
  std::vector<float> action0_w, action0_b, action2_w, action2_b;
  std::vector<float> cond_w, cond_b, head_modulation;

 private:
  const float* upload_vector(const std::vector<float>& v);
  Backend& backend_;
  std::vector<void*> owned_;
};

}  // namespace wm
