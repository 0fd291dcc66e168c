#include "sim/policy.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace wm::sim {

namespace {

constexpr double kRadToDeg = 180.0 / std::numbers::pi;
constexpr double kDegToRad = std::numbers::pi / 180.0;
constexpr int kDx[4] = {1, 0, -1, 0};
constexpr int kDy[4] = {0, 1, 0, -1};

// quarter degrees are exact in float and print exactly in action scripts
double quarter(double v) { return std::round(v * 4.0) / 4.0; }

double wrap180(double d) {
  double w = std::fmod(d + 180.0, 360.0);
  if (w < 0.0) w += 360.0;
  return w - 180.0;
}

// how far the body can move from the pose along (vx, vy) before touching anything, up to limit
double free_distance(const World& world, double vx, double vy, double limit) {
  const Pose& p = world.pose();
  constexpr double kStep = 0.04;
  for (double s = kStep; s <= limit; s += kStep) {
    if (world.collides(p.x + vx * s, p.y + vy * s)) return s - kStep;
  }
  return limit;
}

// free tiles among the four neighbours: 3 or 4 at junctions and in rooms
int open_sides(const World& world, std::pair<int, int> t) {
  int open = 0;
  for (int d = 0; d < 4; ++d) open += world.maze().solid(t.first + kDx[d], t.second + kDy[d]) ? 0 : 1;
  return open;
}

}  // namespace

ExplorationPolicy::ExplorationPolicy(uint64_t seed) : rng_(derive_seed(seed, kPolicyStream)) {}

Action ExplorationPolicy::next(const World& world) {
  record(world);
  Action action;
  // a segment that ends at once yields to the next; the bound keeps a bad plan from spinning here
  for (int attempt = 0; attempt < 16; ++attempt) {
    if (queue_.empty()) plan(world);
    if (produce(world, queue_.front(), action)) {
      ++frame_;
      return action;
    }
    queue_.pop_front();
    action = Action{};
  }
  ++frame_;
  return Action{};
}

void ExplorationPolicy::record(const World& world) {
  const TileXY t{static_cast<int>(std::floor(world.pose().x)), static_cast<int>(std::floor(world.pose().y))};
  if (!trail_.empty() && trail_.back() == t) return;
  trail_.push_back(t);
  visits_.emplace_back(t, frame_);
  // only the recent past matters for walking back; keep memory bounded on long runs
  if (trail_.size() > 512) trail_.erase(trail_.begin(), trail_.begin() + 256);
  if (visits_.size() > 4096) visits_.erase(visits_.begin(), visits_.begin() + 2048);
}

std::vector<int> ExplorationPolicy::distances(const World& world, TileXY from) const {
  const Maze& maze = world.maze();
  const int n = maze.size();
  std::vector<int> dist(static_cast<size_t>(n) * n, -1);
  if (!maze.in_bounds(from.first, from.second)) return dist;
  std::deque<TileXY> open;
  dist[from.second * n + from.first] = 0;
  open.push_back(from);
  while (!open.empty()) {
    const auto [x, y] = open.front();
    open.pop_front();
    for (int d = 0; d < 4; ++d) {
      const int nx = x + kDx[d];
      const int ny = y + kDy[d];
      if (maze.solid(nx, ny) || maze.pillar_tile(nx, ny) || dist[ny * n + nx] >= 0) continue;
      dist[ny * n + nx] = dist[y * n + x] + 1;
      open.emplace_back(nx, ny);
    }
  }
  return dist;
}

std::vector<ExplorationPolicy::TileXY> ExplorationPolicy::path_to(const World& world, TileXY from, TileXY target,
                                                                  const std::vector<uint8_t>* blocked) const {
  const Maze& maze = world.maze();
  const int n = maze.size();
  std::vector<TileXY> path;
  if (!maze.in_bounds(from.first, from.second) || !maze.in_bounds(target.first, target.second)) return path;
  std::vector<int> parent(static_cast<size_t>(n) * n, -2);
  std::deque<TileXY> open;
  parent[from.second * n + from.first] = -1;
  open.push_back(from);
  bool found = from == target;
  while (!open.empty() && !found) {
    const auto [x, y] = open.front();
    open.pop_front();
    for (int d = 0; d < 4; ++d) {
      const int nx = x + kDx[d];
      const int ny = y + kDy[d];
      if (maze.solid(nx, ny) || maze.pillar_tile(nx, ny) || parent[ny * n + nx] != -2) continue;
      if (blocked != nullptr && (*blocked)[ny * n + nx] && TileXY{nx, ny} != target) continue;
      parent[ny * n + nx] = y * n + x;
      if (TileXY{nx, ny} == target) {
        found = true;
        break;
      }
      open.emplace_back(nx, ny);
    }
  }
  if (!found || from == target) return path;
  for (int at = target.second * n + target.first; at != from.second * n + from.first; at = parent[at]) {
    path.emplace_back(at % n, at / n);
  }
  std::reverse(path.begin(), path.end());
  return path;
}

