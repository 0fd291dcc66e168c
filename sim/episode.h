// One dataset episode: the world and policy of a seed, rendered frame by frame.
//
// Alignment: frame 0 is the initial view and its action row is all zeros;
// frame i (i >= 1) is the view after applying action i to the state of frame
// i - 1. An action row is [W, A, S, D, yaw, pitch]: keys as 0/1, mouse deltas
// in raw degrees (not divided by the action space's mouse_scale).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/action.h"
#include "sim/maze.h"
#include "sim/raycaster.h"
#include "sim/world.h"

namespace wm::sim {

inline constexpr int kActionRowWidth = 6;
inline constexpr int kPoseRowWidth = 4;

// the seed of episode e of a dataset: an unrelated stream per episode
uint64_t episode_seed(uint64_t dataset_seed, uint64_t episode);

// the [W, A, S, D, yaw, pitch] row of an action
void action_row(const Action& action, float* row);

struct Episode {
  uint64_t seed = 0;
  int frames = 0;
  std::vector<uint8_t> pixels;  // [frames, height, width, 3]
  std::vector<float> actions;   // [frames, 6], row 0 all zeros
  std::vector<float> poses;     // [frames, 4]: x, y, yaw_deg, pitch_deg of each frame's view
  Pose start;
  Pose end;
};

// the bytes an Episode of that many frames holds: pixels, actions and poses
uint64_t episode_bytes(int frames, int width, int height);

// what the workers of `wmsim dataset` may hold in memory together
inline constexpr uint64_t kEpisodeMemoryBudget = uint64_t{4} << 30;

// worker threads for a dataset: at most threads and episodes, and few enough
// that their episodes fit in memory_budget (one worker always runs)
int episode_workers(int threads, int episodes, uint64_t episode_bytes, uint64_t memory_budget);

// runs the policy of the seed in the world of the seed; frames >= 1.
// The raycaster fixes the frame size; it is scratch space, one per thread.
absl::StatusOr<Episode> run_policy_episode(uint64_t seed, int frames, Raycaster& raycaster,
                                           const MazeConfig& maze_config = {}, const WorldConfig& world_config = {});

}  // namespace wm::sim
