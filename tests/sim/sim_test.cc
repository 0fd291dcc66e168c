// Tests of the ground-truth maze world: maze generation, movement, rendering,
// the exploration policy, episodes and the npy writer.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "engine/action.h"
#include "gtest/gtest.h"
#include "sim/episode.h"
#include "sim/maze.h"
#include "sim/npy.h"
#include "sim/policy.h"
#include "sim/raycaster.h"
#include "sim/rng.h"
#include "sim/world.h"

namespace wm::sim {
namespace {

Maze make_maze(uint64_t seed) {
  auto m = Maze::generate(seed);
  EXPECT_TRUE(m.ok()) << m.status();
  return *std::move(m);
}

World make_world(uint64_t seed) {
  auto w = World::from_seed(seed);
  EXPECT_TRUE(w.ok()) << w.status();
  return *std::move(w);
}

Raycaster make_raycaster(int width = 64, int height = 64) {
  RenderConfig rc;
  rc.width = width;
  rc.height = height;
  auto r = Raycaster::create(rc);
  EXPECT_TRUE(r.ok()) << r.status();
  return *std::move(r);
}

Action make_action(uint32_t keys, float yaw = 0.0f, float pitch = 0.0f) {
  Action a;
  a.keys = keys;
  a.mouse[0] = yaw;
  a.mouse[1] = pitch;
  return a;
}

// distance from a point to the unit box of tile (tx, ty); an oracle independent of World::collides
double distance_to_tile(double x, double y, int tx, int ty) {
  const double dx = std::max({tx - x, 0.0, x - (tx + 1.0)});
  const double dy = std::max({ty - y, 0.0, y - (ty + 1.0)});
  return std::sqrt(dx * dx + dy * dy);
}

// ---------------------------------------------------------------- maze

TEST(Maze, SameSeedSameMaze) {
  const Maze a = make_maze(42);
  const Maze b = make_maze(42);
  EXPECT_EQ(a.tiles(), b.tiles());
  ASSERT_EQ(a.pillars().size(), b.pillars().size());
  for (size_t i = 0; i < a.pillars().size(); ++i) {
    EXPECT_EQ(a.pillars()[i].x, b.pillars()[i].x);
    EXPECT_EQ(a.pillars()[i].y, b.pillars()[i].y);
    EXPECT_EQ(a.pillars()[i].colour, b.pillars()[i].colour);
  }
  for (int y = 0; y < a.size(); ++y)
    for (int x = 0; x < a.size(); ++x) EXPECT_EQ(a.floor_marker(x, y), b.floor_marker(x, y));
}

TEST(Maze, DifferentSeedsDifferentMazes) {
  EXPECT_NE(make_maze(1).tiles(), make_maze(2).tiles());
  EXPECT_NE(make_maze(0).tiles(), make_maze(uint64_t{1} << 40).tiles());
}

TEST(Maze, EveryFreeTileIsReachable) {
  for (uint64_t seed = 0; seed < 40; ++seed) {
    const Maze m = make_maze(seed);
    const int n = m.size();
    ASSERT_EQ(n, 25);
    int free_tiles = 0;
    int sx = -1;
    int sy = -1;
    for (int y = 0; y < n; ++y) {
      for (int x = 0; x < n; ++x) {
        if (m.solid(x, y)) continue;
        ++free_tiles;
        if (sx < 0) {
          sx = x;
          sy = y;
        }
      }
    }
    // the border is closed so nothing can leave the grid
    for (int i = 0; i < n; ++i) {
      EXPECT_TRUE(m.solid(i, 0) && m.solid(i, n - 1) && m.solid(0, i) && m.solid(n - 1, i)) << "seed " << seed;
    }
    std::vector<uint8_t> seen(static_cast<size_t>(n) * n, 0);
    std::deque<std::pair<int, int>> open{{sx, sy}};
    seen[sy * n + sx] = 1;
    int reached = 0;
    while (!open.empty()) {
      auto [x, y] = open.front();
      open.pop_front();
      ++reached;
      const int dx[4] = {1, -1, 0, 0};
      const int dy[4] = {0, 0, 1, -1};
      for (int d = 0; d < 4; ++d) {
        const int nx = x + dx[d];
        const int ny = y + dy[d];
        if (m.solid(nx, ny) || seen[ny * n + nx]) continue;
        seen[ny * n + nx] = 1;
        open.emplace_back(nx, ny);
      }
    }
    EXPECT_EQ(reached, free_tiles) << "seed " << seed;
  }
}

TEST(Maze, HasLoopsRoomsPillarsDoorsAndMarkers) {
  for (uint64_t seed = 0; seed < 20; ++seed) {
    const Maze m = make_maze(seed);
    const int n = m.size();
    // a spanning tree over 144 cells has 143 openings between cells; extras make loops
    int openings = 0;
    int doors = 0;
    int markers = 0;
    for (int y = 1; y < n - 1; ++y) {
      for (int x = 1; x < n - 1; ++x) {
        if ((x + y) % 2 == 1 && !m.solid(x, y)) ++openings;
        if (m.tile(x, y) == Tile::kDoor) ++doors;
        if (m.floor_marker(x, y) >= 0) ++markers;
      }
    }
    for (int i = 0; i < n; ++i) {
      if (m.tile(i, 0) == Tile::kDoor || m.tile(i, n - 1) == Tile::kDoor) ++doors;
      if (m.tile(0, i) == Tile::kDoor || m.tile(n - 1, i) == Tile::kDoor) ++doors;
    }
    EXPECT_GT(openings, 143 + 10) << "seed " << seed;
    EXPECT_GE(doors, 1) << "seed " << seed;
    EXPECT_EQ(markers, 6) << "seed " << seed;
    ASSERT_EQ(m.pillars().size(), 4u);
    std::set<int> colours;
    std::set<int> regions;
    for (const Pillar& p : m.pillars()) {
      colours.insert(p.colour);
      const int px = static_cast<int>(p.x);
      const int py = static_cast<int>(p.y);
      regions.insert(m.region(px, py));
      // a free ring around every pillar keeps the maze connected for walkers
      for (int dy = -1; dy <= 1; ++dy)
        for (int dx = -1; dx <= 1; ++dx) EXPECT_FALSE(m.solid(px + dx, py + dy)) << "seed " << seed;
    }
    EXPECT_EQ(colours.size(), 4u) << "pillar colours must be unique";
    EXPECT_EQ(regions.size(), 4u) << "one pillar room per quadrant";
  }
}

TEST(Maze, RejectsBadConfig) {
  MazeConfig c;
  c.cells = 2;
  EXPECT_FALSE(Maze::generate(1, c).ok());
  c = MazeConfig{};
  c.rooms = 7;
  EXPECT_FALSE(Maze::generate(1, c).ok());
  c = MazeConfig{};
  c.cells = 5;
  c.extra_openings = 0;
  c.doors = 0;
  c.floor_markers = 0;
  EXPECT_TRUE(Maze::generate(1, c).ok());
}

// ---------------------------------------------------------------- world

TEST(World, StartPoseIsFreeAndWholeDegrees) {
  for (uint64_t seed = 0; seed < 50; ++seed) {
    const World w = make_world(seed);
    EXPECT_FALSE(w.collides(w.pose().x, w.pose().y));
    EXPECT_EQ(w.pose().yaw_deg, std::floor(w.pose().yaw_deg));
    EXPECT_GE(w.pose().yaw_deg, 0.0);
    EXPECT_LT(w.pose().yaw_deg, 360.0);
    EXPECT_EQ(w.pose().pitch_deg, 0.0);
  }
}

TEST(World, NeverEntersAWallUnderRandomActions) {
  for (uint64_t seed = 0; seed < 4; ++seed) {
    World w = make_world(seed);
    Rng rng(seed + 100);
    const double r = w.config().radius;
    Action a;
    for (int i = 0; i < 20000; ++i) {
      // hold a random key set for a few frames, with random turns, so that walls get hit often
      if (i % 6 == 0) a = make_action(static_cast<uint32_t>(rng.below(16)), static_cast<float>(rng.uniform(-45, 45)),
                                      static_cast<float>(rng.uniform(-5, 5)));
      w.step(a);
      const Pose& p = w.pose();
      ASSERT_FALSE(w.collides(p.x, p.y)) << "seed " << seed << " step " << i;
      for (int ty = static_cast<int>(p.y) - 1; ty <= static_cast<int>(p.y) + 1; ++ty) {
        for (int tx = static_cast<int>(p.x) - 1; tx <= static_cast<int>(p.x) + 1; ++tx) {
          if (!w.maze().solid(tx, ty)) continue;
          ASSERT_GE(distance_to_tile(p.x, p.y, tx, ty), r - 1e-9) << "step " << i;
        }
      }
      for (const Pillar& pl : w.maze().pillars()) {
        ASSERT_GE(std::hypot(p.x - pl.x, p.y - pl.y), r + pl.radius - 1e-9) << "step " << i;
      }
    }
  }
}

// a world standing in the north-west corner tile of a pillar room (free tiles east and south)
// whose west side is a straight wall two tiles long
World room_corner_world(double yaw) {
  for (uint64_t seed = 0;; ++seed) {
    Maze m = make_maze(seed);
    for (const Pillar& p : m.pillars()) {
      const int cx = static_cast<int>(p.x) - 1;
      const int cy = static_cast<int>(p.y) - 1;
      if (!m.solid(cx - 1, cy) || !m.solid(cx - 1, cy + 1)) continue;
      auto w = World::create(std::move(m), Pose{cx + 0.5, cy + 0.5, yaw, 0.0});
      EXPECT_TRUE(w.ok()) << w.status();
      return *std::move(w);
    }
  }
}

TEST(World, KeysAndYawConventions) {
  {
    World w = room_corner_world(0.0);  // facing east
    const Pose p0 = w.pose();
    w.step(make_action(kKeyW));
    EXPECT_NEAR(w.pose().x - p0.x, 0.12, 1e-12);
    EXPECT_NEAR(w.pose().y - p0.y, 0.0, 1e-12);
    w.step(make_action(kKeyS));
    EXPECT_NEAR(w.pose().x, p0.x, 1e-12);
    w.step(make_action(kKeyD));  // right of east is south (+y)
    EXPECT_NEAR(w.pose().y - p0.y, 0.08, 1e-12);
    w.step(make_action(kKeyA));
    EXPECT_NEAR(w.pose().y, p0.y, 1e-12);
    w.step(make_action(kKeyW | kKeyS));  // opposite keys cancel
    EXPECT_NEAR(w.pose().x, p0.x, 1e-12);
  }
  {
    World w = room_corner_world(0.0);
    const Pose p0 = w.pose();
    w.step(make_action(kKeyW, 90.0f));  // positive yaw turns right: east -> south, then moves
    EXPECT_EQ(w.pose().yaw_deg, 90.0);
    EXPECT_NEAR(w.pose().x, p0.x, 1e-12);
    EXPECT_NEAR(w.pose().y - p0.y, 0.12, 1e-12);
    w.step(make_action(0, -100.0f));
    EXPECT_EQ(w.pose().yaw_deg, 350.0);  // yaw wraps into [0, 360)
  }
}

TEST(World, SlidesAlongWalls) {
  // walking diagonally into the room's west wall keeps the motion along it
  World w = room_corner_world(180.0);  // facing west, the wall is half a tile ahead
  const Pose p0 = w.pose();
  for (int i = 0; i < 10; ++i) w.step(make_action(kKeyW | kKeyA));  // left of west is south
  EXPECT_NEAR(w.pose().y - p0.y, 0.8, 1e-9);
  EXPECT_NEAR(w.pose().x, std::floor(p0.x) + w.config().radius, 1e-6);
}

TEST(World, PitchIsClamped) {
  World w = make_world(3);
  for (int i = 0; i < 10; ++i) w.step(make_action(0, 0.0f, 5.0f));
  EXPECT_EQ(w.pose().pitch_deg, 20.0);
  w.step(make_action(0, 0.0f, -45.0f));
  EXPECT_EQ(w.pose().pitch_deg, -20.0);
  w.step(make_action(0, 0.0f, 7.5f));
  EXPECT_EQ(w.pose().pitch_deg, -12.5);
  // non-finite mouse values are ignored rather than poisoning the pose
  w.step(make_action(0, std::nanf(""), INFINITY));
  EXPECT_EQ(w.pose().pitch_deg, -12.5);
  EXPECT_TRUE(std::isfinite(w.pose().yaw_deg));
}

// ---------------------------------------------------------------- rendering

std::vector<std::vector<uint8_t>> render_sequence(uint64_t seed, const std::vector<Action>& actions, int width = 64,
                                                  int height = 64) {
  World w = make_world(seed);
  Raycaster rc = make_raycaster(width, height);
  std::vector<std::vector<uint8_t>> frames;
  frames.push_back(rc.render(w.maze(), w.pose()));
  for (const Action& a : actions) {
    w.step(a);
    frames.push_back(rc.render(w.maze(), w.pose()));
  }
  return frames;
}

std::vector<Action> mixed_actions() {
  std::vector<Action> a;
  for (int i = 0; i < 10; ++i) a.push_back(make_action(kKeyW, 3.0f));
  for (int i = 0; i < 6; ++i) a.push_back(make_action(kKeyD | kKeyW, -7.5f, 2.0f));
  for (int i = 0; i < 6; ++i) a.push_back(make_action(kKeyS, 12.0f, -3.0f));
  return a;
}

TEST(Render, SameSeedAndActionsGiveIdenticalBytes) {
  const auto a = render_sequence(11, mixed_actions());
  const auto b = render_sequence(11, mixed_actions());
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], b[i]) << "frame " << i;
  // other frame sizes are deterministic too
  EXPECT_EQ(render_sequence(11, mixed_actions(), 96, 48), render_sequence(11, mixed_actions(), 96, 48));
}

