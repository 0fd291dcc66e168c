// The player in the maze and the one-frame action step.
//
// Units: positions in tiles (x east, y south), angles in degrees. Yaw 0 looks
// east (+x), yaw 90 looks south (+y): a positive yaw delta turns right when
// seen from above with north up. Pitch is positive looking up, clamped to
// +-pitch_limit and drawn as a vertical horizon shift. One step applies the
// action's yaw and pitch first, then moves along the new heading.
#pragma once

#include <cstdint>
#include <utility>

#include "absl/status/statusor.h"
#include "engine/action.h"
#include "sim/maze.h"

namespace wm::sim {

// bits of wm::Action::keys in the default action space
inline constexpr uint32_t kKeyW = 1u << 0;
inline constexpr uint32_t kKeyA = 1u << 1;
inline constexpr uint32_t kKeyS = 1u << 2;
inline constexpr uint32_t kKeyD = 1u << 3;

struct Pose {
  double x = 0.0;          // tiles, east
  double y = 0.0;          // tiles, south
  double yaw_deg = 0.0;    // [0, 360), 0 = east, 90 = south
  double pitch_deg = 0.0;  // [-pitch_limit, pitch_limit], positive looks up
};

struct WorldConfig {
  double radius = 0.2;           // body radius in tiles, against walls and pillars
  double forward_speed = 0.12;   // tiles per frame for W and S
  double strafe_speed = 0.08;    // tiles per frame for A and D
  double pitch_limit = 20.0;     // degrees
  absl::Status validate() const;
};

// a free cell tile (outside the rooms) and a yaw that faces an opening, both from
// the seed; yaw is a whole number of degrees so that turns by exact steps return
// to exactly the same value
Pose start_pose(const Maze& maze, uint64_t seed);

class World {
 public:
  // the maze of the seed with the start pose of the seed
  static absl::StatusOr<World> from_seed(uint64_t seed, const MazeConfig& maze_config = {},
                                         const WorldConfig& config = {});
  // start must be a position where the body fits
  static absl::StatusOr<World> create(Maze maze, const Pose& start, const WorldConfig& config = {});

  // applies one frame's action. keys: W forward, S back, A strafe left, D
  // strafe right (opposite keys cancel, W+D moves diagonally at the summed
  // speed); mouse[0] adds yaw, mouse[1] adds pitch. Non-finite mouse values
  // are ignored. Movement slides along walls and pillars.
  void step(const Action& action);

  // true if a body of the configured radius centred at (x, y) overlaps a wall or a pillar
  bool collides(double x, double y) const;

  const Pose& pose() const { return pose_; }
  const Maze& maze() const { return maze_; }
  const WorldConfig& config() const { return config_; }

 private:
  World(Maze maze, const Pose& start, const WorldConfig& config)
      : maze_(std::move(maze)), pose_(start), config_(config) {}
  // pushes (x, y) out of walls and pillars it overlaps; a few passes settle corners
  void push_out(double& x, double& y) const;
  void move(double dx, double dy);

  Maze maze_;
  Pose pose_;
  WorldConfig config_;
};

}  // namespace wm::sim
