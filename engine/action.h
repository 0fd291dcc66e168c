// One frame's action (multi-hot keys + mouse deltas) and the text format of
// action scripts used by wmgen, wmplay, wmsim and wmeval.
//
// Script format, one line per action (or per run of identical actions):
//
//   # comment
//   KEYS [YAW [PITCH]] [*REPEAT]
//
// KEYS is a string of key letters from the model's action space ("W", "WA",
// "SD") or "-" for no key; YAW and PITCH are mouse deltas for that frame
// (default 0); "*N", last and once, repeats the line N times (1..100000). A
// script holds at most 1,000,000 actions and a file at most 64 MiB. Example:
//
//   W 0 0 *10     walk forward for 10 frames
//   - 15          turn right by 15 units
//   AW -5 2 *3
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/statusor.h"

namespace wm {

inline constexpr int kMaxMouseAxes = 4;

struct Action {
  uint32_t keys = 0;                          // bit k = key k of the action space held
  std::array<float, kMaxMouseAxes> mouse{};   // mouse deltas, axes in action-space order
  uint64_t seq = 0;                           // client sequence number (0 for scripts)
  bool operator==(const Action& o) const { return keys == o.keys && mouse == o.mouse; }
};

struct ActionSpace {
  std::vector<std::string> keys;    // single-letter key names, bit order
  std::vector<std::string> mouse;   // mouse axis names
  float mouse_scale = 1.0f;
  float mouse_limit = 1.0f;
  // ok if the action uses only known keys and finite in-range mouse values
  absl::Status validate(const Action& a) const;
  // [K + M] floats: key bits then mouse / mouse_scale
  void embed_input(const Action& a, float* out) const;
  int input_width() const { return static_cast<int>(keys.size() + mouse.size()); }
};

// the WASD + yaw/pitch space of the default model and the simulator
ActionSpace default_action_space();

// parses a script; errors name the line. An empty script is valid (wmsim
// renders the start view from one); tools that generate frames refuse it.
absl::StatusOr<std::vector<Action>> parse_action_script(absl::string_view text, const ActionSpace& space);
// a script file (or pipe) of at most kMaxActionScriptBytes
inline constexpr size_t kMaxActionScriptBytes = size_t{64} << 20;
absl::StatusOr<std::vector<Action>> load_action_script(const std::string& path, const ActionSpace& space);
// formats actions as a script (one line per action, runs collapsed with *N)
std::string format_action_script(const std::vector<Action>& actions, const ActionSpace& space);

}  // namespace wm