TEST(Render, DifferentSeedsGiveDifferentFrames) {
  const auto a = render_sequence(1, {});
  const auto b = render_sequence(2, {});
  EXPECT_NE(a[0], b[0]);
}

TEST(Render, FramesHaveStructure) {
  // a first-person view is not flat: bright sky or wall on top, floor at the bottom, many colours
  for (uint64_t seed = 0; seed < 5; ++seed) {
    const auto f = render_sequence(seed, {})[0];
    ASSERT_EQ(f.size(), 64u * 64 * 3);
    std::set<uint32_t> colours;
    double top = 0;
    double bottom = 0;
    for (int y = 0; y < 64; ++y) {
      for (int x = 0; x < 64; ++x) {
        const uint8_t* p = &f[(y * 64 + x) * 3];
        colours.insert(p[0] << 16 | p[1] << 8 | p[2]);
        if (y < 4) top += p[0] + p[1] + p[2];
        if (y >= 60) bottom += p[0] + p[1] + p[2];
      }
    }
    EXPECT_GT(colours.size(), 100u) << "seed " << seed;
    EXPECT_NE(top, bottom) << "seed " << seed;
  }
}

TEST(Render, FullTurnReturnsTheIdenticalFrame) {
  for (float step : {15.0f, 10.0f, -7.5f, 45.0f, 0.25f * 13}) {
    std::vector<Action> turn;
    float total = 0;
    while (std::fabs(total + step) <= 360.0f) {
      turn.push_back(make_action(0, step));
      total += step;
    }
    if (std::fabs(total) < 360.0f) turn.push_back(make_action(0, std::copysign(360.0f, step) - total));
    const auto frames = render_sequence(5, turn);
    EXPECT_EQ(frames.front(), frames.back()) << "step " << step;
    EXPECT_NE(frames.front(), frames[turn.size() / 2]) << "step " << step;
  }
}

