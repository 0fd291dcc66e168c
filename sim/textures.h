// Colours and surface patterns of the world. The renderer asks for the colour
// of a point on a wall, a floor tile, a pillar or the sky; this file owns the
// palettes. Patterns are deliberately broad (bricks a quarter of a wall high,
// panels a third of a wall wide) and fade to their mean colour once they
// shrink to a few pixels, so a 64x64 model sees flat regions, not aliasing.
#pragma once

#include "sim/maze.h"

namespace wm::sim {

struct Rgb {
  float r = 0.0f;
  float g = 0.0f;
  float b = 0.0f;
};

inline Rgb operator*(Rgb c, float s) { return {c.r * s, c.g * s, c.b * s}; }
inline Rgb operator+(Rgb a, Rgb b) { return {a.r + b.r, a.g + b.g, a.b + b.b}; }
inline Rgb lerp(Rgb a, Rgb b, float t) { return {a.r + (b.r - a.r) * t, a.g + (b.g - a.g) * t, a.b + (b.b - a.b) * t}; }

// horizontal direction of the sun (world yaw, degrees) and its elevation; the
// sun and the wall shading give the model a fixed compass
inline constexpr double kSunYawDeg = 300.0;
inline constexpr double kSunElevationDeg = 24.0;

// colour far objects fade into, also the sky at the horizon
Rgb fog_colour();
// blend of c towards the fog colour at distance (tiles)
Rgb apply_fog(Rgb c, float distance);

// u: position across the face (0..1), z: height above the floor (0..1),
// px_u, px_z: output pixels per tile across and up the face at the hit (they drive the fade)
Rgb wall_colour(int region, bool door, float u, float z, float px_u, float px_z);
// fx, fy: position inside the tile (0..1); px_per_unit: output pixels per tile
// of floor depth at that distance (foreshortened)
Rgb floor_colour(const Maze& maze, int tx, int ty, float fx, float fy, float px_per_unit);
// z: height above the floor in tiles (0..pillar height), light: cosine between
// the surface normal and the sun's horizontal direction
Rgb pillar_colour(int colour, float z, float light);
// up: tangent of the elevation angle; sun_cos: cosine between the view ray and the sun
Rgb sky_colour(float up, float sun_cos);

inline constexpr float kPillarHeight = 1.5f;  // tiles; taller than walls so pillars show over them
inline constexpr float kCameraHeight = 0.5f;  // eye height in tiles; walls are 1 tile high

}  // namespace wm::sim
