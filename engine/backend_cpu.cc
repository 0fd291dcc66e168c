// The CPU backend: OpenBLAS (engine/blas.h) for the GEMMs, OpenMP loops for everything else.
// It implements every op and is the oracle the other backends are tested against.
#include <Eigen/Dense>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "engine/backend.h"
#include "engine/blas.h"
#include "engine/noise.h"
#include "engine/rope.h"

namespace wm {
namespace {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int threads) {
    const int n = cpu_threads_used(threads);
    omp_set_num_threads(n);
    if (blas::load().ok()) blas::set_threads(n);  // (the engine refuses to start without it)
  }
  ~CpuBackend() override {
    for (float* w : weights_) delete[] w;
  }

  absl::string_view name() const override { return "cpu"; }
  bool supports(BackendOp) const override { return true; }

  void* alloc(size_t bytes) override { return std::aligned_alloc(64, (bytes + 63) / 64 * 64); }
  void free(void* p) override { std::free(p); }
  void upload(void* dst, const void* host, size_t bytes) override { std::memcpy(dst, host, bytes); }
  void download(void* host, const void* src, size_t bytes) override { std::memcpy(host, src, bytes); }
  const void* upload_weight(const float* host, int out, int in) override {
    const size_t n = static_cast<size_t>(out) * in;
    float* w = new float[n];
    std::memcpy(w, host, n * sizeof(float));
    weights_.push_back(w);
    return w;
  }

  void linear(const LinearWeight& w, const float* x, int n, float* y) override {
    if (n == 0) return;
    if (w.b != nullptr) {
#pragma omp parallel for schedule(static)
      for (int i = 0; i < n; ++i) std::memcpy(y + static_cast<size_t>(i) * w.out, w.b, sizeof(float) * w.out);
    }
    blas::sgemm_nt(n, w.out, w.in, 1.0f, x, w.in, static_cast<const float*>(w.w), w.in, w.b != nullptr ? 1.0f : 0.0f,
                   y, w.out);
  }