double ExplorationPolicy::turn_step() {
  const double u = rng_.uniform();
  if (u < 0.08) return quarter(rng_.uniform(1.5, 3.0));
  if (u < 0.90) return quarter(rng_.uniform(3.0, 15.0));
  return quarter(rng_.uniform(15.0, 30.0));
}

void ExplorationPolicy::push_walk(const World& world, std::vector<TileXY> path, bool hold_yaw) {
  // long walks are cut into legs of a few tiles with short glances, nods and
  // pauses between them, so that a short episode still sees many behaviours
  size_t begin = 0;
  while (begin < path.size()) {
    const size_t end = std::min(path.size(), begin + static_cast<size_t>(rng_.range(3, 8)));
    Segment s;
    s.kind = SegmentKind::kWalk;
    s.hold_yaw = hold_yaw;
    s.waypoints.assign(path.begin() + static_cast<std::ptrdiff_t>(begin), path.begin() + static_cast<std::ptrdiff_t>(end));
    s.strafe_correct = rng_.chance(0.25);
    s.step = quarter(rng_.uniform(6.0, 15.0));
    s.frames = 25 * static_cast<int>(end - begin) + 60;
    queue_.push_back(std::move(s));
    begin = end;
    if (begin < path.size() && rng_.chance(0.45)) push_interjection(open_sides(world, path[end - 1]) >= 3);
  }
}

void ExplorationPolicy::push_interjection(bool junction) {
  const double u = rng_.uniform();
  if (u < 0.35) {
    const double dir = rng_.chance(0.5) ? 1.0 : -1.0;
    const double a = quarter(rng_.uniform(20.0, 70.0));
    push_turn(dir * a);
    push_pause(rng_.range(0, 3));
    push_turn(-dir * a);
  } else if (u < 0.65) {
    plan_nod();
  } else if (u < 0.80) {
    push_pause(rng_.range(2, 8));
  } else if (!junction) {
    // in a corridor a full turn would mostly look at the wall a step away
    push_pause(rng_.range(1, 4));
  } else if (u < 0.90) {
    push_turn(rng_.chance(0.5) ? 360.0 : -360.0);
  } else {
    plan_look_back();
  }
}

void ExplorationPolicy::push_turn(double degrees) {
  Segment s;
  s.kind = SegmentKind::kTurn;
  s.remaining = quarter(degrees);
  s.step = turn_step();
  queue_.push_back(std::move(s));
}

void ExplorationPolicy::push_pause(int frames) {
  if (frames <= 0) return;
  Segment s;
  s.kind = SegmentKind::kPause;
  s.frames = frames;
  queue_.push_back(std::move(s));
}

void ExplorationPolicy::plan(const World& world) {
  // weights of the behaviours; walking dominates, the rest make revisits and views from new angles
  enum {
    kExplore, kLoop, kRevisit, kTurnBack, kDrift, kSpin, kLookAround, kLookBack, kPause, kNod, kStrafe, kBackward, kCount
  };
  static constexpr int kWeights[kCount] = {22, 10, 9, 12, 12, 5, 8, 5, 4, 12, 6, 6};
  int total = 0;
  for (int w : kWeights) total += w;
  int pick = static_cast<int>(rng_.below(total));
  int choice = 0;
  while (pick >= kWeights[choice]) pick -= kWeights[choice++];

  const TileXY cur{static_cast<int>(std::floor(world.pose().x)), static_cast<int>(std::floor(world.pose().y))};
  bool ok = true;
  switch (choice) {
    case kExplore: ok = plan_explore(world); break;
    case kLoop: ok = plan_loop(world); break;
    case kRevisit: ok = plan_revisit(world); break;
    case kTurnBack: ok = plan_turn_back(world); break;
    case kDrift: ok = plan_drift(world); break;
    // turning on the spot in a corridor mostly shows the wall a step away; prefer
    // junctions and rooms for it, but keep some corridor turns
    case kSpin:
    case kLookAround:
    case kLookBack:
      if (open_sides(world, cur) < 3 && rng_.chance(0.6)) {
        ok = false;
        break;
      }
      if (choice == kLookAround) {
        plan_look_around();
      } else if (choice == kLookBack) {
        plan_look_back();
      } else {
        Segment s;
        s.kind = SegmentKind::kTurn;
        s.remaining = rng_.chance(0.5) ? 360.0 : -360.0;
        s.step = quarter(rng_.uniform(6.0, 15.0));
        queue_.push_back(std::move(s));
      }
      break;
    case kPause: push_pause(rng_.range(3, 15)); break;
    case kNod: plan_nod(); break;
    case kStrafe: ok = plan_strafe(world); break;
    case kBackward: ok = plan_backward(world); break;
    default: ok = false; break;
  }
  if (!ok && !plan_explore(world)) push_pause(rng_.range(3, 8));
  if (queue_.empty()) push_pause(3);
}