TEST(Render, PitchShiftsTheViewAndIsClamped) {
  const auto base = render_sequence(4, {})[0];
  const auto up = render_sequence(4, {make_action(0, 0.0f, 10.0f)});
  EXPECT_NE(base, up[1]);
  // beyond the limit the view stops changing
  const auto at_limit = render_sequence(4, {make_action(0, 0.0f, 20.0f)});
  const auto past_limit = render_sequence(4, {make_action(0, 0.0f, 40.0f)});
  EXPECT_EQ(at_limit[1], past_limit[1]);
  // and looking up then back down restores the frame
  const auto nod = render_sequence(4, {make_action(0, 0.0f, 6.0f), make_action(0, 0.0f, -6.0f)});
  EXPECT_EQ(nod[0], nod[2]);
}

TEST(Render, RejectsBadConfig) {
  RenderConfig rc;
  rc.width = 0;
  EXPECT_FALSE(Raycaster::create(rc).ok());
  rc = RenderConfig{};
  rc.fov_deg = std::nan("");
  EXPECT_FALSE(Raycaster::create(rc).ok());
  rc = RenderConfig{};
  rc.supersample = 9;
  EXPECT_FALSE(Raycaster::create(rc).ok());
}

// ---------------------------------------------------------------- policy

std::vector<Action> policy(uint64_t seed, int n) {
  auto a = policy_actions(seed, n);
  EXPECT_TRUE(a.ok()) << a.status();
  return *std::move(a);
}

