#include "sim/textures.h"

#include <algorithm>
#include <cmath>

namespace wm::sim {

namespace {

constexpr Rgb kFog{0.80f, 0.86f, 0.93f};
constexpr Rgb kZenith{0.28f, 0.48f, 0.86f};
constexpr Rgb kSun{1.0f, 0.96f, 0.78f};

// per region: main wall colour, pattern colour, floor colour
constexpr Rgb kWallMain[kRegions] = {
    {0.72f, 0.20f, 0.16f},  // red brick
    {0.18f, 0.32f, 0.78f},  // blue panels
    {0.20f, 0.58f, 0.22f},  // green bands
    {0.93f, 0.76f, 0.20f},  // yellow checker
};
constexpr Rgb kWallPattern[kRegions] = {
    {0.86f, 0.80f, 0.70f},  // mortar
    {0.08f, 0.12f, 0.34f},  // panel seams
    {0.10f, 0.34f, 0.12f},  // dark band
    {0.88f, 0.46f, 0.12f},  // orange squares
};
constexpr Rgb kFloor[kRegions] = {
    {0.46f, 0.34f, 0.30f},
    {0.30f, 0.34f, 0.44f},
    {0.34f, 0.42f, 0.26f},
    {0.52f, 0.46f, 0.33f},
};
constexpr Rgb kRoomFloor{0.70f, 0.67f, 0.62f};
constexpr Rgb kDoorPanel{0.50f, 0.14f, 0.58f};
constexpr Rgb kDoorFrame{0.94f, 0.94f, 0.90f};

constexpr Rgb kPillarPalette[kPillarColours] = {
    {1.00f, 0.50f, 0.05f},  // orange
    {0.05f, 0.82f, 0.92f},  // cyan
    {0.96f, 0.96f, 0.96f},  // white
    {0.92f, 0.16f, 0.66f},  // magenta
    {0.10f, 0.10f, 0.12f},  // black
    {0.58f, 0.96f, 0.16f},  // lime
    {0.50f, 0.30f, 0.96f},  // violet
    {0.00f, 0.46f, 0.42f},  // teal
};
constexpr Rgb kMarkerPalette[kMarkerColours] = {
    {0.97f, 0.97f, 0.97f},  // white
    {0.05f, 0.80f, 0.90f},  // cyan
    {1.00f, 0.48f, 0.05f},  // orange
    {0.56f, 0.22f, 0.86f},  // violet
    {0.96f, 0.90f, 0.10f},  // yellow
    {0.08f, 0.08f, 0.08f},  // black
};

float clamp01(float v) { return std::clamp(v, 0.0f, 1.0f); }
float frac(float v) { return v - std::floor(v); }

// pattern contrast for a repeat of period_px output pixels: full above ~7 px,
// none below ~2.5 px, where it would only alias
float pattern_fade(float period_px) { return clamp01((period_px - 2.5f) / 4.5f); }

// weight of the pattern colour: the mask where the pattern is resolved, its
// area coverage where it has faded, so the mean colour stays the same
float pattern_weight(bool mask, float coverage, float fade) { return coverage + ((mask ? 1.0f : 0.0f) - coverage) * fade; }

// px_u, px_z: output pixels per tile across the face and up the face; at grazing
// angles px_u is much smaller than px_z and patterns across the face fade first
Rgb region_wall(int region, float u, float z, float px_u, float px_z) {
  const Rgb main = kWallMain[region];
  const Rgb pat = kWallPattern[region];
  switch (region) {
    case 0: {
      // bricks: 4 rows per wall, 2 bricks per row, odd rows offset by half a brick
      constexpr float kMortarZ = 0.16f;  // of a row
      constexpr float kMortarU = 0.08f;  // of a brick
      const float rz = z * 4.0f;
      const int row = static_cast<int>(std::floor(rz));
      const float bu = u * 2.0f + ((row & 1) ? 0.5f : 0.0f);
      const float wz = pattern_weight(frac(rz) < kMortarZ, kMortarZ, pattern_fade(px_z * 0.25f));
      // the joints move every row, so they need both directions resolved
      const float wu = pattern_weight(frac(bu) < kMortarU, kMortarU, pattern_fade(std::min(px_u * 0.5f, px_z * 0.25f)));
      return lerp(main, pat, 1.0f - (1.0f - wz) * (1.0f - wu));
    }
    case 1: {
      // three tall panels with dark seams, and a light trim band at the top
      if (z > 0.84f) return lerp(main, Rgb{0.90f, 0.92f, 0.96f}, 0.55f);
      constexpr float kSeam = 0.12f;  // of a panel
      const float pu = frac(u * 3.0f + 0.5f * kSeam);
      return lerp(main, pat, pattern_weight(pu < kSeam, kSeam, pattern_fade(px_u / 3.0f)));
    }
    case 2: {
      // dark lower band, a light stripe, then broad vertical stripes in two greens
      if (z < 0.30f) return pat;
      if (z < 0.40f) return Rgb{0.62f, 0.84f, 0.42f};
      return lerp(main, main * 0.78f, pattern_weight(frac(u * 2.0f) < 0.5f, 0.5f, pattern_fade(px_u * 0.5f)));
    }
    default: {
      // 2x2 checker per face
      const bool odd = (u < 0.5f) != (z < 0.5f);
      return lerp(main, pat, pattern_weight(odd, 0.5f, pattern_fade(std::min(px_u, px_z))));
    }
  }
}

}  // namespace

Rgb fog_colour() { return kFog; }

Rgb apply_fog(Rgb c, float distance) {
  // nothing for the first tile, then exponential; capped so far walls keep a hint of their region
  const float d = std::max(0.0f, distance - 1.0f);
  const float f = std::min(0.82f, 1.0f - std::exp(-d * 0.085f));
  return lerp(c, kFog, f);
}

Rgb wall_colour(int region, bool door, float u, float z, float px_u, float px_z) {
  region = std::clamp(region, 0, kRegions - 1);
  if (door) {
    // a purple door in a white frame, set in a plain wall of the region colour
    constexpr float kFrame = 0.07f;
    const bool in_frame = u > 0.18f && u < 0.82f && z < 0.80f;
    const bool in_panel = u > 0.18f + kFrame && u < 0.82f - kFrame && z < 0.80f - kFrame;
    if (in_panel) {
      // a lighter handle strip keeps the door readable when it fills the view
      if (u > 0.64f && u < 0.70f && z > 0.36f && z < 0.46f) return kDoorFrame;
      return kDoorPanel;
    }
    if (in_frame) return kDoorFrame;
    return kWallMain[region];
  }
  return region_wall(region, u, z, px_u, px_z);
}

Rgb floor_colour(const Maze& maze, int tx, int ty, float fx, float fy, float px_per_unit) {
  const int marker = maze.floor_marker(tx, ty);
  if (marker >= 0 && fx > 0.18f && fx < 0.82f && fy > 0.18f && fy < 0.82f) return kMarkerPalette[marker % kMarkerColours];
  const bool room = maze.in_room(tx, ty);
  const Rgb base = room ? kRoomFloor : kFloor[maze.region(tx, ty)];
  // a low-contrast checker of whole tiles shows motion on the floor up close
  const bool odd = ((tx + ty) & 1) != 0;
  return lerp(base, base * 0.88f, pattern_weight(odd, 0.5f, pattern_fade(px_per_unit)));
}

Rgb pillar_colour(int colour, float z, float light) {
  const Rgb body = kPillarPalette[std::clamp(colour, 0, kPillarColours - 1)];
  // a contrasting cap above wall height marks the pillar when seen over walls
  const bool cap = z > 1.15f;
  const Rgb cap_colour = (body.r + body.g + body.b > 2.4f) ? Rgb{0.12f, 0.12f, 0.14f} : Rgb{0.96f, 0.96f, 0.94f};
  const float shade = 0.62f + 0.38f * std::max(0.0f, light);
  return (cap ? cap_colour : body) * shade;
}

Rgb sky_colour(float up, float sun_cos) {
  const float t = clamp01(up / 0.9f);
  Rgb c = lerp(kFog, kZenith, t * (2.0f - t));
  // a soft disk and a wide glow; both are smooth in angle so they stay low-frequency
  constexpr float kCore = 0.9972f;   // cos of ~4.3 degrees
  constexpr float kGlow = 0.955f;    // cos of ~17 degrees
  if (sun_cos > kGlow) {
    const float g = (sun_cos - kGlow) / (1.0f - kGlow);
    c = lerp(c, kSun, 0.45f * g * g);
  }
  if (sun_cos > kCore) c = kSun;
  return c;
}

}  // namespace wm::sim