bool ExplorationPolicy::plan_explore(const World& world) {
  const Maze& maze = world.maze();
  const int n = maze.size();
  const TileXY cur{static_cast<int>(std::floor(world.pose().x)), static_cast<int>(std::floor(world.pose().y))};
  const std::vector<int> dist = distances(world, cur);
  std::vector<uint8_t> seen(dist.size(), 0);
  for (const auto& v : visits_) seen[v.first.second * n + v.first.first] = 1;
  std::vector<TileXY> fresh;
  std::vector<TileXY> any;
  for (int y = 1; y < n; y += 2) {
    for (int x = 1; x < n; x += 2) {
      const int d = dist[y * n + x];
      if (d < 4 || d > 14) continue;
      any.emplace_back(x, y);
      if (!seen[y * n + x]) fresh.emplace_back(x, y);
    }
  }
  const std::vector<TileXY>& pool = (!fresh.empty() && rng_.chance(0.75)) ? fresh : any;
  if (pool.empty()) return false;
  const TileXY target = pool[rng_.below(pool.size())];
  push_walk(world, path_to(world, cur, target, nullptr));
  // now and then stop at the goal and look around, where there is something to see
  if (rng_.chance(0.35) && open_sides(world, target) >= 3) plan_look_around();
  return true;
}

bool ExplorationPolicy::plan_loop(const World& world) {
  const Maze& maze = world.maze();
  const int n = maze.size();
  const TileXY cur{static_cast<int>(std::floor(world.pose().x)), static_cast<int>(std::floor(world.pose().y))};
  const std::vector<int> dist = distances(world, cur);
  std::vector<TileXY> pool;
  for (int y = 1; y < n; y += 2) {
    for (int x = 1; x < n; x += 2) {
      const int d = dist[y * n + x];
      if (d >= 5 && d <= 10) pool.emplace_back(x, y);
    }
  }
  if (pool.empty()) return false;
  const TileXY target = pool[rng_.below(pool.size())];
  std::vector<TileXY> out = path_to(world, cur, target, nullptr);
  if (out.empty()) return false;
  // come back another way if the maze has one (block the way out), else retrace it
  std::vector<uint8_t> blocked(static_cast<size_t>(n) * n, 0);
  for (size_t i = 0; i + 1 < out.size(); ++i) blocked[out[i].second * n + out[i].first] = 1;
  std::vector<TileXY> back = path_to(world, target, cur, &blocked);
  if (back.empty() || back.size() > 3 * out.size()) {
    back.assign(out.rbegin() + 1, out.rend());
    back.push_back(cur);
  }
  out.insert(out.end(), back.begin(), back.end());
  push_walk(world, std::move(out));
  return true;
}

bool ExplorationPolicy::plan_revisit(const World& world) {
  const TileXY cur{static_cast<int>(std::floor(world.pose().x)), static_cast<int>(std::floor(world.pose().y))};
  std::vector<TileXY> pool;
  for (const auto& [tile, frame] : visits_) {
    if (frame <= frame_ - 40 && tile != cur) pool.push_back(tile);
  }
  if (pool.empty()) return false;
  std::vector<TileXY> path = path_to(world, cur, pool[rng_.below(pool.size())], nullptr);
  if (path.empty() || path.size() > 24) return false;
  push_walk(world, std::move(path));
  return true;
}

