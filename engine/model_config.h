// The model's config.json (docs/MODEL_FORMAT.md), parsed and validated.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/action.h"

namespace wm {

struct ModelConfig {
  std::string name;
  int channels = 3, height = 64, width = 64, patch = 8;
  std::string decoder = "pixels";  // "pixels" | "latent_preview"
  int dim = 256, layers = 8, heads = 4, head_dim = 64, ffn = 1024, freq_dim = 256;
  float norm_eps = 1e-6f;
  float rope_theta = 10000.0f;
  int t_pairs = 12, h_pairs = 10, w_pairs = 10;
  ActionSpace actions;
  int frames_per_block = 1;
  std::vector<float> sigmas;
  int window_frames = 16, sink_frames = 1;

  // derived
  int grid_h() const { return height / patch; }
  int grid_w() const { return width / patch; }
  int tokens_per_frame() const { return grid_h() * grid_w(); }
  int patch_dim() const { return channels * patch * patch; }
  int qkv_dim() const { return heads * head_dim; }
  int frame_values() const { return height * width * channels; }
  int64_t parameter_count() const;
};

absl::StatusOr<ModelConfig> parse_model_config(absl::string_view json_text, const std::string& source);
absl::StatusOr<ModelConfig> load_model_config(const std::string& path);
std::string model_config_to_json(const ModelConfig& c);

}  // namespace wm
