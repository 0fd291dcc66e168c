#include "sim/world.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "sim/rng.h"

namespace wm::sim {

absl::Status WorldConfig::validate() const {
  if (!(radius >= 0.05 && radius <= 0.45)) return absl::InvalidArgumentError(absl::StrCat("radius ", radius, " not in [0.05, 0.45]"));
  if (!(forward_speed > 0.0 && forward_speed <= 0.5) || !(strafe_speed > 0.0 && strafe_speed <= 0.5)) {
    return absl::InvalidArgumentError("speeds must be in (0, 0.5] tiles per frame");
  }
  if (!(pitch_limit >= 0.0 && pitch_limit <= 60.0)) return absl::InvalidArgumentError("pitch_limit not in [0, 60]");
  return absl::OkStatus();
}

namespace {

constexpr double kDegToRad = std::numbers::pi / 180.0;
// bodies are pushed this far past contact so that the overlap test stays false after rounding
constexpr double kSkin = 1e-7;

double wrap_degrees(double deg) {
  double w = std::fmod(deg, 360.0);
  if (w < 0.0) w += 360.0;
  if (w >= 360.0) w -= 360.0;
  return w;
}

}  // namespace

Pose start_pose(const Maze& maze, uint64_t seed) {
  Rng rng(derive_seed(seed, kStartStream));
  std::vector<std::pair<int, int>> cells;
  for (int cy = 0; cy < maze.cells(); ++cy) {
    for (int cx = 0; cx < maze.cells(); ++cx) {
      const int tx = 2 * cx + 1;
      const int ty = 2 * cy + 1;
      if (!maze.solid(tx, ty) && !maze.in_room(tx, ty)) cells.emplace_back(tx, ty);
    }
  }
  Pose p;
  if (cells.empty()) {
    // only reachable with every cell inside a room; the room corner is still free of the pillar
    p.x = 1.5;
    p.y = 1.5;
    return p;
  }
  const auto [tx, ty] = cells[rng.below(cells.size())];
  p.x = tx + 0.5;
  p.y = ty + 0.5;
  // face an opening so that frame 0 looks down a corridor rather than at a wall
  int open[4];
  int count = 0;
  const int dx[4] = {1, 0, -1, 0};
  const int dy[4] = {0, 1, 0, -1};
  for (int d = 0; d < 4; ++d) {
    if (!maze.solid(tx + dx[d], ty + dy[d])) open[count++] = d;
  }
  const int dir = count > 0 ? open[rng.below(count)] : 0;
  p.yaw_deg = wrap_degrees(90.0 * dir + rng.range(-25, 25));
  return p;
}

absl::StatusOr<World> World::from_seed(uint64_t seed, const MazeConfig& maze_config, const WorldConfig& config) {
  auto maze = Maze::generate(seed, maze_config);
  if (!maze.ok()) return maze.status();
  const Pose start = start_pose(*maze, seed);
  return create(*std::move(maze), start, config);
}

absl::StatusOr<World> World::create(Maze maze, const Pose& start, const WorldConfig& config) {
  if (auto st = config.validate(); !st.ok()) return st;
  if (!std::isfinite(start.x) || !std::isfinite(start.y) || !std::isfinite(start.yaw_deg) ||
      !std::isfinite(start.pitch_deg)) {
    return absl::InvalidArgumentError("start pose is not finite");
  }
  Pose p = start;
  p.yaw_deg = wrap_degrees(p.yaw_deg);
  p.pitch_deg = std::clamp(p.pitch_deg, -config.pitch_limit, config.pitch_limit);
  World w(std::move(maze), p, config);
  if (w.collides(p.x, p.y)) {
    return absl::InvalidArgumentError(absl::StrCat("start position (", p.x, ", ", p.y, ") overlaps a wall or pillar"));
  }
  return w;
}

bool World::collides(double x, double y) const {
  const double r = config_.radius;
  if (!std::isfinite(x) || !std::isfinite(y)) return true;
  const int x0 = static_cast<int>(std::floor(x - r));
  const int x1 = static_cast<int>(std::floor(x + r));
  const int y0 = static_cast<int>(std::floor(y - r));
  const int y1 = static_cast<int>(std::floor(y + r));
  for (int ty = y0; ty <= y1; ++ty) {
    for (int tx = x0; tx <= x1; ++tx) {
      if (!maze_.solid(tx, ty)) continue;
      const double cx = std::clamp(x, static_cast<double>(tx), tx + 1.0);
      const double cy = std::clamp(y, static_cast<double>(ty), ty + 1.0);
      if ((x - cx) * (x - cx) + (y - cy) * (y - cy) < r * r) return true;
    }
  }
  for (const Pillar& p : maze_.pillars()) {
    const double rr = r + p.radius;
    if ((x - p.x) * (x - p.x) + (y - p.y) * (y - p.y) < rr * rr) return true;
  }
  return false;
}

void World::push_out(double& x, double& y) const {
  const double r = config_.radius;
  // resolve the deepest overlap first: along a flat wall made of two tiles the
  // face of one is deeper than the corner of the other, and pushing out of the
  // corner first would add a sideways kick
  for (int pass = 0; pass < 8; ++pass) {
    double best_d = 1e30;
    double best_ex = 0.0;
    double best_ey = 0.0;
    double best_reach = 0.0;  // distance the centre must keep from the contact point
    const int x0 = static_cast<int>(std::floor(x - r));
    const int x1 = static_cast<int>(std::floor(x + r));
    const int y0 = static_cast<int>(std::floor(y - r));
    const int y1 = static_cast<int>(std::floor(y + r));
    for (int ty = y0; ty <= y1; ++ty) {
      for (int tx = x0; tx <= x1; ++tx) {
        if (!maze_.solid(tx, ty)) continue;
        const double cx = std::clamp(x, static_cast<double>(tx), tx + 1.0);
        const double cy = std::clamp(y, static_cast<double>(ty), ty + 1.0);
        const double ex = x - cx;
        const double ey = y - cy;
        const double d = std::sqrt(ex * ex + ey * ey);
        // a centre inside the tile has no contact normal; move() then rejects the step
        if (d >= r || d < 1e-12) continue;
        if (r - d > best_reach - best_d || best_d == 1e30) {
          best_d = d;
          best_ex = ex;
          best_ey = ey;
          best_reach = r;
        }
      }
    }
    for (const Pillar& p : maze_.pillars()) {
      const double ex = x - p.x;
      const double ey = y - p.y;
      const double rr = r + p.radius;
      const double d = std::sqrt(ex * ex + ey * ey);
      if (d >= rr || d < 1e-12) continue;
      if (rr - d > best_reach - best_d || best_d == 1e30) {
        best_d = d;
        best_ex = ex;
        best_ey = ey;
        best_reach = rr;
      }
    }
    if (best_d == 1e30) return;
    const double push = (best_reach - best_d + kSkin) / best_d;
    x += best_ex * push;
    y += best_ey * push;
  }
}

void World::move(double dx, double dy) {
  // try the full step, then each axis alone; a step that still overlaps after
  // pushing out is dropped, so the body never ends up inside a wall
  const double cand[3][2] = {{dx, dy}, {dx, 0.0}, {0.0, dy}};
  for (const auto& c : cand) {
    if (c[0] == 0.0 && c[1] == 0.0) continue;
    double x = pose_.x + c[0];
    double y = pose_.y + c[1];
    push_out(x, y);
    if (!collides(x, y)) {
      pose_.x = x;
      pose_.y = y;
      return;
    }
  }
}

void World::step(const Action& action) {
  const float yaw = action.mouse[0];
  const float pitch = action.mouse[1];
  if (std::isfinite(yaw)) pose_.yaw_deg = wrap_degrees(pose_.yaw_deg + static_cast<double>(yaw));
  if (std::isfinite(pitch)) {
    pose_.pitch_deg = std::clamp(pose_.pitch_deg + static_cast<double>(pitch), -config_.pitch_limit, config_.pitch_limit);
  }
  const double fwd = ((action.keys & kKeyW) ? 1.0 : 0.0) - ((action.keys & kKeyS) ? 1.0 : 0.0);
  const double side = ((action.keys & kKeyD) ? 1.0 : 0.0) - ((action.keys & kKeyA) ? 1.0 : 0.0);
  if (fwd == 0.0 && side == 0.0) return;
  const double a = pose_.yaw_deg * kDegToRad;
  const double fx = std::cos(a);
  const double fy = std::sin(a);
  // right of the heading is (-sin, cos) because y grows south
  const double dx = fx * fwd * config_.forward_speed - fy * side * config_.strafe_speed;
  const double dy = fy * fwd * config_.forward_speed + fx * side * config_.strafe_speed;
  move(dx, dy);
}

}  // namespace wm::sim