bool ExplorationPolicy::plan_turn_back(const World& world) {
  if (trail_.size() < 4) return false;
  const TileXY cur = trail_.back();
  const int k = rng_.range(3, std::min<int>(10, static_cast<int>(trail_.size()) - 1));
  const TileXY target = trail_[trail_.size() - 1 - k];
  if (rng_.chance(0.3)) {
    // back up along the way we came, still facing forward
    push_walk(world, path_to(world, cur, target, nullptr), /*hold_yaw=*/true);
    return true;
  }
  push_turn(rng_.chance(0.5) ? 180.0 : -180.0);
  if (rng_.chance(0.4)) push_pause(rng_.range(1, 5));
  push_walk(world, path_to(world, cur, target, nullptr));
  return true;
}

bool ExplorationPolicy::plan_drift(const World& world) {
  const Maze& maze = world.maze();
  const int n = maze.size();
  const TileXY cur{static_cast<int>(std::floor(world.pose().x)), static_cast<int>(std::floor(world.pose().y))};
  const std::vector<int> dist = distances(world, cur);
  std::vector<TileXY> pool;
  for (int y = 0; y < n; ++y) {
    for (int x = 0; x < n; ++x) {
      const int d = dist[y * n + x];
      if (d >= 2 && d <= 6) pool.emplace_back(x, y);
    }
  }
  if (pool.empty()) return false;
  push_walk(world, path_to(world, cur, pool[rng_.below(pool.size())], nullptr), /*hold_yaw=*/true);
  return true;
}

void ExplorationPolicy::plan_look_around() {
  const double dir = rng_.chance(0.5) ? 1.0 : -1.0;
  const double a = quarter(rng_.uniform(40.0, 100.0));
  push_turn(dir * a);
  push_pause(rng_.range(1, 6));
  push_turn(-dir * 2.0 * a);
  push_pause(rng_.range(1, 6));
  push_turn(dir * a);
}

void ExplorationPolicy::plan_look_back() {
  const double dir = rng_.chance(0.5) ? 1.0 : -1.0;
  push_turn(dir * 180.0);
  push_pause(rng_.range(3, 10));
  // either turn back the same way or complete the circle
  push_turn(rng_.chance(0.5) ? -dir * 180.0 : dir * 180.0);
}

void ExplorationPolicy::plan_nod() {
  const double step = quarter(rng_.uniform(1.0, 3.0));
  Segment s;
  s.kind = SegmentKind::kPitch;
  s.step = step;
  s.target = (rng_.chance(0.5) ? 1.0 : -1.0) * quarter(rng_.uniform(4.0, 14.0));
  queue_.push_back(s);
  push_pause(rng_.range(0, 4));
  s.target = 0.0;
  queue_.push_back(std::move(s));
}

bool ExplorationPolicy::plan_strafe(const World& world) {
  const double a = world.pose().yaw_deg * kDegToRad;
  const double rx = -std::sin(a);
  const double ry = std::cos(a);
  const bool right_first = rng_.chance(0.5);
  const double sign = right_first ? 1.0 : -1.0;
  const double room = free_distance(world, sign * rx, sign * ry, 1.0);
  const int frames = std::min(rng_.range(3, 8), static_cast<int>((room - 0.02) / world.config().strafe_speed));
  if (frames < 2) return false;
  Segment s;
  s.kind = SegmentKind::kKeys;
  s.keys = right_first ? kKeyD : kKeyA;
  s.frames = frames;
  queue_.push_back(s);
  s.keys = right_first ? kKeyA : kKeyD;
  queue_.push_back(std::move(s));
  return true;
}

bool ExplorationPolicy::plan_backward(const World& world) {
  const double a = world.pose().yaw_deg * kDegToRad;
  const double room = free_distance(world, -std::cos(a), -std::sin(a), 1.6);
  const int frames = std::min(rng_.range(3, 12), static_cast<int>((room - 0.02) / world.config().forward_speed));
  if (frames < 2) return false;
  Segment s;
  s.kind = SegmentKind::kKeys;
  s.keys = kKeyS;
  s.frames = frames;
  queue_.push_back(std::move(s));
  return true;
}