std::vector<Pose> replay(uint64_t seed, const std::vector<Action>& actions) {
  World w = make_world(seed);
  std::vector<Pose> poses{w.pose()};
  for (const Action& a : actions) {
    w.step(a);
    poses.push_back(w.pose());
  }
  return poses;
}

TEST(Policy, Deterministic) {
  EXPECT_EQ(policy(8, 700), policy(8, 700));
  EXPECT_NE(policy(8, 300), policy(9, 300));
  // a prefix of a longer run is the shorter run
  const auto longer = policy(8, 700);
  EXPECT_EQ(std::vector<Action>(longer.begin(), longer.begin() + 300), policy(8, 300));
}

TEST(Policy, ActionsAreValidAndMostlyGentleTurns) {
  const ActionSpace space = default_action_space();
  int turning = 0;
  int gentle = 0;
  for (uint64_t seed = 0; seed < 10; ++seed) {
    for (const Action& a : policy(seed, 600)) {
      ASSERT_TRUE(space.validate(a).ok());
      EXPECT_LE(std::fabs(a.mouse[0]), 30.0f);
      EXPECT_LE(std::fabs(a.mouse[1]), 3.0f);
      EXPECT_EQ(a.mouse[0] * 4.0f, std::round(a.mouse[0] * 4.0f)) << "yaw is a multiple of 0.25";
      if (a.mouse[0] != 0.0f) {
        ++turning;
        if (std::fabs(a.mouse[0]) >= 3.0f && std::fabs(a.mouse[0]) <= 15.0f) ++gentle;
      }
    }
  }
  ASSERT_GT(turning, 0);
  EXPECT_GT(static_cast<double>(gentle) / turning, 0.6) << gentle << " of " << turning;
}

