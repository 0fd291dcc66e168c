#include "sim/episode.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "sim/policy.h"
#include "sim/rng.h"

namespace wm::sim {

namespace {

void pose_row(const Pose& p, float* row) {
  row[0] = static_cast<float>(p.x);
  row[1] = static_cast<float>(p.y);
  row[2] = static_cast<float>(p.yaw_deg);
  row[3] = static_cast<float>(p.pitch_deg);
}

}  // namespace

uint64_t episode_seed(uint64_t dataset_seed, uint64_t episode) { return derive_seed(dataset_seed, episode); }

void action_row(const Action& action, float* row) {
  for (int k = 0; k < 4; ++k) row[k] = ((action.keys >> k) & 1u) ? 1.0f : 0.0f;
  row[4] = action.mouse[0];
  row[5] = action.mouse[1];
}

uint64_t episode_bytes(int frames, int width, int height) {
  const uint64_t row_bytes = uint64_t{3} * width * height + sizeof(float) * (kActionRowWidth + kPoseRowWidth);
  return static_cast<uint64_t>(frames) * row_bytes;
}

int episode_workers(int threads, int episodes, uint64_t episode_bytes, uint64_t memory_budget) {
  const uint64_t fit = episode_bytes > 0 ? memory_budget / episode_bytes : memory_budget;
  const uint64_t workers = std::min<uint64_t>({static_cast<uint64_t>(std::max(threads, 1)),
                                               static_cast<uint64_t>(std::max(episodes, 1)), std::max<uint64_t>(fit, 1)});
  return static_cast<int>(workers);
}

absl::StatusOr<Episode> run_policy_episode(uint64_t seed, int frames, Raycaster& raycaster,
                                           const MazeConfig& maze_config, const WorldConfig& world_config) {
  if (frames < 1 || frames > 1000000) return absl::InvalidArgumentError(absl::StrCat("frames = ", frames, " is not in 1..1000000"));
  auto world = World::from_seed(seed, maze_config, world_config);
  if (!world.ok()) return world.status();
  ExplorationPolicy policy(seed);
  const size_t frame_bytes = raycaster.frame_bytes();
  Episode ep;
  ep.seed = seed;
  ep.frames = frames;
  ep.pixels.resize(frame_bytes * frames);
  ep.actions.assign(static_cast<size_t>(frames) * kActionRowWidth, 0.0f);
  ep.poses.resize(static_cast<size_t>(frames) * kPoseRowWidth);
  ep.start = world->pose();
  for (int i = 0; i < frames; ++i) {
    if (i > 0) {
      const Action a = policy.next(*world);
      world->step(a);
      action_row(a, ep.actions.data() + static_cast<size_t>(i) * kActionRowWidth);
    }
    raycaster.render(world->maze(), world->pose(), ep.pixels.data() + frame_bytes * i);
    pose_row(world->pose(), ep.poses.data() + static_cast<size_t>(i) * kPoseRowWidth);
  }
  ep.end = world->pose();
  return ep;
}

}  // namespace wm::sim
