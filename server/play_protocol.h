// The Play protocol's messages checked and converted: Start -> the session's
// parameters, Action -> an engine Action, and the model description sent to
// clients. Every refusal is a Status with the code of docs/API.md and a
// message that says what to change.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/image_io.h"
#include "engine/action.h"
#include "server/action_queue.h"
#include "server/served_model.h"
#include "wmserve/v1/wmserve.pb.h"

namespace wm::server {

// fixed-rate pacing: the slowest rate a session may ask for (a frame every
// 1000 s), and the highest --max_fps may allow (a tick every millisecond);
// beyond either the tick period does not fit the clock's nanoseconds
inline constexpr double kMinFixedRateFps = 1e-3;
inline constexpr double kMaxFixedRateFps = 1000;

struct ProtocolLimits {
  int default_jpeg_quality = 90;
  double max_fps = 240;  // kMinFixedRateFps..kMaxFixedRateFps
  int max_prompt_frames = 16;
};

struct StartParams {
  std::string cache_format;
  uint64_t seed = 0;
  PacingMode pacing = PacingMode::kPerAction;
  double fps = 0;               // fixed-rate only
  int jpeg_quality = 90;
  bool audit = false;
  bool batch_invariant = false;  // asked by the Start (or every session: the server's flag)
  std::vector<Rgb8Image> prompt;
};

// NOT_FOUND: unknown model or cache format; INVALID_ARGUMENT: bad pacing,
// fps, quality or prompt. A resume token is not looked at: a resuming Start
// never gets here (the service re-attaches the parked session instead).
// `prompts_decoded` (if given) is how many prompt JPEGs were decoded, or
// tried, whether the Start parsed or not: the work a refused Start cost.
absl::StatusOr<StartParams> parse_start(const wmserve::v1::Start& start, const ServedModel& model,
                                        const ProtocolLimits& limits, int* prompts_decoded = nullptr);

// INVALID_ARGUMENT when the action is not in the model's action space
// (unknown key bits, a mouse value not finite or beyond the limit, a mouse
// value for an axis the model does not have)
absl::StatusOr<Action> parse_action(const wmserve::v1::Action& action, const ActionSpace& space);

void fill_model_info(const ServedModel& model, wmserve::v1::ModelInfo* out);
void fill_action_space(const ActionSpace& space, wmserve::v1::ActionSpace* out);

}  // namespace wm::server
