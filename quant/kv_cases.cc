#include "quant/kv_cases.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace wm {
namespace {

inline uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

constexpr int kDirs = 8;

}  // namespace

float SyntheticKv::normal(uint64_t stream, int64_t a, int64_t b) const {
  const uint64_t key = mix64(seed_ ^ mix64(stream * 0x100000001b3ull ^ static_cast<uint64_t>(a) * 0x9E3779B97F4A7C15ull)) +
                       2 * static_cast<uint64_t>(b);
  const double u1 = static_cast<double>((mix64(key) >> 11) + 1) * 0x1.0p-53;
  const double u2 = static_cast<double>(mix64(key + 1) >> 11) * 0x1.0p-53;
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}

SyntheticKv::SyntheticKv(const KvGeometry& g, uint64_t seed) : g_(g), seed_(seed) {
  const int H = g.heads, D = g.head_dim;
  qbasis_.resize(static_cast<size_t>(H) * kDirs * D);
  koffset_.resize(static_cast<size_t>(H) * D);
  for (int h = 0; h < H; ++h) {
    // Gram-Schmidt on Gaussian vectors
    float* u = qbasis_.data() + static_cast<size_t>(h) * kDirs * D;
    for (int i = 0; i < kDirs; ++i) {
      float* r = u + static_cast<size_t>(i) * D;
      for (int d = 0; d < D; ++d) r[d] = normal(1, h, i * D + d);
      for (int j = 0; j < i; ++j) {
        const float* p = u + static_cast<size_t>(j) * D;
        double dot = 0;
        for (int d = 0; d < D; ++d) dot += static_cast<double>(r[d]) * p[d];
        for (int d = 0; d < D; ++d) r[d] -= static_cast<float>(dot) * p[d];
      }
      double nrm = 0;
      for (int d = 0; d < D; ++d) nrm += static_cast<double>(r[d]) * r[d];
      for (int d = 0; d < D; ++d) r[d] /= static_cast<float>(std::sqrt(nrm));
    }
    for (int d = 0; d < D; ++d) koffset_[static_cast<size_t>(h) * D + d] = normal(2, h, d) * (d % 8 == 0 ? 3.0f : 0.5f);
  }
}

void SyntheticKv::frame(int64_t f, std::vector<float>* k, std::vector<float>* v) const {
  const int T = g_.tokens_per_frame, H = g_.heads, D = g_.head_dim;
  k->assign(static_cast<size_t>(T) * H * D, 0.0f);
  v->assign(k->size(), 0.0f);
  constexpr int kClusters = 12;
  for (int t = 0; t < T; ++t)
    for (int h = 0; h < H; ++h) {
      float* kr = k->data() + (static_cast<size_t>(t) * H + h) * D;
      float* vr = v->data() + (static_cast<size_t>(t) * H + h) * D;
      // cluster centres drift slowly: frame f mixes its epoch's centre with the next
      const int c = static_cast<int>((t * 7 + h) % kClusters);
      const int64_t epoch = f / 8;
      const float a = static_cast<float>(f % 8) / 8.0f;
      const float* u = qbasis_.data() + static_cast<size_t>(h) * kDirs * D;
      float coef[kDirs];
      for (int i = 0; i < kDirs; ++i)
        coef[i] = 1.2f * ((1 - a) * normal(3, epoch * 131 + c, h * kDirs + i) + a * normal(3, (epoch + 1) * 131 + c, h * kDirs + i)) +
                  0.5f * normal(4, f, (static_cast<int64_t>(t) * H + h) * kDirs + i);
      for (int d = 0; d < D; ++d) {
        const int64_t idx = (static_cast<int64_t>(t) * H + h) * D + d;
        float x = koffset_[static_cast<size_t>(h) * D + d] + 0.6f * normal(5, epoch * 131 + c, h * D + d) + 0.35f * normal(6, f, idx);
        for (int i = 0; i < kDirs; ++i) x += coef[i] * u[static_cast<size_t>(i) * D + d];
        kr[d] = x;
        vr[d] = 0.8f * normal(7, epoch * 131 + c, h * D + d) + 0.6f * normal(8, f, idx);
      }
    }
}