TEST(Policy, ScriptTextRoundTripsExactly) {
  const ActionSpace space = default_action_space();
  const auto actions = policy(21, 800);
  auto parsed = parse_action_script(format_action_script(actions, space), space);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, actions);
}

TEST(Policy, ContainsRevisitsTurnsAndEveryKey) {
  uint32_t keys_seen = 0;
  bool pitch_seen = false;
  for (uint64_t seed = 0; seed < 8; ++seed) {
    const auto actions = policy(seed, 400);
    const auto poses = replay(seed, actions);
    for (const Action& a : actions) {
      keys_seen |= a.keys;
      pitch_seen |= a.mouse[1] != 0.0f;
    }
    // a place left (more than 1.5 tiles away) and come back to at least 8 frames later
    bool revisit = false;
    for (size_t i = 0; i < poses.size() && !revisit; ++i) {
      double farthest = 0;
      for (size_t j = i + 1; j < poses.size(); ++j) {
        const double d = std::hypot(poses[j].x - poses[i].x, poses[j].y - poses[i].y);
        farthest = std::max(farthest, d);
        if (j - i >= 8 && farthest > 1.5 && d < 0.3) {
          revisit = true;
          break;
        }
      }
    }
    EXPECT_TRUE(revisit) << "seed " << seed;
    // a turn of at least 180 degrees one way within 100 frames
    bool half_turn = false;
    for (size_t i = 0; i < actions.size() && !half_turn; ++i) {
      double sum = 0;
      for (size_t j = i; j < actions.size() && j < i + 100; ++j) {
        sum += actions[j].mouse[0];
        if (std::fabs(sum) >= 180.0) half_turn = true;
      }
    }
    EXPECT_TRUE(half_turn) << "seed " << seed;
  }
  EXPECT_EQ(keys_seen, kKeyW | kKeyA | kKeyS | kKeyD);
  EXPECT_TRUE(pitch_seen);
}

