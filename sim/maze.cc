#include "sim/maze.h"

#include <algorithm>
#include <array>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "sim/rng.h"

namespace wm::sim {

absl::Status MazeConfig::validate() const {
  if (cells < 4 || cells > 64) return absl::InvalidArgumentError(absl::StrCat("maze cells = ", cells, " is not in 4..64"));
  if (extra_openings < -1 || extra_openings > 4 * cells * cells) {
    return absl::InvalidArgumentError(absl::StrCat("maze extra_openings = ", extra_openings, " is out of range"));
  }
  if (rooms < 0 || rooms > 4) return absl::InvalidArgumentError(absl::StrCat("maze rooms = ", rooms, " is not in 0..4"));
  if (doors < 0 || doors > 64) return absl::InvalidArgumentError(absl::StrCat("maze doors = ", doors, " is not in 0..64"));
  if (floor_markers < 0 || floor_markers > kMarkerColours) {
    return absl::InvalidArgumentError(
        absl::StrCat("maze floor_markers = ", floor_markers, " is not in 0..", kMarkerColours));
  }
  return absl::OkStatus();
}

namespace {

constexpr std::array<std::pair<int, int>, 4> kDirs = {{{1, 0}, {0, 1}, {-1, 0}, {0, -1}}};

template <typename T>
void shuffle(std::vector<T>& v, Rng& rng) {
  for (size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[rng.below(i)]);
}

}  // namespace

bool Maze::pillar_tile(int x, int y) const {
  for (const Pillar& p : pillars_) {
    if (static_cast<int>(p.x) == x && static_cast<int>(p.y) == y) return true;
  }
  return false;
}

absl::StatusOr<Maze> Maze::generate(uint64_t seed, const MazeConfig& config) {
  if (auto st = config.validate(); !st.ok()) return st;
  Rng rng(derive_seed(seed, kMazeStream));
  Maze m;
  m.seed_ = seed;
  m.cells_ = config.cells;
  m.size_ = 2 * config.cells + 1;
  const int n = config.cells;
  const int size = m.size_;
  m.tiles_.assign(static_cast<size_t>(size) * size, Tile::kWall);
  m.markers_.assign(m.tiles_.size(), -1);
  m.rooms_.assign(m.tiles_.size(), 0);
  auto at = [&](int x, int y) -> Tile& { return m.tiles_[m.index(x, y)]; };
  auto cell_tile = [](int c) { return 2 * c + 1; };

  // randomized depth-first search: long winding corridors, one path between any two cells
  std::vector<uint8_t> visited(static_cast<size_t>(n) * n, 0);
  std::vector<std::pair<int, int>> stack;
  const int sx = static_cast<int>(rng.below(n));
  const int sy = static_cast<int>(rng.below(n));
  stack.emplace_back(sx, sy);
  visited[sy * n + sx] = 1;
  at(cell_tile(sx), cell_tile(sy)) = Tile::kFree;
  while (!stack.empty()) {
    auto [cx, cy] = stack.back();
    std::array<int, 4> options{};
    int count = 0;
    for (int d = 0; d < 4; ++d) {
      const int nx = cx + kDirs[d].first;
      const int ny = cy + kDirs[d].second;
      if (nx >= 0 && ny >= 0 && nx < n && ny < n && !visited[ny * n + nx]) options[count++] = d;
    }
    if (count == 0) {
      stack.pop_back();
      continue;
    }
    const int d = options[rng.below(count)];
    const int nx = cx + kDirs[d].first;
    const int ny = cy + kDirs[d].second;
    visited[ny * n + nx] = 1;
    at(cell_tile(cx) + kDirs[d].first, cell_tile(cy) + kDirs[d].second) = Tile::kFree;
    at(cell_tile(nx), cell_tile(ny)) = Tile::kFree;
    stack.emplace_back(nx, ny);
  }

  // one 2x2-cell room per quadrant; opening the post tile in its middle gives a
  // 3x3 free area whose centre holds the pillar, with a free ring around it
  std::vector<int> pillar_colours(kPillarColours);
  for (int i = 0; i < kPillarColours; ++i) pillar_colours[i] = i;
  shuffle(pillar_colours, rng);
  const int half = n / 2;
  for (int q = 0; q < config.rooms; ++q) {
    const int qx0 = (q & 1) ? half : 0;
    const int qx1 = (q & 1) ? n : half;
    const int qy0 = (q & 2) ? half : 0;
    const int qy1 = (q & 2) ? n : half;
    const int rx = rng.range(qx0, qx1 - 2);
    const int ry = rng.range(qy0, qy1 - 2);
    for (int ty = cell_tile(ry); ty <= cell_tile(ry) + 2; ++ty) {
      for (int tx = cell_tile(rx); tx <= cell_tile(rx) + 2; ++tx) {
        at(tx, ty) = Tile::kFree;
        m.rooms_[m.index(tx, ty)] = 1;
      }
    }
    Pillar p;
    p.x = cell_tile(rx) + 1.5;
    p.y = cell_tile(ry) + 1.5;
    p.colour = pillar_colours[q];
    m.pillars_.push_back(p);
  }

  // extra openings turn the tree into a graph with loops
  std::vector<std::pair<int, int>> closed;
  for (int y = 1; y < size - 1; ++y) {
    for (int x = 1; x < size - 1; ++x) {
      const bool between_x = (x % 2 == 0) && (y % 2 == 1);  // wall between two cells side by side
      const bool between_y = (x % 2 == 1) && (y % 2 == 0);  // wall between two cells one above the other
      if ((between_x || between_y) && at(x, y) == Tile::kWall) closed.emplace_back(x, y);
    }
  }
  shuffle(closed, rng);
  const int openings = config.extra_openings >= 0 ? config.extra_openings : n * n / 8;
  for (int i = 0; i < openings && i < static_cast<int>(closed.size()); ++i) at(closed[i].first, closed[i].second) = Tile::kFree;

  // doors close the end of dead ends, where an explorer turns around facing them
  std::vector<std::pair<int, int>> dead_end_walls;
  for (int cy = 0; cy < n; ++cy) {
    for (int cx = 0; cx < n; ++cx) {
      const int tx = cell_tile(cx);
      const int ty = cell_tile(cy);
      if (m.rooms_[m.index(tx, ty)]) continue;
      int open = 0;
      int open_dir = 0;
      for (int d = 0; d < 4; ++d) {
        if (at(tx + kDirs[d].first, ty + kDirs[d].second) == Tile::kFree) {
          ++open;
          open_dir = d;
        }
      }
      if (open != 1) continue;
      const int back = (open_dir + 2) % 4;
      dead_end_walls.emplace_back(tx + kDirs[back].first, ty + kDirs[back].second);
    }
  }
  shuffle(dead_end_walls, rng);
  for (int i = 0; i < config.doors && i < static_cast<int>(dead_end_walls.size()); ++i) {
    at(dead_end_walls[i].first, dead_end_walls[i].second) = Tile::kDoor;
  }

  // floor markers on cell tiles outside the rooms, each in its own colour
  std::vector<std::pair<int, int>> marker_cells;
  for (int cy = 0; cy < n; ++cy) {
    for (int cx = 0; cx < n; ++cx) {
      if (!m.rooms_[m.index(cell_tile(cx), cell_tile(cy))]) marker_cells.emplace_back(cell_tile(cx), cell_tile(cy));
    }
  }
  shuffle(marker_cells, rng);
  std::vector<int> marker_colours(kMarkerColours);
  for (int i = 0; i < kMarkerColours; ++i) marker_colours[i] = i;
  shuffle(marker_colours, rng);
  for (int i = 0; i < config.floor_markers && i < static_cast<int>(marker_cells.size()); ++i) {
    m.markers_[m.index(marker_cells[i].first, marker_cells[i].second)] = static_cast<int8_t>(marker_colours[i]);
  }
  return m;
}

}  // namespace wm::sim