  void layer_norm_modulate(const float* x, int n, int d, const float* shift, const float* scale, int mod_stride,
                           int tokens_per_frame, float eps, float* y) override {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < n; ++i) {
      const float* xr = x + static_cast<size_t>(i) * d;
      float* yr = y + static_cast<size_t>(i) * d;
      double mean = 0, var = 0;
      for (int j = 0; j < d; ++j) mean += xr[j];
      mean /= d;
      for (int j = 0; j < d; ++j) var += (xr[j] - mean) * (xr[j] - mean);
      var /= d;
      const float inv = static_cast<float>(1.0 / std::sqrt(var + eps));
      const float m = static_cast<float>(mean);
      const int f = i / tokens_per_frame;
      const float* sh = shift + static_cast<size_t>(f) * mod_stride;
      const float* sc = scale + static_cast<size_t>(f) * mod_stride;
      for (int j = 0; j < d; ++j) yr[j] = (xr[j] - m) * inv * (1.0f + sc[j]) + sh[j];
    }
  }

  void rms_norm_rope(float* x, int n, int heads, int head_dim, int row_stride, const float* norm_w,
                     const int32_t* pos, const RopeParams& rope, float eps) override {
    const float* cs = rope_angles(n, head_dim, pos, rope);
    const int pairs = head_dim / 2;
#pragma omp parallel for schedule(static)
    for (int i = 0; i < n; ++i) {
      const float* ci = cs + static_cast<size_t>(i) * pairs * 2;
      for (int h = 0; h < heads; ++h) {
        float* v = x + static_cast<size_t>(i) * row_stride + h * head_dim;
        double ss = 0;
        for (int d = 0; d < head_dim; ++d) ss += static_cast<double>(v[d]) * v[d];
        const float inv = static_cast<float>(1.0 / std::sqrt(ss / head_dim + eps));
        for (int d = 0; d < head_dim; ++d) v[d] = v[d] * inv * norm_w[d];
        for (int j = 0; j < pairs; ++j) {
          const float c = ci[2 * j], s = ci[2 * j + 1];
          const float x0 = v[2 * j], x1 = v[2 * j + 1];
          v[2 * j] = x0 * c - x1 * s;
          v[2 * j + 1] = x0 * s + x1 * c;
        }
      }
    }
  }

  void gelu(float* x, int64_t count) override {
    // Eigen's vectorised tanh: libm's scalar tanhf was a third of the step time
    constexpr int64_t kChunk = 4096;
    const int64_t chunks = (count + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t begin = c * kChunk, n = std::min(kChunk, count - begin);
      Eigen::Map<Eigen::ArrayXf> v(x + begin, n);
      v = 0.5f * v * (1.0f + (0.7978845608028654f * (v + 0.044715f * v.cube())).tanh());
    }
  }

  void gated_residual(float* h, const float* y, const float* gate, int mod_stride, int n, int d,
                      int tokens_per_frame) override {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < n; ++i) {
      const float* g = gate + static_cast<size_t>(i / tokens_per_frame) * mod_stride;
      float* hr = h + static_cast<size_t>(i) * d;
      const float* yr = y + static_cast<size_t>(i) * d;
      for (int j = 0; j < d; ++j) hr[j] += g[j] * yr[j];
    }
  }

  void patchify(const float* frames, int frames_count, const FrameShape& s, float* tokens) override {
    const int gw = s.grid_w(), T = s.tokens(), P = s.patch_dim(), p = s.patch, C = s.channels;
    for (int f = 0; f < frames_count; ++f) {
      const float* fr = frames + static_cast<size_t>(f) * s.height * s.width * C;
      for (int n = 0; n < T; ++n) {
        const int r = n / gw, c = n % gw;
        float* tok = tokens + (static_cast<size_t>(f) * T + n) * P;
        for (int py = 0; py < p; ++py)
          for (int px = 0; px < p; ++px)
            for (int ch = 0; ch < C; ++ch)
              tok[(py * p + px) * C + ch] = fr[(static_cast<size_t>(r * p + py) * s.width + (c * p + px)) * C + ch];
      }
    }
  }

  void unpatchify(const float* tokens, int frames_count, const FrameShape& s, float* frames) override {
    const int gw = s.grid_w(), T = s.tokens(), P = s.patch_dim(), p = s.patch, C = s.channels;
    for (int f = 0; f < frames_count; ++f) {
      float* fr = frames + static_cast<size_t>(f) * s.height * s.width * C;
      for (int n = 0; n < T; ++n) {
        const int r = n / gw, c = n % gw;
        const float* tok = tokens + (static_cast<size_t>(f) * T + n) * P;
        for (int py = 0; py < p; ++py)
          for (int px = 0; px < p; ++px)
            for (int ch = 0; ch < C; ++ch)
              fr[(static_cast<size_t>(r * p + py) * s.width + (c * p + px)) * C + ch] = tok[(py * p + px) * C + ch];
      }
    }
  }

  void euler_step(float* x, const float* v, const float* dt_per_frame, int frames_count, int64_t values_per_frame,
                  bool clamp) override {
    for (int f = 0; f < frames_count; ++f) {
      const float dt = dt_per_frame[f];
      float* xf = x + f * values_per_frame;
      const float* vf = v + f * values_per_frame;
      for (int64_t i = 0; i < values_per_frame; ++i) {
        float y = xf[i] + dt * vf[i];
        if (clamp) y = std::fmin(1.0f, std::fmax(-1.0f, y));
        xf[i] = y;
      }
    }
  }

  void add_rows(const float* rows, const float* per_block, int n_rows, int blocks, int width, float* out) override {
    for (int b = 0; b < blocks; ++b)
      for (int r = 0; r < n_rows; ++r) {
        const float* in = rows + static_cast<int64_t>(r) * width;
        const float* p = per_block + static_cast<int64_t>(b) * width;
        float* o = out + (static_cast<int64_t>(b) * n_rows + r) * width;
        for (int j = 0; j < width; ++j) o[j] = in[j] + p[j];
      }
  }

  void noise_frames(std::span<const uint64_t> seeds, std::span<const int64_t> frames, int64_t values_per_frame,
                    float* out) override {
    const int64_t n = static_cast<int64_t>(std::min(seeds.size(), frames.size()));
    // 4096 values a chunk: each value costs a log and a cos in double
    const int64_t chunks = (values_per_frame + 4095) / 4096;
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < n * chunks; ++c) {
      const int64_t f = c / chunks, e0 = (c % chunks) * 4096, e1 = std::min(values_per_frame, e0 + 4096);
      float* o = out + f * values_per_frame;
      for (int64_t e = e0; e < e1; ++e) o[e] = noise_normal(seeds[static_cast<size_t>(f)], frames[static_cast<size_t>(f)], e);
    }
  }

 private:
  // cos/sin per (token, pair), [n, pairs, 2]; every layer of a forward uses the
  // same positions, so the table is kept until the positions change
  const float* rope_angles(int n, int head_dim, const int32_t* pos, const RopeParams& rope) {
    const bool same = rope_pos_.size() == static_cast<size_t>(n) * 3 && rope_head_dim_ == head_dim &&
                      std::memcmp(rope_pos_.data(), pos, rope_pos_.size() * sizeof(int32_t)) == 0 &&
                      rope_params_.theta == rope.theta && rope_params_.t_pairs == rope.t_pairs &&
                      rope_params_.h_pairs == rope.h_pairs && rope_params_.w_pairs == rope.w_pairs;
    if (same) return rope_cs_.data();
    rope_pos_.assign(pos, pos + static_cast<size_t>(n) * 3);
    rope_head_dim_ = head_dim;
    rope_params_ = rope;
    const RopeTable table(rope, head_dim);
    const int pairs = head_dim / 2;
    rope_cs_.resize(static_cast<size_t>(n) * pairs * 2);
#pragma omp parallel for schedule(static)
    for (int i = 0; i < n; ++i) table.angles(pos + 3 * i, rope_cs_.data() + static_cast<size_t>(i) * pairs * 2);
    return rope_cs_.data();
  }

  std::vector<float*> weights_;
  std::vector<int32_t> rope_pos_;
  std::vector<float> rope_cs_;
  int rope_head_dim_ = 0;
  RopeParams rope_params_;
};

}  // namespace

int cpu_threads_used(int threads) {
  const int cores = std::max(1, omp_get_num_procs());
  return std::min(threads > 0 ? threads : std::max(1, omp_get_max_threads()), cores);
}

std::unique_ptr<Backend> make_cpu_backend(int threads) { return std::make_unique<CpuBackend>(threads); }

}  // namespace wm