TEST(Policy, WalksRatherThanRubsWalls) {
  // frames with a movement key held that move less than half the speed: blocked by a wall
  int moving = 0;
  int blocked = 0;
  for (uint64_t seed = 0; seed < 6; ++seed) {
    const auto actions = policy(seed, 600);
    const auto poses = replay(seed, actions);
    for (size_t i = 0; i < actions.size(); ++i) {
      if (actions[i].keys == 0) continue;
      ++moving;
      const double d = std::hypot(poses[i + 1].x - poses[i].x, poses[i + 1].y - poses[i].y);
      if (d < 0.04) ++blocked;
    }
  }
  ASSERT_GT(moving, 1000);
  EXPECT_LT(static_cast<double>(blocked) / moving, 0.03) << blocked << " of " << moving;
}

// ---------------------------------------------------------------- episodes

TEST(Episode, AlignsFramesActionsAndPoses) {
  Raycaster rc = make_raycaster();
  const uint64_t seed = episode_seed(77, 3);
  auto ep = run_policy_episode(seed, 40, rc);
  ASSERT_TRUE(ep.ok()) << ep.status();
  ASSERT_EQ(ep->pixels.size(), 40u * 64 * 64 * 3);
  for (int k = 0; k < kActionRowWidth; ++k) EXPECT_EQ(ep->actions[k], 0.0f) << "row 0 is no action";
  // replaying the policy's 39 actions from the start gives the same frames
  const auto actions = policy(seed, 39);
  const auto frames = render_sequence(seed, actions);
  for (int i = 0; i < 40; ++i) {
    const uint8_t* f = ep->pixels.data() + static_cast<size_t>(i) * 64 * 64 * 3;
    EXPECT_TRUE(std::equal(frames[i].begin(), frames[i].end(), f)) << "frame " << i;
    if (i > 0) {
      float row[kActionRowWidth];
      action_row(actions[i - 1], row);
      for (int k = 0; k < kActionRowWidth; ++k) EXPECT_EQ(ep->actions[i * kActionRowWidth + k], row[k]);
    }
  }
  EXPECT_EQ(ep->poses[0], static_cast<float>(ep->start.x));
  EXPECT_EQ(ep->poses[39 * kPoseRowWidth + 2], static_cast<float>(ep->end.yaw_deg));
  EXPECT_NE(episode_seed(77, 3), episode_seed(77, 4));
  EXPECT_NE(episode_seed(77, 3), episode_seed(78, 3));
}