bool ExplorationPolicy::produce(const World& world, Segment& seg, Action& action) {
  const Pose& pose = world.pose();
  switch (seg.kind) {
    case SegmentKind::kPause:
      return seg.frames-- > 0;
    case SegmentKind::kTurn: {
      if (seg.remaining == 0.0) return false;
      // ease in: the first frame of a turn is at most half the step
      const double step = seg.started == 0 ? std::max(1.0, quarter(seg.step * 0.5)) : seg.step;
      const double v = std::copysign(std::min(std::fabs(seg.remaining), step), seg.remaining);
      seg.remaining -= v;
      ++seg.started;
      action.mouse[0] = static_cast<float>(v);
      return true;
    }
    case SegmentKind::kPitch: {
      const double diff = seg.target - pose.pitch_deg;
      const double v = quarter(std::clamp(diff, -seg.step, seg.step));
      if (v == 0.0) return false;
      // the world clamps pitch; stop rather than push against the limit
      if (std::fabs(pose.pitch_deg + v) > world.config().pitch_limit) return false;
      action.mouse[1] = static_cast<float>(v);
      return true;
    }
    case SegmentKind::kKeys: {
      if (seg.frames-- <= 0) return false;
      const double a = pose.yaw_deg * kDegToRad;
      const double fwd = ((seg.keys & kKeyW) ? 1.0 : 0.0) - ((seg.keys & kKeyS) ? 1.0 : 0.0);
      const double side = ((seg.keys & kKeyD) ? 1.0 : 0.0) - ((seg.keys & kKeyA) ? 1.0 : 0.0);
      const double dx = std::cos(a) * fwd * world.config().forward_speed - std::sin(a) * side * world.config().strafe_speed;
      const double dy = std::sin(a) * fwd * world.config().forward_speed + std::cos(a) * side * world.config().strafe_speed;
      // do not rub against walls
      if (world.collides(pose.x + dx, pose.y + dy)) return false;
      action.keys = seg.keys;
      return true;
    }
    case SegmentKind::kWalk: {
      double dx = 0.0;
      double dy = 0.0;
      double dist = 0.0;
      while (!seg.waypoints.empty()) {
        const auto [tx, ty] = seg.waypoints.front();
        dx = tx + 0.5 - pose.x;
        dy = ty + 0.5 - pose.y;
        dist = std::sqrt(dx * dx + dy * dy);
        const bool last = seg.waypoints.size() == 1;
        // cutting corners a little keeps the view down the corridor rather than on the wall ahead
        if (dist >= (last ? 0.2 : 0.45)) break;
        seg.waypoints.pop_front();
        seg.best = 1e9;
        seg.stale = 0;
      }
      if (seg.waypoints.empty() || seg.frames-- <= 0) return false;
      if (dist < seg.best - 1e-3) {
        seg.best = dist;
        seg.stale = 0;
      } else if (++seg.stale > 30) {
        return false;  // stuck (should not happen on a free path); plan something else
      }
      const double err = wrap180(std::atan2(dy, dx) * kRadToDeg - pose.yaw_deg);
      const double a = pose.yaw_deg * kDegToRad;
      const double lateral = -dx * std::sin(a) + dy * std::cos(a);  // > 0: the waypoint is to the right
      if (seg.hold_yaw) {
        // the key combination closest to the waypoint's direction, in 45 degree sectors
        static constexpr uint32_t kSectorKeys[8] = {kKeyW,          kKeyW | kKeyD, kKeyD, kKeyS | kKeyD,
                                                    kKeyS,          kKeyS | kKeyA, kKeyA, kKeyW | kKeyA};
        const int sector = (static_cast<int>(std::lround(err / 45.0)) + 8) % 8;
        action.keys = kSectorKeys[sector];
        return true;
      }
      double yaw = 0.0;
      uint32_t keys = 0;
      if (seg.strafe_correct && std::fabs(err) < 12.0) {
        if (lateral > 0.05) keys |= kKeyD;
        if (lateral < -0.05) keys |= kKeyA;
      } else if (std::fabs(err) >= 2.0) {
        // a dead band keeps straight walking free of tiny yaw jitter
        yaw = quarter(std::clamp(err, -seg.step, seg.step));
      }
      if (std::fabs(err - yaw) < 50.0) keys |= kKeyW;
      action.keys = keys;
      action.mouse[0] = static_cast<float>(yaw);
      return true;
    }
  }
  return false;
}

absl::StatusOr<std::vector<Action>> policy_actions(uint64_t seed, int count, const MazeConfig& maze_config,
                                                   const WorldConfig& world_config) {
  if (count < 0) return absl::InvalidArgumentError(absl::StrCat("action count ", count, " is negative"));
  auto world = World::from_seed(seed, maze_config, world_config);
  if (!world.ok()) return world.status();
  ExplorationPolicy policy(seed);
  std::vector<Action> actions;
  actions.reserve(count);
  for (int i = 0; i < count; ++i) {
    const Action a = policy.next(*world);
    world->step(a);
    actions.push_back(a);
  }
  return actions;
}

}  // namespace wm::sim
