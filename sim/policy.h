// Scripted exploration: a closed-loop policy that reads the world (walls,
// pose) and emits one action per frame. It strings together behaviours drawn
// from its seed: walking to new cells along shortest paths, loops that come
// back by another route, revisits of earlier places, turning around and
// walking back, full spins, looking left/right/back, pauses, small pitch nods,
// strafing, stepping backwards and drifting (moving along a path with W/A/S/D
// combinations while keeping the heading, as players do with strafe keys). Revisits are the point: a world model must
// see places again from new and old angles.
//
// Yaw steps are multiples of 0.25 degrees (exact in float and in the text
// action format), at most 30 per frame and mostly 3..15; pitch steps are 1..3
// degrees and the pitch always returns to 0.
#pragma once

#include <cstdint>
#include <deque>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/action.h"
#include "sim/rng.h"
#include "sim/world.h"

namespace wm::sim {

class ExplorationPolicy {
 public:
  explicit ExplorationPolicy(uint64_t seed);

  // the action for the next frame, given the world before it is applied
  Action next(const World& world);

 private:
  using TileXY = std::pair<int, int>;

  enum class SegmentKind { kWalk, kTurn, kPause, kPitch, kKeys };
  struct Segment {
    SegmentKind kind = SegmentKind::kPause;
    std::deque<TileXY> waypoints;  // kWalk: tile centres to pass, in order
    bool strafe_correct = false;   // kWalk: fix small lateral offsets with A/D instead of yaw
    bool hold_yaw = false;         // kWalk: keep the heading and move with W/A/S/D combinations
    double step = 10.0;            // kWalk, kTurn, kPitch: largest angle per frame
    double remaining = 0.0;        // kTurn: signed degrees still to turn
    double target = 0.0;           // kPitch: pitch to reach
    uint32_t keys = 0;             // kKeys: keys to hold
    int frames = 0;                // kPause, kKeys: frames left; kWalk: frame budget
    int started = 0;               // kTurn: frames done, for the gentle first step
    double best = 1e9;             // kWalk: closest approach to the current waypoint
    int stale = 0;                 // kWalk: frames without getting closer
  };

  void plan(const World& world);
  // fills action for the front segment; false when the segment is done
  bool produce(const World& world, Segment& seg, Action& action);
  void record(const World& world);

  // shortest tile path from the current tile to target (target included, start
  // excluded), avoiding solid tiles, pillar tiles and the blocked tiles; empty if none
  std::vector<TileXY> path_to(const World& world, TileXY from, TileXY target, const std::vector<uint8_t>* blocked) const;
  // all tiles reachable from the start with their BFS distance (-1 unreachable), [size * size]
  std::vector<int> distances(const World& world, TileXY from) const;

  bool plan_explore(const World& world);
  bool plan_loop(const World& world);
  bool plan_revisit(const World& world);
  bool plan_turn_back(const World& world);
  void plan_look_around();
  void plan_look_back();
  void plan_nod();
  bool plan_strafe(const World& world);
  bool plan_backward(const World& world);

  bool plan_drift(const World& world);

  void push_walk(const World& world, std::vector<TileXY> path, bool hold_yaw = false);
  // a short glance, nod, pause or turn between two legs of a walk; full turns only at junctions
  void push_interjection(bool junction);
  void push_turn(double degrees);
  void push_pause(int frames);
  double turn_step();

  Rng rng_;
  std::deque<Segment> queue_;
  int frame_ = 0;
  std::vector<TileXY> trail_;                     // tiles entered, in order (consecutive duplicates removed)
  std::vector<std::pair<TileXY, int>> visits_;    // (tile, frame) at each tile change
};

// runs the policy of the seed in the world of the seed for count frames and
// returns its actions; wmsim dataset episode e and `wmsim script --seed` use this
absl::StatusOr<std::vector<Action>> policy_actions(uint64_t seed, int count, const MazeConfig& maze_config = {},
                                                   const WorldConfig& world_config = {});

}  // namespace wm::sim
