// The maze of the ground-truth world: a square tile grid generated from a
// seed. Maze cells sit on odd (x, y) tiles of a (2 * cells + 1)^2 grid; the
// tiles between them are walls or openings, so corridors and walls are both
// one tile wide. Coordinates: x grows east (tile column), y grows south (tile
// row); a point (x, y) lies in tile (floor(x), floor(y)).
//
// On top of a randomized depth-first spanning tree the generator opens extra
// walls (so loops exist), carves one 2x2-cell room per quadrant with a tall
// coloured pillar in its centre, turns some dead-end walls into doors and
// paints coloured markers on some floor tiles. The four quadrants are regions
// with their own wall and floor look. Everything is a pure function of the seed.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace wm::sim {

enum class Tile : uint8_t {
  kFree = 0,
  kWall = 1,
  kDoor = 2,  // a solid wall tile drawn with a door texture
};

// regions are the quadrants; the names say how the renderer draws them
inline constexpr int kRegions = 4;
inline constexpr const char* kRegionNames[kRegions] = {"north-west red brick", "north-east blue panels",
                                                       "south-west green bands", "south-east yellow checker"};
inline constexpr int kPillarColours = 8;  // size of the renderer's pillar palette
inline constexpr int kMarkerColours = 6;  // size of the renderer's floor marker palette

struct Pillar {
  double x = 0.0;  // centre, in tiles
  double y = 0.0;
  double radius = 0.22;
  int colour = 0;  // index into the pillar palette, unique within a maze
};

struct MazeConfig {
  int cells = 12;            // maze cells per side (4..64); the tile grid is 2 * cells + 1 wide
  int extra_openings = -1;   // walls opened after the spanning tree; -1 means cells * cells / 8
  int rooms = 4;             // 2x2-cell rooms with a pillar, one per quadrant (0..4)
  int doors = 6;             // dead-end walls drawn as doors (0..64)
  int floor_markers = 6;     // cell tiles with a coloured floor marker (0..kMarkerColours)
  absl::Status validate() const;
};

class Maze {
 public:
  static absl::StatusOr<Maze> generate(uint64_t seed, const MazeConfig& config = {});

  uint64_t seed() const { return seed_; }
  int cells() const { return cells_; }
  int size() const { return size_; }  // tiles per side

  bool in_bounds(int x, int y) const { return x >= 0 && y >= 0 && x < size_ && y < size_; }
  // tiles outside the grid read as walls, so rays and bodies never leave it
  Tile tile(int x, int y) const { return in_bounds(x, y) ? tiles_[index(x, y)] : Tile::kWall; }
  bool solid(int x, int y) const { return tile(x, y) != Tile::kFree; }
  // quadrant 0..3: bit 0 set in the east half, bit 1 set in the south half
  int region(int x, int y) const { return (2 * x + 1 > size_ ? 1 : 0) + (2 * y + 1 > size_ ? 2 : 0); }
  // colour index of the floor marker on a free tile, or -1
  int floor_marker(int x, int y) const { return in_bounds(x, y) ? markers_[index(x, y)] : -1; }
  // true for the 3x3 free tiles of a pillar room
  bool in_room(int x, int y) const { return in_bounds(x, y) && rooms_[index(x, y)] != 0; }
  // true for the tile that holds a pillar's centre
  bool pillar_tile(int x, int y) const;

  const std::vector<Pillar>& pillars() const { return pillars_; }
  const std::vector<Tile>& tiles() const { return tiles_; }  // [size, size], row-major (y, x)

 private:
  Maze() = default;
  int index(int x, int y) const { return y * size_ + x; }

  uint64_t seed_ = 0;
  int cells_ = 0;
  int size_ = 0;
  std::vector<Tile> tiles_;      // [size, size]
  std::vector<int8_t> markers_;  // [size, size], -1 when no marker
  std::vector<uint8_t> rooms_;   // [size, size], 1 inside a room
  std::vector<Pillar> pillars_;
};

}  // namespace wm::sim
