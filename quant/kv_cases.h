// One table of format cases for the tests and the benchmark (STYLE 11): the
// same cases run in test mode (fused attention vs the scalar reference
// decoder + naive attention, tests/quant/) and in perf mode (wmquant bench).
//
// The synthetic data has the structure quantization is sensitive to: keys
// with per-channel offsets (a few large), tokens in clusters that drift from
// frame to frame, a component along the queries' principal directions so
// attention is peaked, and anisotropic queries (most energy in 8
// directions). It is a pure function of (seed, frame, index).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "quant/kv_cache.h"

namespace wm {

struct KvCase {
  std::string name;
  std::string format;
  KvGeometry geometry;
  KvFormatOptions options;
  int frames = 0;        // frames appended before the measured attention call
  int query_tokens = 0;  // queries of the measured call
  uint64_t seed = 1;
};

class SyntheticKv {
 public:
  SyntheticKv(const KvGeometry& g, uint64_t seed);
  // one frame's K and V, [tokens_per_frame, heads, head_dim]
  void frame(int64_t f, std::vector<float>* k, std::vector<float>* v) const;
  // n queries of step `step`, [n, heads, head_dim]
  void queries(int64_t step, int n, std::vector<float>* q) const;
  // the current block's own K/V for step `step`, [n, heads, head_dim]
  void block(int64_t step, int n, std::vector<float>* k, std::vector<float>* v) const;

 private:
  float normal(uint64_t stream, int64_t a, int64_t b) const;
  KvGeometry g_;
  uint64_t seed_;
  std::vector<float> qbasis_;   // [heads, 8, head_dim] orthonormal rows
  std::vector<float> koffset_;  // [heads, head_dim]
};

// for every frame: the queries of one step are observed, then the frame is
// appended (in every layer), as the engine's write pass does
absl::Status fill_cache(KvCache* cache, const SyntheticKv& data, int frames, int query_tokens);

// geometry helpers
KvGeometry kv_case_geometry(int head_dim, int heads, int tokens_per_frame, int window_frames, int sink_frames,
                            int layers = 1);

std::vector<KvCase> kv_test_cases();
// attention over 256..16384 cached tokens for every format
std::vector<KvCase> kv_bench_cases(int head_dim);

}  // namespace wm
