// A cache's geometry and format options across the plugin ABI
// (engine/plugin_api.h: WmKvGeometry), both ways: the engine fills one in
// (backend_plugin.cc), the plugin reads it back (cuda/cuda_backend.cc).
// Header-only, so that both sides translate with the same code.
#pragma once

#include "engine/plugin_api.h"
#include "quant/kv_cache.h"

namespace wm {

inline WmKvGeometry to_plugin_kv_geometry(const KvGeometry& g, const KvFormatOptions& o) {
  WmKvGeometry c{};
  c.layers = g.layers;
  c.heads = g.heads;
  c.head_dim = g.head_dim;
  c.tokens_per_frame = g.tokens_per_frame;
  c.window_frames = g.window_frames;
  c.sink_frames = g.sink_frames;
  c.frames_per_block = g.frames_per_block;
  c.kivi_group = o.kivi_group;
  c.kivi_residual = o.kivi_residual;
  c.span_frames = o.span_frames;
  c.centroids = o.centroids;
  c.tokens_per_centroid = o.tokens_per_centroid;
  c.block = o.block;
  c.kmeans_iters = o.kmeans_iters;
  c.quantize_sinks = o.quantize_sinks ? 1 : 0;
  c.qsac = o.qsac ? 1 : 0;
  c.psac = o.psac ? 1 : 0;
  c.psac_rank = o.psac_rank;
  c.psac_bits = o.psac_bits;
  c.psac_refresh_frames = o.psac_refresh_frames;
  c.qsac_candidates = o.qsac_candidates;
  c.quantize_keys = o.quantize_keys ? 1 : 0;
  c.quantize_values = o.quantize_values ? 1 : 0;
  c.qsac_weight_floor = o.qsac_weight_floor;
  c.kmeans_seed = o.kmeans_seed;
  return c;
}

inline KvGeometry kv_geometry_of(const WmKvGeometry& c) {
  KvGeometry g;
  g.layers = c.layers;
  g.heads = c.heads;
  g.head_dim = c.head_dim;
  g.tokens_per_frame = c.tokens_per_frame;
  g.window_frames = c.window_frames;
  g.sink_frames = c.sink_frames;
  g.frames_per_block = c.frames_per_block;
  return g;
}

inline KvFormatOptions kv_format_options_of(const WmKvGeometry& c) {
  KvFormatOptions o;
  o.kivi_group = c.kivi_group;
  o.kivi_residual = c.kivi_residual;
  o.span_frames = c.span_frames;
  o.centroids = c.centroids;
  o.tokens_per_centroid = c.tokens_per_centroid;
  o.block = c.block;
  o.kmeans_iters = c.kmeans_iters;
  o.kmeans_seed = c.kmeans_seed;
  o.quantize_sinks = c.quantize_sinks != 0;
  o.qsac = c.qsac != 0;
  o.psac = c.psac != 0;
  o.psac_rank = c.psac_rank;
  o.psac_bits = c.psac_bits;
  o.psac_refresh_frames = c.psac_refresh_frames;
  o.qsac_candidates = c.qsac_candidates;
  o.qsac_weight_floor = c.qsac_weight_floor;
  o.quantize_keys = c.quantize_keys != 0;
  o.quantize_values = c.quantize_values != 0;
  return o;
}

}  // namespace wm