TEST(Episode, WorkersFitTheMemoryBudget) {
  EXPECT_EQ(episode_bytes(256, 64, 64), 256u * (64 * 64 * 3 + 40));
  const uint64_t gib = uint64_t{1} << 30;
  EXPECT_EQ(episode_workers(8, 1000, episode_bytes(256, 64, 64), 4 * gib), 8) << "small episodes: every thread";
  EXPECT_EQ(episode_workers(8, 3, episode_bytes(256, 64, 64), 4 * gib), 3) << "no more workers than episodes";
  EXPECT_EQ(episode_workers(64, 1000, gib, 4 * gib), 4) << "64 threads of 1 GiB episodes would hold 64 GiB";
  EXPECT_EQ(episode_workers(64, 1000, 3 * gib, 4 * gib), 1) << "one worker always runs";
  EXPECT_EQ(episode_workers(2, 1000, 0, 4 * gib), 2);
}

// ---------------------------------------------------------------- npy

TEST(Npy, HeaderParsesBack) {
  const std::vector<std::vector<int64_t>> shapes = {{7}, {2, 3}, {16, 64, 64, 3}, {0, 6}, {}};
  for (NpyDtype dt : {NpyDtype::kUint8, NpyDtype::kFloat32}) {
    for (const auto& shape : shapes) {
      const std::string h = npy_header(dt, shape);
      ASSERT_GE(h.size(), 10u);
      EXPECT_EQ(h.substr(0, 6), std::string("\x93NUMPY", 6));
      EXPECT_EQ(h[6], 1);
      EXPECT_EQ(h[7], 0);
      const size_t len = static_cast<uint8_t>(h[8]) | static_cast<size_t>(static_cast<uint8_t>(h[9])) << 8;
      EXPECT_EQ(len + 10, h.size());
      EXPECT_EQ(h.size() % 64, 0u);
      EXPECT_EQ(h.back(), '\n');
      auto parsed = npy_parse_header(h);
      ASSERT_TRUE(parsed.ok()) << parsed.status();
      EXPECT_EQ(parsed->dtype, dt);
      EXPECT_EQ(parsed->shape, shape);
      EXPECT_EQ(parsed->data_offset, h.size());
    }
  }
  EXPECT_NE(npy_header(NpyDtype::kUint8, {7}).find("'shape': (7,)"), std::string::npos);
  EXPECT_NE(npy_header(NpyDtype::kFloat32, {2, 3}).find("'descr': '<f4'"), std::string::npos);
  EXPECT_FALSE(npy_parse_header("not an npy file").ok());
}

TEST(Npy, WritesDataAfterTheHeader) {
  const std::string path = (std::filesystem::temp_directory_path() / "wm_sim_test.npy").string();
  const std::vector<float> data = {1.0f, -2.5f, 3.25f, 0.0f, 5.0f, 6.0f};
  ASSERT_TRUE(npy_write(path, NpyDtype::kFloat32, {3, 2}, data.data()).ok());
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string file = ss.str();
  auto h = npy_parse_header(file);
  ASSERT_TRUE(h.ok()) << h.status();
  ASSERT_EQ(file.size(), h->data_offset + data.size() * 4);
  std::vector<float> back(data.size());
  std::memcpy(back.data(), file.data() + h->data_offset, file.size() - h->data_offset);
  EXPECT_EQ(back, data);
  std::filesystem::remove(path);

  NpyWriter w;
  ASSERT_TRUE(w.open(path, NpyDtype::kUint8, {2, 2}).ok());
  const uint8_t bytes[4] = {1, 2, 3, 4};
  EXPECT_TRUE(w.append(bytes, 3).ok());
  EXPECT_FALSE(w.append(bytes, 2).ok()) << "more than the shape holds";
  EXPECT_FALSE(w.finish().ok()) << "one byte short";
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace wm::sim