void SyntheticKv::queries(int64_t step, int n, std::vector<float>* q) const {
  const int H = g_.heads, D = g_.head_dim;
  q->assign(static_cast<size_t>(n) * H * D, 0.0f);
  for (int i = 0; i < n; ++i)
    for (int h = 0; h < H; ++h) {
      float* r = q->data() + (static_cast<size_t>(i) * H + h) * D;
      const float* u = qbasis_.data() + static_cast<size_t>(h) * kDirs * D;
      for (int d = 0; d < D; ++d) r[d] = 0.15f * normal(9, step, (static_cast<int64_t>(i) * H + h) * D + d);
      for (int j = 0; j < kDirs; ++j) {
        // most energy in the first directions: variances 9, 4.5, 3, ...
        const float a = 3.0f / std::sqrt(static_cast<float>(j + 1)) * normal(10, step, (static_cast<int64_t>(i) * H + h) * kDirs + j);
        for (int d = 0; d < D; ++d) r[d] += a * u[static_cast<size_t>(j) * D + d];
      }
    }
}

void SyntheticKv::block(int64_t step, int n, std::vector<float>* k, std::vector<float>* v) const {
  const int H = g_.heads, D = g_.head_dim;
  k->assign(static_cast<size_t>(n) * H * D, 0.0f);
  v->assign(k->size(), 0.0f);
  for (size_t i = 0; i < k->size(); ++i) {
    (*k)[i] = normal(11, step, static_cast<int64_t>(i));
    (*v)[i] = normal(12, step, static_cast<int64_t>(i));
  }
}

absl::Status fill_cache(KvCache* cache, const SyntheticKv& data, int frames, int query_tokens) {
  const KvGeometry& g = cache->geometry();
  std::vector<float> k, v, q;
  for (int f = 0; f < frames; ++f) {
    data.frame(f, &k, &v);
    data.queries(f, query_tokens, &q);
    for (int l = 0; l < g.layers; ++l) {
      cache->observe_queries(l, q.data(), query_tokens);
      if (auto st = cache->append(l, k.data(), v.data(), f, 1); !st.ok()) return st;
    }
  }
  return absl::OkStatus();
}

KvGeometry kv_case_geometry(int head_dim, int heads, int tokens_per_frame, int window_frames, int sink_frames, int layers) {
  KvGeometry g;
  g.layers = layers;
  g.heads = heads;
  g.head_dim = head_dim;
  g.tokens_per_frame = tokens_per_frame;
  g.window_frames = window_frames;
  g.sink_frames = sink_frames;
  g.frames_per_block = 1;
  return g;
}

std::vector<KvCase> kv_test_cases() {
  std::vector<KvCase> out;
  const char* formats[] = {"fp16", "kivi2", "qvg2", "quantwm2", "quantwm2-qsac", "quantwm2-psac",
                           "kivi2-k", "kivi2-v", "qvg2-k", "qvg2-v", "quantwm2-k"};
  for (int hd : {64, 128})
    for (const char* f : formats) {
      KvCase c;
      c.format = f;
      c.geometry = kv_case_geometry(hd, 2, 48, 5, 1);
      c.frames = 9;  // eviction across spans, a sink, the buffer/pending parts
      c.query_tokens = 24;
      c.seed = 7;
      c.name = absl::StrCat(f, "/hd", hd);
      out.push_back(c);
    }
  // multi-frame spans (pending fp16 frames, split at eviction), PSAC 4-bit, sinks quantized, KIVI G=64
  KvCase c;
  c.geometry = kv_case_geometry(64, 2, 32, 6, 2);
  c.frames = 13;
  c.query_tokens = 16;
  c.seed = 3;
  c.format = "quantwm2";
  c.options.span_frames = 4;
  c.options.psac_bits = 4;
  c.options.psac_refresh_frames = 5;
  c.name = "quantwm2/span4/psac4";
  out.push_back(c);
  c.format = "qvg2";
  c.options = {};
  c.options.quantize_sinks = true;
  c.options.span_frames = 3;
  c.options.block = 32;
  c.name = "qvg2/sinks-quantized/span3/b32";
  out.push_back(c);
  c.format = "kivi2";
  c.options = {};
  c.options.kivi_group = 64;
  c.options.kivi_residual = 128;
  c.name = "kivi2/g64/r128";
  out.push_back(c);
  return out;
}

std::vector<KvCase> kv_bench_cases(int head_dim) {
  std::vector<KvCase> out;
  for (int tokens : {256, 1024, 4096, 16384})
    for (const char* f : {"fp16", "kivi2", "qvg2", "quantwm2"}) {
      KvCase c;
      c.format = f;
      const int frames = tokens / 64;
      c.geometry = kv_case_geometry(head_dim, 4, 64, frames, 0);
      c.frames = frames;
      c.query_tokens = 64;
      c.seed = 11;
      c.name = absl::StrCat(f, "/hd", head_dim, "/", tokens);
      out.push_back(c);
    }
  return out;
}

}  // namespace wm
