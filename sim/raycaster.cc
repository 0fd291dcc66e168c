#include "sim/raycaster.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "sim/textures.h"

namespace wm::sim {

absl::Status RenderConfig::validate() const {
  if (width < 8 || width > 2048 || height < 8 || height > 2048) {
    return absl::InvalidArgumentError(absl::StrCat("frame size ", width, "x", height, " is not within 8..2048"));
  }
  if (!(fov_deg >= 30.0 && fov_deg <= 120.0)) return absl::InvalidArgumentError(absl::StrCat("fov ", fov_deg, " is not in 30..120"));
  if (supersample < 1 || supersample > 4) return absl::InvalidArgumentError(absl::StrCat("supersample ", supersample, " is not in 1..4"));
  return absl::OkStatus();
}

namespace {

constexpr double kDegToRad = std::numbers::pi / 180.0;

// brightness of a wall face by the direction it faces: x faces lighter than
// y faces, and each pair split once more so that every direction reads differently
float face_shade(int side, int step) {
  if (side == 0) return step > 0 ? 0.90f : 1.0f;  // step > 0: the face looks west
  return step > 0 ? 0.66f : 0.76f;                // step > 0: the face looks north
}

struct WallHit {
  double perp = 1e9;  // distance along the view direction
  int side = 0;       // 0: face normal along x, 1: along y
  int step = 1;       // direction the ray stepped across the face
  int tx = 0;
  int ty = 0;
  double u = 0.0;     // position across the face, 0..1, left to right as seen
};

WallHit cast_ray(const Maze& maze, double px, double py, double rx, double ry) {
  WallHit hit;
  int mx = static_cast<int>(std::floor(px));
  int my = static_cast<int>(std::floor(py));
  const double ddx = rx == 0.0 ? 1e30 : std::fabs(1.0 / rx);
  const double ddy = ry == 0.0 ? 1e30 : std::fabs(1.0 / ry);
  const int sx = rx < 0 ? -1 : 1;
  const int sy = ry < 0 ? -1 : 1;
  double side_x = rx < 0 ? (px - mx) * ddx : (mx + 1.0 - px) * ddx;
  double side_y = ry < 0 ? (py - my) * ddy : (my + 1.0 - py) * ddy;
  // the grid is enclosed by walls, so this ends within 2 * size steps; the cap guards bad poses
  const int max_steps = 4 * maze.size() + 8;
  int side = 0;
  for (int i = 0; i < max_steps; ++i) {
    if (side_x < side_y) {
      side_x += ddx;
      mx += sx;
      side = 0;
    } else {
      side_y += ddy;
      my += sy;
      side = 1;
    }
    if (maze.solid(mx, my)) break;
  }
  hit.side = side;
  hit.step = side == 0 ? sx : sy;
  hit.perp = side == 0 ? side_x - ddx : side_y - ddy;
  hit.perp = std::max(hit.perp, 1e-4);
  hit.tx = mx;
  hit.ty = my;
  double u = side == 0 ? py + hit.perp * ry : px + hit.perp * rx;
  u -= std::floor(u);
  // mirror so that u runs left to right as seen from the ray's side
  if ((side == 0 && sx < 0) || (side == 1 && sy > 0)) u = 1.0 - u;
  hit.u = u;
  return hit;
}

struct PillarHit {
  double t = 0.0;    // distance along the view direction
  float light = 0;   // cosine of the surface normal with the sun direction
  int colour = 0;
};

}  // namespace

Raycaster::Raycaster(const RenderConfig& config) : config_(config) {
  accum_.assign(static_cast<size_t>(config.width) * config.height * 3, 0.0f);
}

absl::StatusOr<Raycaster> Raycaster::create(const RenderConfig& config) {
  if (auto st = config.validate(); !st.ok()) return st;
  return Raycaster(config);
}

std::vector<uint8_t> Raycaster::render(const Maze& maze, const Pose& pose) {
  std::vector<uint8_t> out(frame_bytes());
  render(maze, pose, out.data());
  return out;
}

void Raycaster::render(const Maze& maze, const Pose& pose, uint8_t* out) {
  if (!std::isfinite(pose.x) || !std::isfinite(pose.y) || !std::isfinite(pose.yaw_deg) || !std::isfinite(pose.pitch_deg) ||
      std::fabs(pose.x) > 1e6 || std::fabs(pose.y) > 1e6) {
    // worlds never make such poses; a flat frame beats undefined float-to-int casts
    std::fill(out, out + frame_bytes(), uint8_t{0});
    return;
  }
  const int ss = config_.supersample;
  const int out_w = config_.width;
  const int out_h = config_.height;
  const int w = out_w * ss;
  const int h = out_h * ss;
  const double tan_half = std::tan(config_.fov_deg * 0.5 * kDegToRad);
  const double focal = (w * 0.5) / tan_half;  // internal pixels per unit of tangent
  const float focal_out = static_cast<float>(focal / ss);
  const double cam_per_px = 2.0 * tan_half / w;  // change of the camera-plane coordinate per internal column
  const double yaw = pose.yaw_deg * kDegToRad;
  const double dir_x = std::cos(yaw);
  const double dir_y = std::sin(yaw);
  // right of the heading is (-sin, cos) because y grows south
  const double right_x = -dir_y;
  const double right_y = dir_x;
  // looking up moves the horizon down the image
  const double horizon = h * 0.5 + focal * std::tan(pose.pitch_deg * kDegToRad);
  const double sun_yaw = kSunYawDeg * kDegToRad;
  const double sun_el = kSunElevationDeg * kDegToRad;
  const double sun_x = std::cos(sun_el) * std::cos(sun_yaw);
  const double sun_y = std::cos(sun_el) * std::sin(sun_yaw);
  const double sun_z = std::sin(sun_el);
  const double sun_hx = std::cos(sun_yaw);
  const double sun_hy = std::sin(sun_yaw);
  const float inv_samples = 1.0f / static_cast<float>(ss * ss);
  const auto& pillars = maze.pillars();
  std::vector<PillarHit> pillar_hits;
  pillar_hits.reserve(pillars.size());

  std::fill(accum_.begin(), accum_.end(), 0.0f);
  for (int c = 0; c < w; ++c) {
    const double cam = (2.0 * (c + 0.5) / w - 1.0) * tan_half;
    const double rx = dir_x + right_x * cam;
    const double ry = dir_y + right_y * cam;
    const double ray_len = std::sqrt(rx * rx + ry * ry);  // euclidean distance per unit of perp
    const WallHit wall = cast_ray(maze, pose.x, pose.y, rx, ry);
    const double wall_top = horizon - focal * (1.0 - kCameraHeight) / wall.perp;
    const double wall_bottom = horizon + focal * kCameraHeight / wall.perp;
    const bool door = maze.tile(wall.tx, wall.ty) == Tile::kDoor;
    const int region = maze.region(wall.tx, wall.ty);
    const float wall_px_z = static_cast<float>(focal_out / wall.perp);
    // across the face, u moves by perp / |ray . normal| per unit of cam; at grazing angles that is fast
    const double ray_normal = std::max(1e-6, std::fabs(wall.side == 0 ? rx : ry));
    const float wall_px_u = static_cast<float>(1.0 / (wall.perp / ray_normal * cam_per_px * ss));
    const float wall_shade = face_shade(wall.side, wall.step);
    const float wall_dist = static_cast<float>(wall.perp * ray_len);

    // pillars along this ray, drawn far to near so nearer ones cover farther ones
    pillar_hits.clear();
    for (const Pillar& p : pillars) {
      const double ox = pose.x - p.x;
      const double oy = pose.y - p.y;
      const double a = rx * rx + ry * ry;
      const double b = 2.0 * (rx * ox + ry * oy);
      const double k = ox * ox + oy * oy - p.radius * p.radius;
      const double disc = b * b - 4.0 * a * k;
      if (disc < 0.0) continue;
      const double t = (-b - std::sqrt(disc)) / (2.0 * a);
      if (t <= 1e-3) continue;
      const double nx = (pose.x + rx * t - p.x) / p.radius;
      const double ny = (pose.y + ry * t - p.y) / p.radius;
      pillar_hits.push_back({t, static_cast<float>(nx * sun_hx + ny * sun_hy), p.colour});
    }
    std::sort(pillar_hits.begin(), pillar_hits.end(), [](const PillarHit& l, const PillarHit& r) {
      if (l.t != r.t) return l.t > r.t;
      return l.colour < r.colour;  // a deterministic order even on exact ties
    });

    float* col_accum = accum_.data() + static_cast<size_t>(c / ss) * 3;
    for (int r = 0; r < h; ++r) {
      const double y = r + 0.5;
      Rgb colour;
      const bool in_wall = y >= wall_top && y < wall_bottom;
      if (in_wall) {
        const float z = static_cast<float>((wall_bottom - y) / (wall_bottom - wall_top));
        // a little darker towards the floor, like ambient occlusion
        const float shade = wall_shade * (0.82f + 0.18f * z);
        colour = apply_fog(wall_colour(region, door, static_cast<float>(wall.u), z, wall_px_u, wall_px_z) * shade, wall_dist);
      } else if (y > horizon + 1e-6) {
        const double row_dist = focal * kCameraHeight / (y - horizon);
        const double wx = pose.x + rx * row_dist;
        const double wy = pose.y + ry * row_dist;
        const int tx = static_cast<int>(std::floor(wx));
        const int ty = static_cast<int>(std::floor(wy));
        const float depth_px = static_cast<float>(focal_out * kCameraHeight / (row_dist * row_dist));
        const Rgb f = floor_colour(maze, tx, ty, static_cast<float>(wx - tx), static_cast<float>(wy - ty), depth_px);
        colour = apply_fog(f, static_cast<float>(row_dist * ray_len));
      } else {
        const double up = (horizon - y) / focal;
        const double norm = std::sqrt(rx * rx + ry * ry + up * up);
        const double sun_cos = (rx * sun_x + ry * sun_y + up * sun_z) / norm;
        colour = sky_colour(static_cast<float>(up / ray_len), static_cast<float>(sun_cos));
      }
      for (const PillarHit& ph : pillar_hits) {
        if (in_wall && wall.perp < ph.t) continue;
        const double top = horizon - focal * (kPillarHeight - kCameraHeight) / ph.t;
        const double bottom = horizon + focal * kCameraHeight / ph.t;
        if (y < top || y >= bottom) continue;
        const float z = static_cast<float>(kPillarHeight * (bottom - y) / (bottom - top));
        colour = apply_fog(pillar_colour(ph.colour, z, ph.light), static_cast<float>(ph.t * ray_len));
      }
      float* px = col_accum + static_cast<size_t>(r / ss) * out_w * 3;
      px[0] += colour.r;
      px[1] += colour.g;
      px[2] += colour.b;
    }
  }
  const size_t n = accum_.size();
  for (size_t i = 0; i < n; ++i) {
    const float v = std::clamp(accum_[i] * inv_samples, 0.0f, 1.0f);
    out[i] = static_cast<uint8_t>(v * 255.0f + 0.5f);
  }
}

}  // namespace wm::sim
