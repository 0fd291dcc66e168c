// First-person view of the maze: one DDA ray per column through the tile grid,
// walls one tile high seen from an eye half a tile above the floor, floor cast
// per pixel, a sky with a sun above, and pillars as vertical cylinders that
// are depth-tested against the walls per pixel. Pitch shifts the horizon
// (y-shearing) by focal * tan(pitch). Each output pixel averages
// supersample^2 samples so edges are smooth at 64x64.
//
// Deterministic: the same maze, pose and config give the same bytes. A
// Raycaster holds scratch buffers; use one per thread.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "sim/maze.h"
#include "sim/world.h"

namespace wm::sim {

struct RenderConfig {
  int width = 64;          // output pixels (8..2048)
  int height = 64;         // output pixels (8..2048)
  double fov_deg = 70.0;   // horizontal field of view (30..120); vertical follows from square pixels
  int supersample = 2;     // samples per pixel side (1..4)
  absl::Status validate() const;
};

class Raycaster {
 public:
  static absl::StatusOr<Raycaster> create(const RenderConfig& config);

  // writes the view from pose to out: [height, width, 3] RGB8, row-major; a
  // non-finite or far-off pose gives a black frame
  void render(const Maze& maze, const Pose& pose, uint8_t* out);
  // the same into a vector of the right size
  std::vector<uint8_t> render(const Maze& maze, const Pose& pose);

  const RenderConfig& config() const { return config_; }
  size_t frame_bytes() const { return static_cast<size_t>(config_.width) * config_.height * 3; }

 private:
  explicit Raycaster(const RenderConfig& config);

  RenderConfig config_;
  std::vector<float> accum_;  // [height, width, 3] sums of samples
};

}  // namespace wm::sim
