// The causal latent DiT forward pass (docs/MODEL_FORMAT.md) over a batch of
// sessions: dense layers run once over every session's tokens (per session
// when batch-invariant), attention runs per session against that session's
// KV cache.
#pragma once

#include <functional>
#include <memory>
#include "absl/strings/string_view.h"
#include <vector>

#include "engine/action.h"
#include "engine/backend.h"
#include "engine/model_config.h"
#include "engine/weights.h"
#include "quant/kv_cache.h"

namespace wm {

// time spent by op group, seconds
struct OpTimes {
  double gemm = 0, attention = 0, other = 0;
  double total() const { return gemm + attention + other; }
  OpTimes& operator+=(const OpTimes& o) {
    gemm += o.gemm;
    attention += o.attention;
    other += o.other;
    return *this;
  }
};

struct ForwardInput {
  const float* tokens = nullptr;          // backend memory [frames * T, P]
  std::vector<float> sigma;               // [frames]
  std::vector<Action> actions;            // [frames]
  std::vector<int64_t> frame_index;       // [frames] absolute index in its session
  std::vector<SessionSlice> sessions;
  bool write_pass = false;                // append K/V to the caches, no output
};

// the KV-cache geometry of a model: every session's cache has this shape
KvGeometry kv_geometry_of(const ModelConfig& c);

// name, host data, count: intermediate tensors for parity tests
using TraceFn = std::function<void(absl::string_view name, const float* data, int64_t count)>;

class Model {
 public:
  Model(Backend& backend, const ModelConfig& config, const HostWeights& weights);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const { return config_; }
  Backend& backend() { return backend_; }

  // velocity [frames * T, P] into `out` (backend memory) unless write_pass:
  // prepare_forward, then run_forward
  absl::Status forward(const ForwardInput& in, float* out, OpTimes* times, const TraceFn* trace = nullptr);
  // the host's part: checks, buffers, conditioning and modulation, positions
  // (its uploads); everything run_forward reads that changes between passes
  absl::Status prepare_forward(const ForwardInput& in, OpTimes* times, const TraceFn* trace = nullptr);
  // the backend's ops of the pass, after prepare_forward of the same input;
  // they upload nothing, so a backend can record them once and run them again
  absl::Status run_forward(const ForwardInput& in, float* out, OpTimes* times, const TraceFn* trace = nullptr);

  // for every frame: c_f [frames, D] and e_f = cond_proj(SiLU(c_f)) [frames, 6D], on the host;
  // group_frames (frame counts, in order, summing to the frames): each group
  // is computed on its own, as if alone (empty: one group)
  void conditioning(const std::vector<float>& sigma, const std::vector<Action>& actions, float* c, float* e,
                    const std::vector<int>& group_frames = {}) const;

  // the batch's frames as groups whose dense ops run on their own: each
  // batch-invariant session (SessionSlice::invariant) alone, so its numbers
  // are those it gets stepped alone whatever shares its batch; the sessions
  // between them together (one group when none is invariant)
  static std::vector<int> frame_groups(const ForwardInput& in);

  // the activation buffers of a batch this large, now (they grow otherwise)
  // RESOURCE_EXHAUSTED (and nothing held) when the backend cannot allocate them
  absl::Status reserve(int tokens, int frames);

 private:
  float* buf(size_t i) { return bufs_[i]; }

  Backend& backend_;
  ModelConfig config_;
  DeviceWeights weights_;
  int capacity_tokens_ = 0, capacity_frames_ = 0;
  std::vector<float*> bufs_;
  // the action branch of the last conditioning() (its embedded input and
  // output): the passes of a step reuse it
  mutable std::vector<float> action_in_, action_out_;
  mutable std::vector<int> action_groups_;
  float* mods_ = nullptr;       // [L, frames, 6D] + head [frames, 2D] + e [frames, 6D]
  int32_t* pos_ = nullptr;      // [tokens, 3]
};

}  // namespace wm
