// What the server knows about the model it serves, fixed at startup: read by
// every thread without locks (it never changes after the engine is built).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/image_io.h"
#include "engine/model_config.h"

namespace wm {
class Engine;
}

namespace wm::server {

struct ServedModel {
  std::string dir;
  ModelConfig config;
  int64_t parameters = 0;
  std::string device;
  std::string device_note;                           // Engine::device_note()
  std::vector<std::string> cache_formats;
  std::string default_format;
  std::map<std::string, int64_t> reservation_bytes;  // per format: one session's most KV bytes
  bool audit_supported = false;                      // sessions can keep a full-precision shadow (Start.audit)
  int64_t audit_bytes = 0;                           // what that shadow adds to a session's reservation
  bool all_batch_invariant = false;                  // --batch_invariant: every session is
  std::map<std::string, double> compression_ratio;   // per format: fp16 bytes / format bytes (full window)
  std::string kv_options;                            // the format options set (--kv_options), canonical; "": defaults
  int64_t kv_capacity_bytes = 0;
  std::vector<Rgb8Image> prompts;                    // the model's prompts/*.jpg, sorted by name
};

// reads everything from a freshly created engine (on the engine's thread)
// and the model directory's prompts/*.jpg; fails naming a bad prompt file,
// or format options that take a format away from this model
absl::StatusOr<ServedModel> describe_served_model(const Engine& engine, const std::string& model_dir,
                                                  const std::string& default_format);

}  // namespace wm::server
