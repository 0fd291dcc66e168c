// Backend parity (llama.cpp test-backend-ops style): one table of op cases,
// each run with the same random inputs on the CPU backend (the oracle) and on
// the CUDA plugin, and compared element by element: EVERY value must satisfy
//
//     |cuda - cpu| <= abs + rms * RMS(cpu) + rel * |cpu|
//
// with the case's stated tolerance (Tol). Plus the KV cache round trip, the
// error paths, a sanitizer smoke test that runs every kernel once on small
// shapes (tools/gpu-run.sh runs it under compute-sanitizer), and end-to-end
// frames within a stated PSNR. Without a GPU (or without the plugin) every
// CUDA test skips with the reason, so CI stays green.
//
// Tolerances and why:
//   exact ops (patchify, unpatchify)             0
//   initial noise                                1e-6 abs: the same double formula; the GPU's
//                                                 log/cos may differ by an ulp, which moves a
//                                                 float by one ulp about once in 2^29 values
//   fp32 elementwise (gelu, gated residual,      1e-5 abs + 1e-5 rel: same fp32 formula,
//     euler step)                                 libm vs CUDA tanh/fma differences
//   layer norm + modulation, RMSNorm + RoPE      1e-4 abs + 1e-4 rel: fp32 vs double sums,
//                                                 float sincos of the double-reduced angle
//   linear (bf16 weights and inputs, fp32        3e-2 * RMS(cpu) + 1e-2 rel: bf16 keeps 8
//     accumulation)                               significant bits, about 0.3% of RMS per value
//   attention (fp16 q, k, v and probabilities)   kAttentionAbs = 1e-2 abs: the CPU holds q and
//                                                 the block's k, v in fp32; cuda_host_test's
//                                                 Fp16ErrorBudget measures <= 1.7e-3 for the same
//                                                 math on these inputs (outputs up to ~3.5)
//   frames end to end                            PSNR >= kMinPsnrDb = 35 dB on every frame (8-bit
//                                                 RGB); bf16 weights alone give ~56 dB on the CPU
//                                                 with these configs, a wrong kernel gives < 20
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <functional>
#include <map>
#include <numeric>
#include <random>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/backend.h"
#include "engine/engine.h"
#include "engine/model.h"
#include "engine/model_config.h"
#include "engine/weights.h"
#include "engine/plugin_loader.h"
#include "quant/probe.h"
#include "tests/engine/cuda_plugin_path.h"
#include "tests/engine/source_file.h"

namespace wm {
namespace {

constexpr double kAttentionAbs = 1e-2;
constexpr double kMinPsnrDb = 35.0;
// the plugin's "attention.pingpong" and "attention.stages" defaults (cuda_backend.h) where
// WM_CUDA_ATTENTION_PINGPONG and WM_CUDA_ATTENTION_STAGES do not set them
constexpr int64_t kPingpongDefault = 1;
constexpr int64_t kStagesDefault = 3;

// ---- backends ---------------------------------------------------------------------

struct Backends {
  std::unique_ptr<Backend> cpu;
  std::unique_ptr<PluginBackend> cuda;
  std::string why_not;
};

// made once and never destroyed: the CUDA runtime tears itself down at exit
Backends& backends() {
  static Backends* b = [] {
    auto* x = new Backends;
    x->cpu = make_cpu_backend(0);
    PluginBackendOptions o;
    o.path = test::cuda_plugin_path();
    o.kv_pool_bytes = int64_t{1} << 30;
    o.abort_on_error = false;
    auto c = make_plugin_backend(o);
    if (c.ok()) {
      x->cuda = std::move(*c);
      const WmPluginDeviceInfo& i = x->cuda->device_info();
      std::printf("CUDA backend: %s (sm_%d%d, %d SMs) from %s\n", i.name, i.sm_major, i.sm_minor, i.multiprocessors,
                  x->cuda->plugin().path().c_str());
    } else {
      x->why_not = c.status().ToString();
    }
    return x;
  }();
  return *b;
}

#define WM_REQUIRE_CUDA()                                                                         \
  do {                                                                                            \
    if (backends().cuda == nullptr) GTEST_SKIP() << "no CUDA backend: " << backends().why_not;     \
    backends().cuda->take_status().IgnoreError(); /* a failure belongs to the case that made it */ \
  } while (0)

// sets plugin tuning knobs for one scope (no-op on other backends)
class Tuning {
 public:
  Tuning(Backend& b, std::vector<std::pair<std::string, int64_t>> knobs) : pb_(dynamic_cast<PluginBackend*>(&b)) {
    if (pb_ == nullptr) return;
    for (const auto& [k, v] : knobs) {
      EXPECT_TRUE(pb_->set_tuning(k, v).ok()) << k;
      reset_.push_back(k);
    }
  }
  ~Tuning() {
    if (pb_ == nullptr) return;
    for (const std::string& k : reset_) {
      const int64_t def = k == "attention.split"                   ? -1
                          : k == "shadow" || k == "ffn.fused"        ? 1
                          : k == "attention.fused_inputs"            ? 1
                          : k == "attention.bf16_output"             ? 1
                          : k == "attention.min_tiles_per_split"     ? 4
                          : k == "attention.pingpong"                ? -1
                          : k == "attention.ws_tma"                  ? -1
                                                                     : 0;
      EXPECT_TRUE(pb_->set_tuning(k, def).ok()) << k;
    }
  }

 private:
  PluginBackend* pb_;
  std::vector<std::string> reset_;
};

// whether the CUDA backend can run the wgmma attention kernel (sm_90a code: compute capability 9.0)
bool wgmma_available() {
  PluginBackend* pb = backends().cuda.get();
  if (pb == nullptr || !pb->set_tuning("attention.kernel", 2).ok()) return false;
  return pb->set_tuning("attention.kernel", 0).ok();
}

// and the warp-specialised one (refused where the occupancy calculator says it cannot launch)
bool ws_available() {
  PluginBackend* pb = backends().cuda.get();
  if (pb == nullptr || !pb->set_tuning("attention.kernel", 4).ok()) return false;
  return pb->set_tuning("attention.kernel", 0).ok();
}

// buffers of one backend, freed at scope end
class Buffers {
 public:
  explicit Buffers(Backend& b) : b_(b) {}
  ~Buffers() {
    for (void* p : owned_) b_.free(p);
  }
  template <class T>
  T* put(const std::vector<T>& host) {
    const size_t bytes = std::max<size_t>(1, host.size()) * sizeof(T);
    void* p = b_.alloc(bytes);
    if (!host.empty()) b_.upload(p, host.data(), host.size() * sizeof(T));
    owned_.push_back(p);
    return static_cast<T*>(p);
  }
  float* zeros(size_t n) { return put(std::vector<float>(n, 0.0f)); }
  std::vector<float> get(const float* p, size_t n) {
    std::vector<float> h(n);
    if (n > 0) b_.download(h.data(), p, n * sizeof(float));
    return h;
  }

 private:
  Backend& b_;
  std::vector<void*> owned_;
};

std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.0f, float mean = 0.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(mean, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// ---- comparison ---------------------------------------------------------------------

struct Tol {
  double abs = 0, rms = 0, rel = 0;  // bound_i = abs + rms * RMS(cpu) + rel * |cpu_i|
};

::testing::AssertionResult close(const std::vector<float>& cpu, const std::vector<float>& cuda, Tol t) {
  if (cpu.size() != cuda.size())
    return ::testing::AssertionFailure() << "sizes differ: cpu " << cpu.size() << ", cuda " << cuda.size();
  double sq = 0, err_sq = 0;
  for (size_t i = 0; i < cpu.size(); ++i) sq += static_cast<double>(cpu[i]) * cpu[i];
  const double rms = cpu.empty() ? 0 : std::sqrt(sq / cpu.size());
  int64_t bad = 0;
  size_t worst = 0;
  double worst_excess = -1, max_err = 0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    const double e = std::fabs(static_cast<double>(cuda[i]) - cpu[i]);
    err_sq += e * e;
    max_err = std::max(max_err, std::isfinite(e) ? e : INFINITY);
    const double bound = t.abs + t.rms * rms + t.rel * std::fabs(cpu[i]);
    const double excess = std::isfinite(e) ? e - bound : INFINITY;
    if (excess > 0) ++bad;
    if (excess > worst_excess) {
      worst_excess = excess;
      worst = i;
    }
  }
  const double nmse = sq > 0 ? err_sq / sq : err_sq;
  if (bad > 0)
    return ::testing::AssertionFailure()
           << bad << " of " << cpu.size() << " values outside |cuda - cpu| <= " << t.abs << " + " << t.rms
           << " * RMS(cpu) + " << t.rel << " * |cpu| (RMS(cpu) = " << rms << "); worst at " << worst << ": cpu "
           << cpu[worst] << ", cuda " << cuda[worst] << "; max |err| " << max_err << ", nmse " << nmse;
  return ::testing::AssertionSuccess() << "max |err| " << max_err << ", nmse " << nmse << " over " << cpu.size();
}

// ---- the case table ---------------------------------------------------------------

struct OpCase {
  std::string name;
  Tol tol;
  // runs the op on a backend with inputs drawn from `seed`, returns the outputs
  std::function<std::vector<float>(Backend&, uint32_t seed)> run;
  // optional: where the values outside the tolerance are, to tell a layout bug from rounding
  std::function<std::string(const std::vector<float>& cpu, const std::vector<float>& cuda)> explain;
};

// gtest prints a case by its name
void PrintTo(const OpCase& c, std::ostream* os) { *os << c.name; }

OpCase linear_case(int n, int in, int out, bool bias, bool fallback = false) {
  OpCase c;
  c.name = "linear_n" + std::to_string(n) + "_in" + std::to_string(in) + "_out" + std::to_string(out) +
           (bias ? "_bias" : "") + (fallback ? "_fallback" : "");
  c.tol = {1e-5, 3e-2, 1e-2};
  c.run = [=](Backend& b, uint32_t seed) {
    Tuning t(b, fallback ? std::vector<std::pair<std::string, int64_t>>{{"linear.fallback", 1}}
                         : std::vector<std::pair<std::string, int64_t>>{});
    Buffers buf(b);
    const auto x = randn(static_cast<size_t>(n) * in, seed);
    const auto w = randn(static_cast<size_t>(out) * in, seed + 1, 1.0f / std::sqrt(static_cast<float>(in)));
    const auto bv = randn(static_cast<size_t>(out), seed + 2);
    LinearWeight lw{b.upload_weight(w.data(), out, in), bias ? buf.put(bv) : nullptr, out, in};
    float* y = buf.zeros(static_cast<size_t>(n) * out);
    b.linear(lw, buf.put(x), n, y);
    return buf.get(y, static_cast<size_t>(n) * out);
  };
  return c;
}

OpCase layer_norm_case(int n, int d, int tokens_per_frame) {
  OpCase c;
  c.name = "layer_norm_modulate_n" + std::to_string(n) + "_d" + std::to_string(d) + "_T" +
           std::to_string(tokens_per_frame);
  c.tol = {1e-4, 0, 1e-4};
  c.run = [=](Backend& b, uint32_t seed) {
    Buffers buf(b);
    const int frames = (n + tokens_per_frame - 1) / tokens_per_frame, stride = 6 * d;
    const auto x = randn(static_cast<size_t>(n) * d, seed, 2.0f, 0.5f);
    const auto mod = randn(static_cast<size_t>(frames) * stride, seed + 1, 0.3f);
    float* m = buf.put(mod);
    float* y = buf.zeros(static_cast<size_t>(n) * d);
    b.layer_norm_modulate(buf.put(x), n, d, m + d, m + 2 * d, stride, tokens_per_frame, 1e-6f, y);
    return buf.get(y, static_cast<size_t>(n) * d);
  };
  return c;
}

// (t, row, col) of n tokens from frame t0 on, and RoPE pairs split over the three axes
std::vector<int32_t> rope_positions(int n, int32_t t0) {
  std::vector<int32_t> pos(static_cast<size_t>(n) * 3);
  for (int i = 0; i < n; ++i) {
    pos[3 * i] = t0 + i / 7;
    pos[3 * i + 1] = (i / 3) % 11;
    pos[3 * i + 2] = i % 13;
  }
  return pos;
}

RopeParams rope_of(int head_dim) {
  const int pairs = head_dim / 2, tp = pairs / 3 + pairs % 3, hp = pairs / 3;
  return RopeParams{10000.0f, tp, hp, pairs - tp - hp};
}

OpCase rms_norm_rope_case(int n, int heads, int head_dim, int extra_stride, int32_t t0) {
  OpCase c;
  c.name = "rms_norm_rope_n" + std::to_string(n) + "_h" + std::to_string(heads) + "_hd" + std::to_string(head_dim) +
           "_stride" + std::to_string(heads * head_dim + extra_stride) + "_t" + std::to_string(t0);
  c.tol = {1e-4, 0, 1e-4};
  c.run = [=](Backend& b, uint32_t seed) {
    Buffers buf(b);
    const int stride = heads * head_dim + extra_stride;
    const auto x = randn(static_cast<size_t>(n) * stride, seed, 1.5f);
    const auto w = randn(static_cast<size_t>(head_dim), seed + 1, 0.2f, 1.0f);
    float* xd = buf.put(x);
    b.rms_norm_rope(xd, n, heads, head_dim, stride, buf.put(w), buf.put(rope_positions(n, t0)), rope_of(head_dim),
                    1e-6f);
    return buf.get(xd, x.size());
  };
  return c;
}

OpCase gelu_case(int64_t count) {
  OpCase c;
  c.name = "gelu_" + std::to_string(count);
  c.tol = {1e-5, 0, 1e-5};
  c.run = [=](Backend& b, uint32_t seed) {
    Buffers buf(b);
    const auto x = randn(static_cast<size_t>(count), seed, 3.0f);
    float* xd = buf.put(x);
    b.gelu(xd, count);
    return buf.get(xd, x.size());
  };
  return c;
}

// the feed-forward block: GELU between two GEMMs; on CUDA fused (the GELU in
// the first GEMM's epilogue, the hidden layer in bf16 only) or, with
// "ffn.fused" 0, the unfused ops
OpCase ffn_case(int n, int in, int hidden, int out, bool bias0, bool bias2, bool fused = true) {
  OpCase c;
  c.name = "ffn_n" + std::to_string(n) + "_in" + std::to_string(in) + "_hidden" + std::to_string(hidden) + "_out" +
           std::to_string(out) + (bias0 ? "_bias0" : "") + (bias2 ? "_bias2" : "") + (fused ? "" : "_unfused");
  c.tol = {1e-5, 3e-2, 1e-2};
  c.run = [=](Backend& b, uint32_t seed) {
    Tuning t(b, {{"ffn.fused", fused ? 1 : 0}});
    Buffers buf(b);
    const auto x = randn(static_cast<size_t>(n) * in, seed);
    const auto w0 = randn(static_cast<size_t>(hidden) * in, seed + 1, 1.5f / std::sqrt(static_cast<float>(in)));
    const auto w2 = randn(static_cast<size_t>(out) * hidden, seed + 2, 1.0f / std::sqrt(static_cast<float>(hidden)));
    const auto b0 = randn(static_cast<size_t>(hidden), seed + 3, 0.5f), b2 = randn(static_cast<size_t>(out), seed + 4);
    LinearWeight l0{b.upload_weight(w0.data(), hidden, in), bias0 ? buf.put(b0) : nullptr, hidden, in};
    LinearWeight l2{b.upload_weight(w2.data(), out, hidden), bias2 ? buf.put(b2) : nullptr, out, hidden};
    float* h = buf.zeros(static_cast<size_t>(n) * hidden);
    float* y = buf.zeros(static_cast<size_t>(n) * out);
    b.ffn(l0, l2, buf.put(x), n, h, y);
    return buf.get(y, static_cast<size_t>(n) * out);
  };
  return c;
}

OpCase gated_residual_case(int n, int d, int tokens_per_frame) {
  OpCase c;
  c.name = "gated_residual_n" + std::to_string(n) + "_d" + std::to_string(d) + "_T" + std::to_string(tokens_per_frame);
  c.tol = {1e-5, 0, 1e-5};
  c.run = [=](Backend& b, uint32_t seed) {
    Buffers buf(b);
    const int frames = (n + tokens_per_frame - 1) / tokens_per_frame, stride = 6 * d;
    const auto h = randn(static_cast<size_t>(n) * d, seed), y = randn(h.size(), seed + 1);
    const auto gate = randn(static_cast<size_t>(frames) * stride, seed + 2);
    float* hd = buf.put(h);
    b.gated_residual(hd, buf.put(y), buf.put(gate) + 2 * d, stride, n, d, tokens_per_frame);
    return buf.get(hd, h.size());
  };
  return c;
}

// the residual add and the next norm in one op: h afterwards, then u; the
// gate's rows and the norm's shift/scale rows at different strides (the
// head's norm follows the last layer's residual)
OpCase gated_residual_norm_case(int n, int d, int tokens_per_frame, int mod_stride) {
  OpCase c;
  c.name = "gated_residual_norm_n" + std::to_string(n) + "_d" + std::to_string(d) + "_T" +
           std::to_string(tokens_per_frame) + "_mod" + std::to_string(mod_stride);
  c.tol = {1e-4, 0, 1e-4};
  c.run = [=](Backend& b, uint32_t seed) {
    Buffers buf(b);
    const int frames = (n + tokens_per_frame - 1) / tokens_per_frame, stride = 6 * d;
    const auto h = randn(static_cast<size_t>(n) * d, seed, 2.0f, 0.5f), y = randn(h.size(), seed + 1);
    const auto gate = randn(static_cast<size_t>(frames) * stride, seed + 2);
    const auto mod = randn(static_cast<size_t>(frames) * mod_stride, seed + 3, 0.3f);
    float *hd = buf.put(h), *m = buf.put(mod), *u = buf.zeros(h.size());
    b.gated_residual_norm(hd, buf.put(y), buf.put(gate) + 5 * d, stride, n, d, tokens_per_frame, m, m + d,
                          mod_stride, 1e-6f, u);
    auto out = buf.get(hd, h.size());
    const auto uh = buf.get(u, h.size());
    out.insert(out.end(), uh.begin(), uh.end());
    return out;
  };
  return c;
}

// q and k normed and rotated by one call, each with its own weights: q, then k
OpCase rms_norm_rope_qk_case(int n, int heads, int head_dim, int extra_stride, int32_t t0) {
  OpCase c;
  c.name = "rms_norm_rope_qk_n" + std::to_string(n) + "_h" + std::to_string(heads) + "_hd" +
           std::to_string(head_dim) + "_stride" + std::to_string(heads * head_dim + extra_stride) + "_t" +
           std::to_string(t0);
  c.tol = {1e-4, 0, 1e-4};
  c.run = [=](Backend& b, uint32_t seed) {
    Buffers buf(b);
    const int stride = heads * head_dim + extra_stride;
    const auto q = randn(static_cast<size_t>(n) * stride, seed, 1.5f), k = randn(q.size(), seed + 1, 0.7f);
    const auto qw = randn(static_cast<size_t>(head_dim), seed + 2, 0.2f, 1.0f);
    const auto kw = randn(static_cast<size_t>(head_dim), seed + 3, 0.2f, 0.5f);
    float *qd = buf.put(q), *kd = buf.put(k);
    b.rms_norm_rope_qk(qd, buf.put(qw), kd, buf.put(kw), n, heads, head_dim, stride, buf.put(rope_positions(n, t0)),
                       rope_of(head_dim), 1e-6f);
    auto out = buf.get(qd, q.size());
    const auto kh = buf.get(kd, k.size());
    out.insert(out.end(), kh.begin(), kh.end());
    return out;
  };
  return c;
}

OpCase patchify_case(FrameShape s, int frames, bool inverse) {
  OpCase c;
  c.name = std::string(inverse ? "unpatchify_" : "patchify_") + std::to_string(s.height) + "x" +
           std::to_string(s.width) + "x" + std::to_string(s.channels) + "_p" + std::to_string(s.patch) + "_f" +
           std::to_string(frames);
  c.tol = {0, 0, 0};
  c.run = [=](Backend& b, uint32_t seed) {
    Buffers buf(b);
    const size_t n = static_cast<size_t>(frames) * s.height * s.width * s.channels;
    const auto x = randn(n, seed);
    float* out = buf.zeros(n);
    if (inverse) {
      b.unpatchify(buf.put(x), frames, s, out);
    } else {
      b.patchify(buf.put(x), frames, s, out);
    }
    return buf.get(out, n);
  };
  return c;
}

// every layer's modulation from the frames' conditioning: rows + per-block vector
OpCase add_rows_case(int n_rows, int blocks, int width) {
  OpCase c;
  c.name = "add_rows_r" + std::to_string(n_rows) + "_b" + std::to_string(blocks) + "_w" + std::to_string(width);
  c.tol = {0, 0, 0};
  c.run = [=](Backend& b, uint32_t seed) {
    Buffers buf(b);
    const auto rows = randn(static_cast<size_t>(n_rows) * width, seed);
    const auto per = randn(static_cast<size_t>(blocks) * width, seed + 1);
    float* out = buf.zeros(static_cast<size_t>(blocks) * n_rows * width);
    b.add_rows(buf.put(rows), buf.put(per), n_rows, blocks, width, out);
    return buf.get(out, static_cast<size_t>(blocks) * n_rows * width);
  };
  return c;
}

// a batch's initial noise: frames of different sessions and indices (late
// frames, a seed with its top bit set), an odd frame size
OpCase noise_case(int64_t values_per_frame) {
  OpCase c;
  c.name = "noise_frames_v" + std::to_string(values_per_frame);
  c.tol = {1e-6, 0, 0};
  c.run = [=](Backend& b, uint32_t seed) {
    Buffers buf(b);
    const std::vector<uint64_t> seeds = {seed, seed, 0x8000000000000001ull, 42};
    const std::vector<int64_t> frames = {0, 1, 123456789, 7};
    float* out = buf.zeros(seeds.size() * static_cast<size_t>(values_per_frame));
    b.noise_frames(seeds, frames, values_per_frame, out);
    return buf.get(out, seeds.size() * static_cast<size_t>(values_per_frame));
  };
  return c;
}

OpCase euler_case(int frames, int64_t values, bool clamp) {
  OpCase c;
  c.name = "euler_step_f" + std::to_string(frames) + "_v" + std::to_string(values) + (clamp ? "_clamp" : "");
  c.tol = {1e-5, 0, 1e-5};
  c.run = [=](Backend& b, uint32_t seed) {
    Buffers buf(b);
    const auto x = randn(static_cast<size_t>(frames * values), seed, 0.7f);
    const auto v = randn(x.size(), seed + 1);
    const auto dt = randn(static_cast<size_t>(frames), seed + 2, 0.3f);
    float* xd = buf.put(x);
    b.euler_step(xd, buf.put(v), buf.put(dt), frames, values, clamp);
    return buf.get(xd, x.size());
  };
  return c;
}

// attention of a batch of sessions with different cache lengths (every layer)
struct AttnSpec {
  int heads = 2, head_dim = 64, tokens_per_frame = 17, window = 4, sinks = 1, frames_per_block = 2, layers = 2;
  std::vector<int> cached;  // frames cached per session before the step
  std::string format = "fp16";       // every session's cache format, unless `formats` names each
  std::vector<std::string> formats;
  KvFormatOptions options;
  float q_scale = 1.0f;
  std::vector<std::pair<std::string, int64_t>> tuning;
  std::string label;
  bool observe = false;  // attend before each append (QuantWM-2's statistics and bases then exist)
};

KvGeometry geometry_of(const AttnSpec& a) {
  KvGeometry g;
  g.layers = a.layers;
  g.heads = a.heads;
  g.head_dim = a.head_dim;
  g.tokens_per_frame = a.tokens_per_frame;
  g.window_frames = a.window;
  g.sink_frames = a.sinks;
  g.frames_per_block = a.frames_per_block;
  return g;
}

// fills each cache with its frames (random K/V, appended in blocks like the write pass)
std::vector<std::unique_ptr<KvCache>> filled_caches(Backend& b, Buffers& buf, const AttnSpec& a, uint32_t seed) {
  const KvGeometry g = geometry_of(a);
  const size_t frame_vals = static_cast<size_t>(a.tokens_per_frame) * a.heads * a.head_dim;
  std::vector<std::unique_ptr<KvCache>> caches;
  for (size_t s = 0; s < a.cached.size(); ++s) {
    auto c = b.make_kv_cache(a.formats.empty() ? a.format : a.formats[s], g, a.options);
    EXPECT_TRUE(c.ok()) << c.status();
    if (!c.ok()) return {};
    for (int f = 0; f < a.cached[s]; f += a.frames_per_block) {
      const int n = std::min(a.frames_per_block, a.cached[s] - f);
      for (int l = 0; l < a.layers; ++l) {
        const uint32_t r = seed + static_cast<uint32_t>(1000 * s + 10 * f + l);
        float* k = buf.put(randn(frame_vals * n, r));
        float* v = buf.put(randn(frame_vals * n, r + 7));
        if (a.observe) {  // the write pass's queries, as a session's step attends before it appends
          const SessionSlice one{c->get(), 0, n};
          b.attention(l, std::span<const SessionSlice>(&one, 1), a.tokens_per_frame,
                      buf.put(randn(frame_vals * n, r + 3, a.q_scale)), k, v, buf.zeros(frame_vals * n));
        }
        const absl::Status st = (*c)->append(l, k, v, f, n);
        EXPECT_TRUE(st.ok()) << st;
      }
    }
    caches.push_back(std::move(*c));
  }
  return caches;
}

OpCase attention_case(const AttnSpec& a) {
  OpCase c;
  c.name = "attention_" + a.label + "_hd" + std::to_string(a.head_dim) + "_h" + std::to_string(a.heads) + "_T" +
           std::to_string(a.tokens_per_frame);
  for (const auto& [k, v] : a.tuning) {
    std::string key = k.substr(k.find('.') + 1);
    c.name += "_" + key + (v < 0 ? std::string("auto") : std::to_string(v));
  }
  c.tol = {kAttentionAbs, 0, 0};
  c.run = [=](Backend& b, uint32_t seed) {
    Tuning t(b, a.tuning);
    Buffers buf(b);
    auto caches = filled_caches(b, buf, a, seed);
    if (caches.size() != a.cached.size()) return std::vector<float>{};
    const size_t S = caches.size(), T = static_cast<size_t>(a.tokens_per_frame), F = static_cast<size_t>(a.frames_per_block);
    const size_t rows = S * F * T, vals = rows * a.heads * a.head_dim;
    std::vector<SessionSlice> slices;
    for (size_t s = 0; s < S; ++s) slices.push_back({caches[s].get(), static_cast<int>(s * F), static_cast<int>(F)});
    float* q = buf.put(randn(vals, seed + 11, a.q_scale));
    float* k = buf.put(randn(vals, seed + 12));
    float* v = buf.put(randn(vals, seed + 13));
    float* out = buf.zeros(vals);
    std::vector<float> all;
    for (int l = 0; l < a.layers; ++l) {
      b.attention(l, slices, a.tokens_per_frame, q, k, v, out);
      const auto o = buf.get(out, vals);
      all.insert(all.end(), o.begin(), o.end());
    }
    return all;
  };
  // outputs are [layers][rows][heads][head_dim]: count the bad values by channel group, row within a
  // warp's 16, head and layer (a wrong fragment or descriptor shows as a pattern, rounding does not)
  c.explain = [=](const std::vector<float>& cpu, const std::vector<float>& cuda) {
    const size_t hd = static_cast<size_t>(a.head_dim), H = static_cast<size_t>(a.heads);
    const size_t per_layer = cpu.size() / static_cast<size_t>(a.layers);
    std::map<size_t, int64_t> by_channel, by_row16, by_head, by_layer;
    for (size_t i = 0; i < cpu.size() && i < cuda.size(); ++i) {
      if (!(std::fabs(cpu[i] - cuda[i]) > kAttentionAbs)) continue;
      const size_t j = i % per_layer;
      ++by_channel[j % hd / 8];
      ++by_row16[j / (H * hd) % 16];
      ++by_head[j / hd % H];
      ++by_layer[i / per_layer];
    }
    std::ostringstream os;
    for (const auto& [name, m] : {std::pair{"channels/8", &by_channel}, std::pair{"row%16", &by_row16},
                                  std::pair{"head", &by_head}, std::pair{"layer", &by_layer}}) {
      os << " bad by " << name << ":";
      for (const auto& [k, n] : *m) os << " " << k << "=" << n;
    }
    return os.str();
  };
  return c;
}

std::vector<OpCase> all_cases() {
  std::vector<OpCase> cases;
  // linear: odd shapes, the model's shapes (patch embed 64 -> 1536, qkv/o 1536, head 1536 -> 64), bias or not
  for (auto [n, in, out, bias] : std::vector<std::tuple<int, int, int, bool>>{
           {1, 7, 3, true}, {5, 64, 96, false}, {33, 256, 130, true}, {97, 64, 1536, true},
           {300, 1536, 1536, true}, {131, 1536, 64, true}, {64, 1536, 8960, true}, {64, 8960, 1536, false}})
    cases.push_back(linear_case(n, in, out, bias));
  cases.push_back(linear_case(33, 256, 130, true, /*fallback=*/true));
  cases.push_back(linear_case(5, 7, 3, false, /*fallback=*/true));
  for (auto [n, d, T] : std::vector<std::tuple<int, int, int>>{{1, 64, 1}, {7, 1000, 3}, {300, 1536, 880}, {130, 256, 64}})
    cases.push_back(layer_norm_case(n, d, T));
  for (int hd : {32, 64, 128}) {
    cases.push_back(rms_norm_rope_case(40, 2, hd, 0, 0));
    cases.push_back(rms_norm_rope_case(9, 3, hd, 16, 5000));  // late frames, rows with a gap
  }
  cases.push_back(rms_norm_rope_case(100, 12, 128, 0, 123));
  cases.push_back(rms_norm_rope_qk_case(33, 3, 64, 0, 7));
  cases.push_back(rms_norm_rope_qk_case(20, 12, 128, 8, 4000));
  for (int64_t n : {1, 7, 1000, 65539}) cases.push_back(gelu_case(n));
  // ffn: odd widths (a hidden layer of 13 pads its bf16 rows to 16), no first bias (the plain GELU
  // epilogue), the default model's 256 -> 1024 -> 256 and Matrix-Game-2's 1536 -> 8960 -> 1536
  for (bool fused : {true, false}) {
    cases.push_back(ffn_case(5, 7, 13, 3, false, true, fused));
    cases.push_back(ffn_case(37, 96, 200, 96, true, false, fused));
    cases.push_back(ffn_case(64, 256, 1024, 256, true, true, fused));
  }
  cases.push_back(ffn_case(97, 1536, 8960, 1536, true, true));
  for (auto [n, d, T] : std::vector<std::tuple<int, int, int>>{{1, 5, 1}, {70, 256, 64}, {9, 33, 4}})
    cases.push_back(gated_residual_case(n, d, T));
  for (auto [n, d, T, ms] : std::vector<std::tuple<int, int, int, int>>{
           {1, 64, 1, 6 * 64}, {70, 256, 64, 2 * 256}, {9, 1000, 4, 6 * 1000}, {300, 1536, 880, 6 * 1536}})
    cases.push_back(gated_residual_norm_case(n, d, T, ms));
  for (bool inv : {false, true}) {
    cases.push_back(patchify_case({8, 12, 3, 4}, 2, inv));
    cases.push_back(patchify_case({44, 80, 16, 2}, 3, inv));
    cases.push_back(patchify_case({32, 32, 3, 8}, 1, inv));
  }
  for (bool clamp : {false, true}) cases.push_back(euler_case(3, 1001, clamp));
  for (int64_t v : {1, 4099, 12288}) cases.push_back(noise_case(v));
  cases.push_back(add_rows_case(1, 1, 7));
  cases.push_back(add_rows_case(37, 8, 1536));
  cases.push_back(add_rows_case(1100, 3, 256));
  // attention: sessions at different cache lengths (empty, partial, past the window), head_dim 32/64/128,
  // odd tokens per frame, both block sizes, no split / forced splits / auto
  const std::vector<std::vector<std::pair<std::string, int64_t>>> tunings = {
      {{"attention.block_q", 64}, {"attention.split", 1}},
      {{"attention.block_q", 128}, {"attention.split", 1}},
      {{"attention.block_q", 64}, {"attention.split", 3}},
      {{"attention.block_q", 128}, {"attention.split", 2}},
      {{"attention.split", -1}}};
  // every attention case runs on the mma.sync kernel (kernel1) and, for head_dim 64 and 128, on the
  // wgmma kernels (kernel2 plain, kernel3 overlapped; skipped where the GPU is not compute capability 9.0)
  // (kernel2 at head_dim 128 only: it is not built for 64), kernel3 with 3, 4 and 5 K/V stages
  // (the default and the other two) and with its ping-pong setting flipped, and kernel4
  // (warp-specialised) with 3 and 4 stages, ping-pong flipped and 64 and 128 keys a step, with the
  // cache's whole tiles copied by cp.async or by TMA
  auto per_kernel = [&](AttnSpec a) {
    const auto base = a.tuning;
    for (int64_t kernel : {1, 2, 3, 4}) {
      if (kernel >= 2 && a.head_dim == 32) continue;
      if (kernel == 2 && a.head_dim != 128) continue;
      for (int64_t stages : {0, 3, 4, 5}) {
        if (stages == kStagesDefault) continue;  // 0 runs it
        if (stages != 0 && kernel < 3) continue;
        if (stages == 5 && kernel == 4) continue;
        a.tuning = base;
        a.tuning.emplace_back("attention.kernel", kernel);
        if (stages != 0) a.tuning.emplace_back("attention.stages", stages);
        cases.push_back(attention_case(a));
      }
      if (kernel >= 3) {  // and with its two warpgroups in ping-pong or not (where block_q is 128)
        a.tuning = base;
        a.tuning.emplace_back("attention.kernel", kernel);
        a.tuning.emplace_back("attention.pingpong", 1 - kPingpongDefault);
        cases.push_back(attention_case(a));
      }
      if (kernel == 4) {  // 64 and 128 keys a step, whatever the query tile, by cp.async and by TMA
        for (int64_t keys : {64, 128})
          for (int64_t tma : {0, 1}) {
            if (a.head_dim == 64 && tma == 1 && keys == 128) continue;  // one TMA case at head_dim 64
            a.tuning = base;
            a.tuning.emplace_back("attention.kernel", kernel);
            a.tuning.emplace_back("attention.ws_keys", keys);
            if (tma == 1) a.tuning.emplace_back("attention.ws_tma", 1);
            cases.push_back(attention_case(a));
          }
        if (a.head_dim == 128) {  // the TMA build's deeper rings: 5 and 6 stages of 64 keys
          for (int64_t stages : {5, 6}) {
            a.tuning = base;
            a.tuning.emplace_back("attention.kernel", kernel);
            a.tuning.emplace_back("attention.ws_keys", 64);
            a.tuning.emplace_back("attention.ws_tma", 1);
            a.tuning.emplace_back("attention.stages", stages);
            cases.push_back(attention_case(a));
          }
        }
      }
    }
  };
  // KIVI-2 caches (the kernels decode their tiles): each group size, sessions at different lengths
  // (empty, partial, past the window), with and without a sink, both query tiles, split or not, on
  // the mma.sync kernel and the Hopper ones (plain at head_dim 128, overlapped, ping-pong flipped;
  // the warp-specialised choice runs the overlapped one for KIVI-2); and a batch that mixes fp16 and
  // KIVI-2 sessions (one call per format)
  auto kivi_kernels = [&](AttnSpec a) {
    const auto base = a.tuning;
    for (int64_t kernel : {1, 2, 3, 4}) {
      if (kernel >= 2 && a.head_dim == 32) continue;
      if (kernel == 2 && a.head_dim != 128) continue;
      a.tuning = base;
      a.tuning.emplace_back("attention.kernel", kernel);
      cases.push_back(attention_case(a));
    }
    if (a.head_dim == 32) return;
    a.tuning = base;
    a.tuning.emplace_back("attention.kernel", 3);
    a.tuning.emplace_back("attention.pingpong", 1 - kPingpongDefault);
    cases.push_back(attention_case(a));
  };
  for (auto [hd, group, T, sinks] : std::vector<std::tuple<int, int, int, int>>{
           {32, 32, 64, 1}, {64, 32, 64, 1}, {128, 32, 64, 0}, {128, 64, 64, 1}, {128, 128, 128, 1}})
    for (const auto& tu : std::vector<std::vector<std::pair<std::string, int64_t>>>{
             {{"attention.block_q", 64}, {"attention.split", 1}},
             {{"attention.block_q", 128}, {"attention.split", 3}},
             {{"attention.split", -1}}}) {
      AttnSpec a;
      a.head_dim = hd;
      a.tokens_per_frame = T;
      a.sinks = sinks;
      a.format = "kivi2";
      a.options.kivi_group = group;
      a.options.kivi_residual = group;
      a.cached = {0, 3, 9};
      a.tuning = tu;
      a.label = "kivi2g" + std::to_string(group) + "_s" + std::to_string(sinks);
      kivi_kernels(a);
    }
  {
    AttnSpec a;
    a.tokens_per_frame = 64;
    a.formats = {"kivi2", "fp16", "kivi2"};
    a.cached = {9, 3, 2};
    a.label = "mixed_kivi2_fp16";
    kivi_kernels(a);
  }
  // QVG-2 / QuantWM-2 caches (the kernels decode their tiles, PSAC folded into the keys): residual
  // blocks of 16..128 channels, int8 and int4 coefficients, frames that end mid-tile (80 tokens),
  // sinks or none, the queries observed before each append (so that bases exist), on every kernel;
  // and a batch mixing them with fp16 (one call per format)
  for (auto [format, hd, block, T, sinks, bits] : std::vector<std::tuple<const char*, int, int, int, int, int>>{
           {"qvg2", 32, 16, 64, 1, 8}, {"quantwm2", 64, 64, 64, 1, 8}, {"quantwm2", 128, 32, 80, 0, 4},
           {"qvg2", 128, 128, 64, 1, 8}})
    for (const auto& tu : std::vector<std::vector<std::pair<std::string, int64_t>>>{
             {{"attention.block_q", 64}, {"attention.split", 1}},
             {{"attention.block_q", 128}, {"attention.split", 3}},
             {{"attention.split", -1}}}) {
      AttnSpec a;
      a.head_dim = hd;
      a.tokens_per_frame = T;
      a.sinks = sinks;
      a.format = format;
      a.options.block = block;
      a.options.psac_bits = bits;
      a.options.tokens_per_centroid = 32;
      a.options.psac_refresh_frames = 2;
      a.observe = true;
      a.cached = {0, 3, 9};
      a.tuning = tu;
      a.label = std::string(format) + "b" + std::to_string(block) + "_s" + std::to_string(sinks);
      kivi_kernels(a);
    }
  {
    AttnSpec a;
    a.tokens_per_frame = 64;
    a.formats = {"quantwm2", "fp16", "qvg2"};
    a.observe = true;
    a.cached = {9, 3, 2};
    a.label = "mixed_span_fp16";
    kivi_kernels(a);
  }
  for (int hd : {32, 64, 128}) {
    // the smallest cases first: one session, only its own block (one partial key tile), then one
    // full cache tile and the block
    AttnSpec a;
    a.head_dim = hd;
    a.heads = 1;
    a.layers = 1;
    a.sinks = 0;
    a.frames_per_block = 1;
    a.tokens_per_frame = 16;
    a.cached = {0};
    a.label = "single";
    per_kernel(a);
    a.tokens_per_frame = 64;
    a.window = 1;
    a.cached = {1};
    a.label = "onetile";
    per_kernel(a);
  }
  for (int hd : {32, 64, 128})
    for (const auto& tu : tunings) {
      AttnSpec a;
      a.head_dim = hd;
      a.heads = hd == 128 ? 2 : 3;
      a.cached = {0, 3, 9};
      a.tuning = tu;
      a.label = "batch3";
      per_kernel(a);
    }
  {
    AttnSpec a;  // one 64-query block over a long cache: the split-KV path
    a.heads = 2;
    a.head_dim = 128;
    a.tokens_per_frame = 64;
    a.window = 48;
    a.sinks = 0;
    a.frames_per_block = 1;
    a.cached = {48};
    a.q_scale = 3.0f;
    a.label = "long";
    per_kernel(a);
    a.tuning = {{"attention.split", 1}};
    per_kernel(a);
  }
  {
    AttnSpec a;  // two warpgroups over many key tiles: every K/V stage refilled, with and without ping-pong
    a.heads = 2;
    a.head_dim = 128;
    a.tokens_per_frame = 64;
    a.window = 12;
    a.sinks = 0;
    a.frames_per_block = 2;
    a.cached = {12};
    a.q_scale = 3.0f;
    a.label = "refill";
    a.tuning = {{"attention.block_q", 128}, {"attention.split", 1}};
    per_kernel(a);
  }
  {
    AttnSpec a;  // many queries per session (several 128-row tiles), sharp softmax
    a.heads = 4;
    a.head_dim = 64;
    a.tokens_per_frame = 100;
    a.window = 3;
    a.sinks = 0;
    a.frames_per_block = 3;
    a.cached = {3, 6};
    a.q_scale = 3.0f;
    a.label = "wide";
    per_kernel(a);
  }
  return cases;
}

class BackendOps : public ::testing::TestWithParam<OpCase> {};

TEST_P(BackendOps, CudaMatchesCpu) {
  WM_REQUIRE_CUDA();
  const OpCase& c = GetParam();
  if ((c.name.find("_kernel2") != std::string::npos || c.name.find("_kernel3") != std::string::npos ||
       c.name.find("_kernel4") != std::string::npos) &&
      !wgmma_available())
    GTEST_SKIP() << "the wgmma attention kernels need compute capability 9.0";
  if (c.name.find("_kernel4") != std::string::npos && !ws_available())
    GTEST_SKIP() << "the warp-specialised kernel does not fit this GPU";
  const auto cpu = c.run(*backends().cpu, 1234);
  const auto cuda = c.run(*backends().cuda, 1234);
  ASSERT_TRUE(backends().cuda->status().ok()) << backends().cuda->status();
  ASSERT_FALSE(cpu.empty());
  const auto r = close(cpu, cuda, c.tol);
  EXPECT_TRUE(r) << c.name << (!r && c.explain ? c.explain(cpu, cuda) : std::string());
  if (r) std::printf("  %s: %s\n", c.name.c_str(), r.message());
}

INSTANTIATE_TEST_SUITE_P(Parity, BackendOps, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<OpCase>& i) { return i.param.name; });

// a failed attention case says where its bad values are (runs without a GPU: CPU output, perturbed)
TEST(ParityReport, AttentionMismatchesAreGroupedByLayout) {
  AttnSpec a;
  a.heads = 2;
  a.head_dim = 64;
  a.cached = {0, 3};
  const OpCase c = attention_case(a);
  const auto cpu = c.run(*backends().cpu, 3);
  auto bad = cpu;
  const size_t per_layer = cpu.size() / static_cast<size_t>(a.layers);
  int64_t n = 0;
  for (size_t j = 0; j < per_layer; ++j)
    if (j / 64 % 2 == 1 && j % 64 / 8 == 5) {  // head 1, channels 40..47, layer 1
      bad[per_layer + j] += 1.0f;
      ++n;
    }
  ASSERT_GT(n, 0);
  EXPECT_FALSE(close(cpu, bad, c.tol));
  const std::string why = c.explain(cpu, bad);
  const std::string count = "=" + std::to_string(n);
  EXPECT_NE(why.find("bad by channels/8: 5" + count), std::string::npos) << why;
  EXPECT_NE(why.find("bad by head: 1" + count), std::string::npos) << why;
  EXPECT_NE(why.find("bad by layer: 1" + count), std::string::npos) << why;
  EXPECT_EQ(c.explain(cpu, cpu).find('='), std::string::npos) << "nothing bad, nothing counted";
}

// ---- KV caches on the device -------------------------------------------------------

TEST(CudaKvCache, RoundTripsFramesAndValuesExactly) {
  WM_REQUIRE_CUDA();
  AttnSpec a;
  a.cached = {0, 1, 4, 11};
  a.frames_per_block = 3;
  Buffers cpu_buf(*backends().cpu), cuda_buf(*backends().cuda);
  auto cpu = filled_caches(*backends().cpu, cpu_buf, a, 5);
  auto cuda = filled_caches(*backends().cuda, cuda_buf, a, 5);
  ASSERT_EQ(cpu.size(), cuda.size());
  for (size_t s = 0; s < cpu.size(); ++s)
    for (int l = 0; l < a.layers; ++l) {
      EXPECT_EQ(cuda[s]->frames(l), cpu[s]->frames(l)) << "session " << s << " layer " << l;
      std::vector<float> ck, cv, gk, gv;
      cpu[s]->reconstruct(l, &ck, &cv);
      cuda[s]->reconstruct(l, &gk, &gv);
      EXPECT_EQ(gk, ck) << "fp16 on both sides: bit-exact";
      EXPECT_EQ(gv, cv);
    }
  // whole pages: at least the values, at most one page per (layer, head) more
  const int64_t values = cpu[3]->bytes().total();
  EXPECT_GE(cuda[3]->bytes().total(), values);
  const BackendMemory m = backends().cuda->memory();
  EXPECT_GT(m.kv_pool_capacity, 0);
  EXPECT_GT(m.kv_pool_used, 0);
  EXPECT_GE(m.kv_pool_reserved, m.kv_pool_used);
  EXPECT_GT(m.device_total, 0);
  ASSERT_TRUE(backends().cuda->status().ok()) << backends().cuda->status();
}

int64_t counter(const char* name);  // a plugin counter (below)

// audit mode's probes on the device (cuda/kv_probe.cuh): each sample's
// top tokens in a cache and in its fp16 reference (frame order), the summed
// squared logit differences and both attention outputs over cache and
// block are those of the layers' reconstructions, for every format with
// device pages, head sizes 32 to 128, frames that end mid-tile and windows
// that have wrapped (slots out of frame order); the statistics made from
// them are those made from the reconstructions; a bad sample, layer or
// top-k is an error that harms nothing, and a host reference is not a pair
TEST(CudaKvCache, ProbesRankAsTheReconstructionsDo) {
  WM_REQUIRE_CUDA();
  Backend& b = *backends().cuda;
  struct Case {
    const char* format;
    int hd, T, sinks, window, frames;
  };
  for (const Case& cs : std::vector<Case>{{"fp16", 64, 17, 1, 4, 9},
                                          {"fp16", 128, 70, 0, 3, 3},
                                          {"kivi2", 64, 64, 1, 4, 9},
                                          {"kivi2", 32, 128, 0, 3, 7},
                                          {"qvg2", 32, 64, 1, 4, 7},
                                          {"quantwm2", 128, 80, 0, 3, 8}}) {
    SCOPED_TRACE(std::string(cs.format) + " head_dim " + std::to_string(cs.hd) + " T " + std::to_string(cs.T));
    AttnSpec a;
    a.heads = 3;
    a.head_dim = cs.hd;
    a.tokens_per_frame = cs.T;
    a.sinks = cs.sinks;
    a.window = cs.window;
    a.format = cs.format;
    a.options.block = std::min(cs.hd, 32);
    a.options.tokens_per_centroid = 32;
    a.options.psac_refresh_frames = 2;
    a.observe = true;
    a.cached = {cs.frames};
    Buffers buf(b);
    auto filled = filled_caches(b, buf, a, 5);
    ASSERT_EQ(filled.size(), 1u);
    const KvCache& c = *filled[0];
    AttnSpec ref_spec = a;  // the same frames in fp16: the reference a device shadow is
    ref_spec.format = "fp16";
    auto ref_filled = filled_caches(b, buf, ref_spec, 5);
    ASSERT_EQ(ref_filled.size(), 1u);
    const KvCache& ref = *ref_filled[0];

    const int n = 70, H = a.heads, Dh = cs.hd, topk = 8;  // a block past one key tile
    const size_t vals = static_cast<size_t>(n) * H * Dh;
    const auto q = randn(vals, 91, 1.5f), kc = randn(vals, 92), vc = randn(vals, 93);
    const float *dq = buf.put(q), *dk = buf.put(kc), *dv = buf.put(vc);
    const auto samples = probe_sample(n, H, 4, 7);
    const double scale = 1.0 / std::sqrt(static_cast<double>(Dh));
    for (int l = 0; l < a.layers; ++l) {
      ProbeRanks r;
      ASSERT_TRUE(c.probe_against(ref, l, dq, dk, dv, n, samples, topk, &r));
      std::vector<float> rk, rv, ck, cv;
      ref.reconstruct(l, &rk, &rv);
      c.reconstruct(l, &ck, &cv);
      const int64_t m = static_cast<int64_t>(rk.size()) / (H * Dh);
      ASSERT_EQ(r.tokens, m);
      ASSERT_EQ(r.tokens, static_cast<int64_t>(std::min(cs.frames, cs.window + cs.sinks)) * cs.T);
      ASSERT_EQ(r.k, topk);
      ASSERT_EQ(r.ref_top.size(), samples.size() * topk);
      ASSERT_EQ(r.ref_out.size(), samples.size() * Dh);
      int64_t bad = 0;
      for (size_t i = 0; i < samples.size(); ++i) {
        const int h = samples[i].head;
        const float* qi = q.data() + (static_cast<size_t>(samples[i].query) * H + h) * Dh;
        auto logit = [&](const float* key) {
          double dot = 0;
          for (int d = 0; d < Dh; ++d) dot += static_cast<double>(qi[d]) * key[d];
          return dot * scale;
        };
        std::vector<double> lr, lc, blk;
        for (int64_t j = 0; j < m; ++j) {
          lr.push_back(logit(rk.data() + (static_cast<size_t>(j) * H + h) * Dh));
          lc.push_back(logit(ck.data() + (static_cast<size_t>(j) * H + h) * Dh));
        }
        for (int j = 0; j < n; ++j) blk.push_back(logit(kc.data() + (static_cast<size_t>(j) * H + h) * Dh));
        // the top tokens: the host's, or one whose logit ties it within the
        // device's fp16 decoding
        for (auto [top, L] : {std::pair{r.ref_top.data(), &lr}, std::pair{r.cand_top.data(), &lc}}) {
          std::vector<int32_t> want(static_cast<size_t>(m));
          std::iota(want.begin(), want.end(), 0);
          std::stable_sort(want.begin(), want.end(), [&](int32_t x, int32_t y) { return (*L)[x] > (*L)[y]; });
          for (int e = 0; e < topk; ++e) {
            const int32_t got = top[i * topk + e];
            const bool ok = got >= 0 && got < m && std::fabs((*L)[got] - (*L)[want[e]]) <= 2e-3 * (1 + std::fabs((*L)[want[e]]));
            if (!ok && bad++ < 3)
              ADD_FAILURE() << "layer " << l << " sample " << i << " rank " << e << ": token " << got << ", want "
                            << want[e];
          }
        }
        double err = 0;
        for (int64_t j = 0; j < m; ++j) err += (lc[j] - lr[j]) * (lc[j] - lr[j]);
        EXPECT_NEAR(r.sq_err[i], err, 0.01 * err + 1e-4) << "layer " << l << " sample " << i;
        EXPECT_EQ(r.ref_nonfinite[i], 0);
        // the attention outputs over cache and block
        for (auto [hist, v, got] : {std::tuple{&lr, &rv, r.ref_out.data()}, std::tuple{&lc, &cv, r.cand_out.data()}}) {
          std::vector<double> s = *hist;
          s.insert(s.end(), blk.begin(), blk.end());
          const double mx = *std::max_element(s.begin(), s.end());
          double z = 0;
          std::vector<double> o(static_cast<size_t>(Dh), 0.0);
          for (size_t j = 0; j < s.size(); ++j) {
            const double w = std::exp(s[j] - mx);
            z += w;
            const float* row = j < static_cast<size_t>(m) ? v->data() + (j * H + h) * Dh
                                                           : vc.data() + ((j - m) * H + h) * Dh;
            for (int d = 0; d < Dh; ++d) o[static_cast<size_t>(d)] += w * row[d];
          }
          for (int d = 0; d < Dh; ++d) {
            const double want = o[static_cast<size_t>(d)] / z, g = got[i * Dh + static_cast<size_t>(d)];
            if (!(std::fabs(g - want) <= 5e-3 + 5e-3 * std::fabs(want)) && bad++ < 3)
              ADD_FAILURE() << "layer " << l << " sample " << i << " channel " << d << ": " << g << " vs " << want;
          }
        }
      }
      // the audit's statistics from the device's ranks are those from the reconstructions
      DriftStats on_device, on_host;
      ASSERT_TRUE(probe_ranks_stats(r, samples.size(), Dh, &on_device));
      std::vector<float> hq = q, hk = kc, hv = vc;
      ASSERT_TRUE(probe_caches(ref, c, l, hq.data(), hk.data(), hv.data(), n, samples, topk, &on_host));
      EXPECT_EQ(on_device.queries, static_cast<int64_t>(samples.size()));
      EXPECT_EQ(on_device.queries, on_host.queries);
      EXPECT_EQ(on_device.logits, on_host.logits);
      EXPECT_LE(std::abs(on_device.top1_mismatches - on_host.top1_mismatches), 1) << "a near tie may go either way";
      EXPECT_NEAR(on_device.topk_overlap_sum, on_host.topk_overlap_sum, 1.0);
      EXPECT_NEAR(on_device.logit_sq_err_sum, on_host.logit_sq_err_sum, 0.01 * on_host.logit_sq_err_sum + 1e-3);
      EXPECT_NEAR(on_device.output_rel_err_sum, on_host.output_rel_err_sum, 0.01 * on_host.output_rel_err_sum + 1e-2);
      if (std::string(cs.format) == "fp16") {
        EXPECT_EQ(on_device.top1_mismatches, 0);
        EXPECT_EQ(on_device.logit_sq_err_sum, 0.0);
      }
    }
    // bad arguments: an error, and the caches probe and attend on
    ProbeRanks r;
    std::vector<ProbeQuery> bad = samples;
    bad.push_back({H, 0});
    EXPECT_FALSE(c.probe_against(ref, 0, dq, dk, dv, n, bad, topk, &r));
    bad.back() = {0, n};
    EXPECT_FALSE(c.probe_against(ref, 0, dq, dk, dv, n, bad, topk, &r));
    EXPECT_FALSE(c.probe_against(ref, a.layers, dq, dk, dv, n, samples, topk, &r));
    EXPECT_FALSE(c.probe_against(ref, 0, dq, dk, dv, n, samples, 0, &r));
    EXPECT_FALSE(c.probe_against(ref, 0, dq, dk, dv, n, samples, 17, &r));
    auto host = backends().cpu->make_kv_cache("fp16", geometry_of(a), {});
    ASSERT_TRUE(host.ok());
    EXPECT_FALSE(c.probe_against(**host, 0, dq, dk, dv, n, samples, topk, &r)) << "not a pair of the device";
    EXPECT_TRUE(c.probe_against(ref, 0, dq, dk, dv, n, samples, topk, &r));
    ASSERT_TRUE(backends().cuda->status().ok()) << backends().cuda->status();
  }
  EXPECT_GT(counter("kv.probe_launches"), 0);
}

TEST(CudaKvCache, ErrorsAreValues) {
  WM_REQUIRE_CUDA();
  Backend& b = *backends().cuda;
  AttnSpec a;
  KvGeometry g = geometry_of(a);
  for (const char* format : {"qvg2", "quantwm2", "fp32"}) {
    // fp32 has no kernels; the span formats need the sink frames in whole key tiles (17 tokens are not)
    auto c = b.make_kv_cache(format, g, {});
    EXPECT_EQ(c.status().code(), absl::StatusCode::kUnimplemented) << format << ": " << c.status();
    EXPECT_EQ(b.kv_reservation_bytes(format, g, {}), 0) << format;
  }
  {
    KvGeometry sp = g;
    sp.sink_frames = 0;  // 17-token frames without sinks: the span formats hold them
    for (const char* format : {"qvg2", "quantwm2"}) {
      EXPECT_TRUE(b.make_kv_cache(format, sp, {}).ok()) << format;
      KvFormatOptions o;
      o.quantize_sinks = true;
      EXPECT_EQ(b.make_kv_cache(format, sp, o).status().code(), absl::StatusCode::kUnimplemented) << format;
      o = {};
      o.span_frames = 2;  // spans of several appends: fp16 frames pending across appends
      EXPECT_EQ(b.make_kv_cache(format, sp, o).status().code(), absl::StatusCode::kUnimplemented) << format;
      o = {};
      o.block = 48;
      EXPECT_EQ(b.make_kv_cache(format, sp, o).status().code(), absl::StatusCode::kInvalidArgument) << format;
    }
  }
  // KIVI-2 needs whole chunks per frame (17 tokens are not) and sinks in whole key tiles
  auto kivi = b.make_kv_cache("kivi2", g, {});
  EXPECT_EQ(kivi.status().code(), absl::StatusCode::kUnimplemented) << kivi.status();
  EXPECT_TRUE(absl::StrContains(kivi.status().message(), "multiple of the residual")) << kivi.status();
  EXPECT_EQ(b.kv_reservation_bytes("kivi2", g, {}), 0);
  KvGeometry g32 = g;
  g32.tokens_per_frame = 32;  // one sink frame of 32 tokens: half a key tile
  EXPECT_EQ(b.make_kv_cache("kivi2", g32, {}).status().code(), absl::StatusCode::kUnimplemented);
  g32.sink_frames = 0;
  EXPECT_TRUE(b.make_kv_cache("kivi2", g32, {}).ok());
  KvFormatOptions wide;
  wide.kivi_group = 128;  // does not divide head_dim 64
  wide.kivi_residual = 128;
  EXPECT_EQ(b.make_kv_cache("kivi2", g32, wide).status().code(), absl::StatusCode::kInvalidArgument);
  KvGeometry odd = g;
  odd.head_dim = 96;
  EXPECT_EQ(b.make_kv_cache("fp16", odd, {}).status().code(), absl::StatusCode::kUnimplemented);
  KvGeometry huge = g;
  huge.window_frames = 1 << 20;
  huge.tokens_per_frame = 880;
  EXPECT_FALSE(b.make_kv_cache("fp16", huge, {}).ok());
  auto c = b.make_kv_cache("fp16", g, {});
  ASSERT_TRUE(c.ok());
  Buffers buf(b);
  float* kv = buf.zeros(static_cast<size_t>(g.tokens_per_frame) * g.heads * g.head_dim);
  EXPECT_EQ((*c)->append(0, kv, kv, 3, 1).code(), absl::StatusCode::kFailedPrecondition);  // frames in order
  EXPECT_TRUE((*c)->append(0, kv, kv, 0, 1).ok());
  EXPECT_EQ((*c)->append(0, kv, kv, 0, 1).code(), absl::StatusCode::kFailedPrecondition);  // no frame twice
  EXPECT_EQ((*c)->append(7, kv, kv, 0, 1).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(backends().cuda->status().ok()) << backends().cuda->status();
}

// the caches of `a` filled alike on both backends, and one batch of
// frames[s] more frames for session s (the same K/V uploaded to each);
// `device`: the CUDA backend (the shared one unless a test makes its own)
struct AppendBatch {
  AppendBatch(const AttnSpec& a, const std::vector<int>& frames, uint32_t seed, Backend* device = nullptr)
      : spec(a),
        gpu(device != nullptr ? *device : *backends().cuda),
        cpu_buf(*backends().cpu),
        cuda_buf(gpu),
        cpu(filled_caches(*backends().cpu, cpu_buf, a, seed)),
        cuda(filled_caches(gpu, cuda_buf, a, seed)) {
    EXPECT_EQ(cuda.size(), a.cached.size());
    const size_t frame_vals = static_cast<size_t>(a.tokens_per_frame) * a.heads * a.head_dim;
    int batch = 0;
    for (size_t s = 0; s < cpu.size() && s < cuda.size(); ++s) {
      cpu_slices.push_back({cpu[s].get(), batch, frames[s]});
      cuda_slices.push_back({cuda[s].get(), batch, frames[s]});
      first.push_back(a.cached[s]);
      next.push_back(a.cached[s] + frames[s]);
      batch += frames[s];
    }
    const auto kh = randn(frame_vals * batch, seed + 62), vh = randn(frame_vals * batch, seed + 63);
    ck = cpu_buf.put(kh);
    cv = cpu_buf.put(vh);
    gk = cuda_buf.put(kh);
    gv = cuda_buf.put(vh);
  }
  bool ok() const { return cuda.size() == spec.cached.size() && cpu.size() == cuda.size(); }
  // the batch into layer l of each backend's caches
  absl::Status append_cpu(int l) {
    return backends().cpu->kv_append(l, cpu_slices, first, spec.tokens_per_frame, ck, cv);
  }
  absl::Status append_cuda(int l) {
    return gpu.kv_append(l, cuda_slices, first, spec.tokens_per_frame, gk, gv);
  }
  // the batch attends in every layer first, all sessions in one call on each
  // backend (random queries; each QuantWM-2 session observes its own rows)
  void attend(uint32_t seed) {
    int frames = 0;
    for (const SessionSlice& s : cpu_slices) frames += s.frames;
    const size_t vals = static_cast<size_t>(frames) * spec.tokens_per_frame * spec.heads * spec.head_dim;
    const auto q = randn(vals, seed, 2.0f), kq = randn(vals, seed + 1);
    for (int l = 0; l < spec.layers; ++l) {
      backends().cpu->attention(l, cpu_slices, spec.tokens_per_frame, cpu_buf.put(q), cpu_buf.put(kq),
                                cpu_buf.put(kq), cpu_buf.zeros(vals));
      gpu.attention(l, cuda_slices, spec.tokens_per_frame, cuda_buf.put(q), cuda_buf.put(kq), cuda_buf.put(kq),
                    cuda_buf.zeros(vals));
    }
  }
  // every cache holds the same frames and values on both backends, bit for bit
  void expect_same_caches() const {
    for (size_t s = 0; s < cpu.size(); ++s)
      for (int l = 0; l < spec.layers && cpu[s] != nullptr && cuda[s] != nullptr; ++l) {
        EXPECT_EQ(cuda[s]->format(), cpu[s]->format());
        EXPECT_EQ(cuda[s]->frames(l), cpu[s]->frames(l)) << "session " << s << " layer " << l;
        std::vector<float> k0, v0, k1, v1;
        cpu[s]->reconstruct(l, &k0, &v0);
        cuda[s]->reconstruct(l, &k1, &v1);
        EXPECT_EQ(k1, k0) << "session " << s << " layer " << l;
        EXPECT_EQ(v1, v0) << "session " << s << " layer " << l;
      }
  }

  AttnSpec spec;
  Backend& gpu;
  Buffers cpu_buf, cuda_buf;
  std::vector<std::unique_ptr<KvCache>> cpu, cuda;
  std::vector<SessionSlice> cpu_slices, cuda_slices;
  std::vector<int64_t> first, next;  // each session's first frame of the batch, and the frame after it
  float *ck = nullptr, *cv = nullptr, *gk = nullptr, *gv = nullptr;
};

// K/V frames with what every quantized format must survive: NaN, infinities,
// values past fp16's range, -0, and a channel constant over whole chunks
std::vector<float> hostile_frames(size_t values, int head_dim, uint32_t seed) {
  std::vector<float> x = randn(values, seed, 2.0f);
  for (size_t i = 0; i + 7 < values; i += 997) {
    x[i] = NAN;
    x[i + 1] = INFINITY;
    x[i + 2] = -INFINITY;
    x[i + 3] = 1e6f;
    x[i + 4] = -0.0f;
    x[i + 5] = 65504.0f;
  }
  for (size_t i = 5; i < values; i += static_cast<size_t>(head_dim)) x[i] = 0.75f;
  return x;
}

// every 11th token of hostile_frames 9 times as far out: farther from its
// centroid than 8x its cluster's median distance, where k-means stops
// letting a member move its centroid (quant/kmeans.h)
std::vector<float> with_far_tokens(std::vector<float> x, size_t token_values) {
  for (size_t t = 3; (t + 1) * token_values <= x.size(); t += 11)
    for (size_t i = t * token_values; i < (t + 1) * token_values; ++i) x[i] *= 9.0f;
  return x;
}

// every layer of the two caches holds the same frames and the same values,
// bit for bit (NaN included); `after`: the frames appended so far
// (`reference`: what the messages call the first cache)
void expect_bitwise_same(const KvCache& cpu, const KvCache& cuda, int layers, int after,
                         const std::string& reference = "cpu") {
  for (int l = 0; l < layers; ++l) {
    EXPECT_EQ(cuda.frames(l), cpu.frames(l)) << "after frame " << after << ", layer " << l;
    std::vector<float> ck, cv, gk, gv;
    cpu.reconstruct(l, &ck, &cv);
    cuda.reconstruct(l, &gk, &gv);
    ASSERT_EQ(gk.size(), ck.size());
    size_t bad_k = 0, bad_v = 0;
    std::string where;  // the first few differences: what a GPU run's log needs to place them
    const KvGeometry& g = cpu.geometry();
    const size_t D = static_cast<size_t>(g.head_dim), H = static_cast<size_t>(g.heads),
                 T = static_cast<size_t>(g.tokens_per_frame), per_frame = T * H * D;
    // differing keys and values per held frame (the sinks first): whether the
    // sinks' fp16 rows differ too, or only the coded frames, or some of them
    std::vector<size_t> bad_frame(ck.size() / per_frame, 0);
    for (size_t i = 0; i < ck.size(); ++i) {
      const bool k_differs = std::memcmp(&gk[i], &ck[i], sizeof(float)) != 0;
      const bool v_differs = std::memcmp(&gv[i], &cv[i], sizeof(float)) != 0;
      if ((k_differs || v_differs) && bad_k + bad_v < 6)
        where += absl::StrCat("\n  ", k_differs ? "key" : "value", " of held frame ", i / per_frame, ", token ",
                              i / (H * D) % T, ", head ", i / D % H, ", channel ", i % D, ": ", reference, " ",
                              k_differs ? ck[i] : cv[i], ", cuda ", k_differs ? gk[i] : gv[i]);
      bad_k += k_differs;
      bad_v += v_differs;
      bad_frame[i / per_frame] += static_cast<size_t>(k_differs) + v_differs;
    }
    if (bad_k + bad_v > 0) {
      where += absl::StrCat("\n  differing keys + values per held frame (of ", 2 * per_frame, "):");
      for (size_t f = 0; f < bad_frame.size(); ++f)
        absl::StrAppend(&where, " ", f < static_cast<size_t>(g.sink_frames) ? "sink " : "", bad_frame[f]);
    }
    EXPECT_EQ(bad_k, 0u) << "keys differ from the " << reference << " cache's, layer " << l << " after frame " << after
                         << where;
    EXPECT_EQ(bad_v, 0u) << "values differ from the " << reference << " cache's, layer " << l << " after frame "
                         << after;
    for (float x : gk) ASSERT_TRUE(std::isfinite(x)) << "a non-finite value was stored";
  }
}

// wm-default-64's cache geometry: 8 layers x 4 heads, head_dim 64, 64 tokens a frame, 1 sink + 16 frames
KvGeometry default_model_geometry() {
  KvGeometry g;
  g.layers = 8;
  g.heads = 4;
  g.head_dim = 64;
  g.tokens_per_frame = 64;
  g.window_frames = 16;
  g.sink_frames = 1;
  g.frames_per_block = 1;
  return g;
}

// KIVI-2 on the device keeps the CPU format's codes bit for bit: the same
// frames, appended in blocks past the window (ring eviction), reconstruct to
// the same floats through both backends, for every group size, with and
// without a sink frame; and a session's device pages hold a fraction of fp16's
TEST(CudaKivi, CodesAreTheCpuFormatsBitForBit) {
  WM_REQUIRE_CUDA();
  Backend &cpu_b = *backends().cpu, &cuda_b = *backends().cuda;
  for (auto [hd, group, T, sinks] : std::vector<std::tuple<int, int, int, int>>{
           {32, 32, 64, 1}, {64, 32, 64, 1}, {64, 64, 128, 0}, {128, 32, 64, 1}, {128, 128, 128, 2}}) {
    SCOPED_TRACE("head_dim " + std::to_string(hd) + " group " + std::to_string(group) + " T " + std::to_string(T) +
                 " sinks " + std::to_string(sinks));
    AttnSpec a;
    a.head_dim = hd;
    a.tokens_per_frame = T;
    a.sinks = sinks;
    a.window = 3;
    a.frames_per_block = 2;
    a.options.kivi_group = group;
    a.options.kivi_residual = T;  // a residual of a whole frame: several chunks at once
    const KvGeometry g = geometry_of(a);
    auto cpu = cpu_b.make_kv_cache("kivi2", g, a.options);
    auto cuda = cuda_b.make_kv_cache("kivi2", g, a.options);
    ASSERT_TRUE(cpu.ok()) << cpu.status();
    ASSERT_TRUE(cuda.ok()) << cuda.status();
    Buffers cpu_buf(cpu_b), cuda_buf(cuda_b);
    const size_t frame_vals = static_cast<size_t>(T) * a.heads * hd;
    for (int f = 0; f < 9; f += a.frames_per_block) {
      for (int l = 0; l < a.layers; ++l) {
        const auto k = hostile_frames(frame_vals * 2, hd, 100 + 10 * f + l);
        const auto v = hostile_frames(frame_vals * 2, hd, 500 + 10 * f + l);
        ASSERT_TRUE((*cpu)->append(l, cpu_buf.put(k), cpu_buf.put(v), f, 2).ok());
        const absl::Status st = (*cuda)->append(l, cuda_buf.put(k), cuda_buf.put(v), f, 2);
        ASSERT_TRUE(st.ok()) << st;
      }
      expect_bitwise_same(**cpu, **cuda, a.layers, f + 2);
    }
    // whole pages (these small windows fit one page per (layer, head) in either format)
    const int64_t fp16 = cuda_b.kv_reservation_bytes("fp16", g, {});
    const int64_t kivi = cuda_b.kv_reservation_bytes("kivi2", g, a.options);
    EXPECT_GT(kivi, 0);
    EXPECT_LE(kivi, fp16);
    EXPECT_LE((*cuda)->bytes().total(), kivi);
  }
  ASSERT_TRUE(backends().cuda->status().ok()) << backends().cuda->status();
}

// wm-default-64's session (8 layers x 4 heads, head_dim 64, 64 tokens a
// frame, 1 sink + 16 frames): fp16 takes 5 pages of 64 KiB per (layer,
// head); KIVI-2 one, its sink frame's fp16 unit (16 KiB) and the window's 16
// units of 2 chunks (3 KiB each) filling it exactly
TEST(CudaKivi, DefaultModelSessionFillsOnePagePerHead) {
  WM_REQUIRE_CUDA();
  Backend& b = *backends().cuda;
  const KvGeometry g = default_model_geometry();
  const int64_t fp16 = b.kv_reservation_bytes("fp16", g, {});
  const int64_t kivi = b.kv_reservation_bytes("kivi2", g, {});
  ASSERT_GT(kivi, 0);
  EXPECT_EQ(fp16 % 160, 0);
  EXPECT_EQ(kivi, fp16 / 160 * 32) << "one page per (layer, head)";
  EXPECT_EQ(kivi, int64_t{2} << 20) << "the CPU's KIVI-2 session holds 2,097,152 bytes (QUANT.md)";
  // a full session's pages are what it reserved
  Buffers buf(b);
  auto c = b.make_kv_cache("kivi2", g, {});
  ASSERT_TRUE(c.ok()) << c.status();
  const size_t frame_vals = static_cast<size_t>(g.tokens_per_frame) * g.heads * g.head_dim;
  float* k = buf.put(randn(frame_vals, 3));
  float* v = buf.put(randn(frame_vals, 4));
  for (int f = 0; f < 20; ++f)
    for (int l = 0; l < g.layers; ++l) ASSERT_TRUE((*c)->append(l, k, v, f, 1).ok());
  EXPECT_EQ((*c)->bytes().total(), kivi);
  ASSERT_TRUE(backends().cuda->status().ok()) << backends().cuda->status();
}

// the write pass of a batch that mixes formats: each format's sessions in
// one call, every cache then holds what it holds when appended alone
TEST(CudaKivi, MixedBatchesAppendAndAttendPerFormat) {
  WM_REQUIRE_CUDA();
  AttnSpec a;
  a.tokens_per_frame = 64;
  a.formats = {"kivi2", "fp16", "kivi2", "fp16"};
  a.cached = {0, 3, 6, 1};
  AppendBatch b(a, {2, 1, 2, 2}, 19);
  ASSERT_TRUE(b.ok());
  for (int l = 0; l < a.layers; ++l) {
    ASSERT_TRUE(b.append_cpu(l).ok());
    const absl::Status st = b.append_cuda(l);
    ASSERT_TRUE(st.ok()) << st;
  }
  b.expect_same_caches();
  const size_t frame_vals = static_cast<size_t>(a.tokens_per_frame) * a.heads * a.head_dim;
  Backend& cuda_b = *backends().cuda;
  Buffers& cuda_buf = b.cuda_buf;
  const auto& cuda = b.cuda;
  // one attention call per format, the KIVI-2 one on its own kernel
  const int64_t kivi_before = counter("attention.kivi_launches"), all_before = counter("attention.launches");
  std::vector<SessionSlice> step;
  for (size_t s = 0; s < cuda.size(); ++s) step.push_back({cuda[s].get(), static_cast<int>(s), 1});
  const size_t vals = cuda.size() * frame_vals;
  float* out = cuda_buf.zeros(vals);
  cuda_b.attention(0, step, a.tokens_per_frame, cuda_buf.put(randn(vals, 83)), cuda_buf.put(randn(vals, 84)),
                   cuda_buf.put(randn(vals, 85)), out);
  EXPECT_EQ(counter("attention.kivi_launches") - kivi_before, 1);
  EXPECT_EQ(counter("attention.launches") - all_before, 2);
  ASSERT_TRUE(backends().cuda->status().ok()) << backends().cuda->status();
}

// QVG-2 / QuantWM-2 on the device: the host codes each append as the CPU's
// cache does (the same ledger, statistics, bases and coder), so the stored
// codes decode to the CPU's values bit for bit: residual blocks of 16..128
// channels, int8 and int4 PSAC records, several bases (one per 2 frames),
// frames that end mid-unit (80 tokens), sinks or none, a shorter append
// among whole blocks, NaN, inf and values past fp16's range, and eviction
struct SpanCase {
  const char* format;
  int hd, block, T, sinks, fpb, bits, tokens_per_centroid, window, iters;
};

// (a window of 7 frames in blocks of 3 holds 5 spans' tables, so the tables make a ring of their own;
// the device runs each Lloyd iteration as two launches and finishes after the last: 0, 1 and 4 of them)
const std::vector<SpanCase>& span_cases() {
  static const std::vector<SpanCase> cases{{"qvg2", 64, 64, 64, 1, 1, 8, 64, 4, 4},
                                           {"quantwm2", 64, 32, 64, 1, 2, 8, 16, 4, 1},
                                           {"quantwm2", 128, 64, 80, 0, 3, 4, 32, 7, 4},
                                           {"qvg2", 32, 16, 64, 0, 2, 8, 8, 4, 0},
                                           {"quantwm2", 128, 128, 64, 2, 2, 8, 64, 4, 4}};
  return cases;
}

// seven appends of hostile frames into a CPU cache and a device cache of
// the case's format, each followed by the bit-for-bit comparison; with
// `reference` the device's backend, into two device caches instead
void expect_span_codes_match(const SpanCase& cs, Backend* reference = nullptr) {
  Backend &cpu_b = reference != nullptr ? *reference : *backends().cpu, &cuda_b = *backends().cuda;
  SCOPED_TRACE(std::string(cs.format) + " head_dim " + std::to_string(cs.hd) + " block " + std::to_string(cs.block) +
               " T " + std::to_string(cs.T) + " sinks " + std::to_string(cs.sinks) + " iterations " +
               std::to_string(cs.iters) + (&cpu_b == &cuda_b ? ", against a second device cache" : ""));
  AttnSpec a;
  a.head_dim = cs.hd;
  a.tokens_per_frame = cs.T;
  a.sinks = cs.sinks;
  a.window = cs.window;
  a.frames_per_block = cs.fpb;
  a.options.block = cs.block;
  a.options.psac_bits = cs.bits;
  a.options.tokens_per_centroid = cs.tokens_per_centroid;
  a.options.psac_refresh_frames = 2;
  a.options.kmeans_iters = cs.iters;
  const KvGeometry g = geometry_of(a);
  auto cpu = cpu_b.make_kv_cache(cs.format, g, a.options);
  auto cuda = cuda_b.make_kv_cache(cs.format, g, a.options);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  Buffers cpu_buf(cpu_b), cuda_buf(cuda_b);
  const size_t frame_vals = static_cast<size_t>(cs.T) * a.heads * cs.hd;
  int f = 0;
  for (int step = 0; step < 7; ++step) {
    const int n = step == 2 ? 1 : cs.fpb;  // a prompt's shorter chunk among whole blocks
    for (int l = 0; l < a.layers; ++l) {
      // the block's queries first (QuantWM-2's statistics), then its K/V
      const uint32_t r = static_cast<uint32_t>(100 * step + l);
      auto q = randn(frame_vals * n, r, 2.0f);
      // a few non-finite query values: their rows stay out of QuantWM-2's statistics
      for (size_t i = 7; step % 2 == 1 && i < q.size(); i += 997) q[i] = i % 2 ? NAN : INFINITY;
      const size_t token_vals = static_cast<size_t>(a.heads) * cs.hd;
      const auto k = with_far_tokens(hostile_frames(frame_vals * n, cs.hd, 1000 + r), token_vals);
      const auto v = with_far_tokens(hostile_frames(frame_vals * n, cs.hd, 5000 + r), token_vals);
      const auto kq = randn(frame_vals * n, r + 1);
      for (auto [b, buf, c] : {std::tuple{&cpu_b, &cpu_buf, cpu->get()}, std::tuple{&cuda_b, &cuda_buf, cuda->get()}}) {
        const SessionSlice one{c, 0, n};
        b->attention(l, std::span<const SessionSlice>(&one, 1), cs.T, buf->put(q), buf->put(kq), buf->put(kq),
                     buf->zeros(frame_vals * n));
      }
      ASSERT_TRUE((*cpu)->append(l, cpu_buf.put(k), cpu_buf.put(v), f, n).ok());
      const absl::Status st = (*cuda)->append(l, cuda_buf.put(k), cuda_buf.put(v), f, n);
      ASSERT_TRUE(st.ok()) << st;
    }
    f += n;
    expect_bitwise_same(**cpu, **cuda, a.layers, f, &cpu_b == &cuda_b ? "first device" : "cpu");
  }
  EXPECT_LE((*cuda)->bytes().total(), cuda_b.kv_reservation_bytes(cs.format, g, a.options));
}

// (the device's coder alone: pinned, so that the auto choice's checks cannot
// replace what it made)
TEST(CudaSpan, CodesAreTheCpuFormatsBitForBit) {
  WM_REQUIRE_CUDA();
  Tuning t(*backends().cuda, {{"span.coder", 1}});
  const int64_t host0 = counter("kv.span_append_host_us"), wait0 = counter("kv.span_append_wait_us");
  for (const SpanCase& cs : span_cases()) expect_span_codes_match(cs);
  EXPECT_GT(counter("kv.span_frames_coded"), 0);
  // the host's time in the appends, and of it the waits for the device (QuantWM-2's statistics)
  const int64_t host = counter("kv.span_append_host_us") - host0, wait = counter("kv.span_append_wait_us") - wait0;
  EXPECT_GT(host, 0);
  EXPECT_GE(wait, 0);
  EXPECT_LE(wait, host);
  ASSERT_TRUE(backends().cuda->status().ok()) << backends().cuda->status();
}

// the coder's kernels with one warp per CTA and one CTA per job: the same
// codes as with the default blocks (16 warps for k-means, a CTA per 256
// tokens). On the H200 of 2026-12-04 the default blocks' codes differed
// from the CPU's while every check of the emulator passed; this case says
// whether the warps of a job are what differs there
TEST(CudaSpan, CodesDoNotDependOnTheCodersBlockSize) {
  WM_REQUIRE_CUDA();
  EXPECT_FALSE(dynamic_cast<PluginBackend&>(*backends().cuda).set_tuning("span.threads", 48).ok()) << "whole warps";
  Tuning t(*backends().cuda, {{"span.threads", 32}, {"span.coder", 1}});
  expect_span_codes_match(span_cases()[0]);  // four Lloyd iterations
  expect_span_codes_match(span_cases()[3]);  // none: the seeding alone
  ASSERT_TRUE(backends().cuda->status().ok()) << backends().cuda->status();
}

// the coder with one thread per job: every loop of it in order in that
// thread, so that no barrier, no other thread's write and no split of the
// work between threads or CTAs can matter. If the device still differs from
// the CPU here, what differs is the arithmetic or the data the coder is
// given, not how its work is spread
TEST(CudaSpan, OneThreadPerJobCodesAsTheCpu) {
  WM_REQUIRE_CUDA();
  auto& plugin = dynamic_cast<PluginBackend&>(*backends().cuda);
  EXPECT_FALSE(plugin.set_tuning("span.threads", 2).ok()) << "one thread or whole warps";
  EXPECT_FALSE(plugin.set_tuning("span.threads", 544).ok()) << "at most 512";
  Tuning t(*backends().cuda, {{"span.threads", 1}, {"span.coder", 1}});
  for (const SpanCase& cs : span_cases()) expect_span_codes_match(cs);
  ASSERT_TRUE(backends().cuda->status().ok()) << backends().cuda->status();
}

// the device's coder twice over the same frames, into two device caches:
// the same codes. On the H200 of 2026-12-04 the device's codes differed
// from the CPU's while the emulator's matched; if the device also differs
// from itself here, what differs reads memory no one wrote or races (and
// memory filled differently changes the codes), otherwise its arithmetic
// or logic differs from the CPU's in the same way every time
TEST(CudaSpan, DeviceCoderGivesTheSameCodesTwice) {
  WM_REQUIRE_CUDA();
  Tuning t(*backends().cuda, {{"span.coder", 1}});
  for (const SpanCase& cs : span_cases()) expect_span_codes_match(cs, backends().cuda.get());
  ASSERT_TRUE(backends().cuda->status().ok()) << backends().cuda->status();
}

// the device's k-means++ seeding a step at a time, no Lloyd iteration: one
// centroid (a token's row, drawn once), then two and four (draws weighted
// by the distances to the nearest centroid so far), then two with one
// Lloyd iteration. In run 5 the H200's codes differed from the CPU's even
// without Lloyd iterations; the first case here to fail says which step
// of the seeding differs
TEST(CudaSpan, SeedingStepByStepIsTheCpus) {
  WM_REQUIRE_CUDA();
  Tuning t(*backends().cuda, {{"span.coder", 1}});
  for (const SpanCase& cs : std::vector<SpanCase>{{"qvg2", 64, 64, 64, 0, 1, 8, 64, 4, 0},
                                                  {"qvg2", 64, 64, 64, 0, 1, 8, 32, 4, 0},
                                                  {"qvg2", 64, 64, 64, 0, 1, 8, 16, 4, 0},
                                                  {"qvg2", 64, 64, 64, 0, 1, 8, 32, 4, 1}}) {
    SCOPED_TRACE("tokens per centroid " + std::to_string(cs.tokens_per_centroid));
    expect_span_codes_match(cs);
  }
  ASSERT_TRUE(backends().cuda->status().ok()) << backends().cuda->status();
}

// the coder split between the host and the device (tuning "span.coder"),
// every case: with the whole coder on the host the codes are the CPU's by
// construction, so a difference there lies in what the device does with
// them (the image's upload, the scatter, the pages); with the host's k-means
// and the device's token codes, in the device's token coder; with neither
// (CodesAreTheCpuFormatsBitForBit), in its k-means. On the H200 of
// 2026-12-04 only the last was run, and failed
TEST(CudaSpan, HostCodedSpansAreTheCpus) {
  WM_REQUIRE_CUDA();
  auto& plugin = dynamic_cast<PluginBackend&>(*backends().cuda);
  EXPECT_FALSE(plugin.set_tuning("span.coder", 4).ok());
  EXPECT_FALSE(plugin.set_tuning("span.coder", -1).ok());
  const int64_t hosted = counter("kv.span_jobs_host_coded"), launches = counter("kv.span_encode_launches");
  {
    Tuning t(*backends().cuda, {{"span.coder", 3}});
    for (const SpanCase& cs : span_cases()) expect_span_codes_match(cs);
  }
  EXPECT_GT(counter("kv.span_jobs_host_coded"), hosted);
  EXPECT_EQ(counter("kv.span_encode_launches"), launches) << "the host coded every span";
  ASSERT_TRUE(backends().cuda->status().ok()) << backends().cuda->status();
}

TEST(CudaSpan, HostKmeansWithDeviceTokenCodesAreTheCpus) {
  WM_REQUIRE_CUDA();
  const int64_t hosted = counter("kv.span_jobs_host_coded"), launches = counter("kv.span_encode_launches");
  {
    Tuning t(*backends().cuda, {{"span.coder", 2}});
    for (const SpanCase& cs : span_cases()) expect_span_codes_match(cs);
  }
  EXPECT_GT(counter("kv.span_jobs_host_coded"), hosted);
  EXPECT_GT(counter("kv.span_encode_launches"), launches);
  ASSERT_TRUE(backends().cuda->status().ok()) << backends().cuda->status();
}

// the auto choice (no "span.coder", no WM_CUDA_SPAN_CODER): the device's
// coder, its first appends also coded on the host and compared byte for
// byte. On the emulator every check finds the same image and the device
// keeps coding. With the drill ("span.check_fault": every check sees a
// difference) the first check moves the choice to the host's k-means, the
// next to the host; the cache holds the CPU's codes throughout
TEST(CudaSpan, AutoCoderChecksTheDeviceAndFallsBackToTheHost) {
  WM_REQUIRE_CUDA();
  if (std::getenv("WM_CUDA_SPAN_CODER") != nullptr) GTEST_SKIP() << "WM_CUDA_SPAN_CODER pins the coder";
  {
    Tuning t(*backends().cuda, {{"span.checks", 3}});
    const int64_t same = counter("kv.span_checks_same"), different = counter("kv.span_checks_different");
    const int64_t launches = counter("kv.span_encode_launches");
    expect_span_codes_match(span_cases()[1]);  // QuantWM-2: the weights the device makes reach the host's check
    EXPECT_EQ(counter("kv.span_checks_same") - same, 3);
    EXPECT_EQ(counter("kv.span_checks_different"), different);
    EXPECT_EQ(counter("kv.span_coder"), 1) << "three clean checks: the device codes on";
    EXPECT_GT(counter("kv.span_encode_launches"), launches);
  }
  {
    Tuning t(*backends().cuda, {{"span.checks", 2}, {"span.check_fault", 1}});
    const int64_t different = counter("kv.span_checks_different"), hosted = counter("kv.span_jobs_host_coded");
    expect_span_codes_match(span_cases()[2]);  // with PSAC bases and 4-bit coefficients
    EXPECT_EQ(counter("kv.span_checks_different") - different, 2);
    EXPECT_EQ(counter("kv.span_coder"), 3) << "the host, after the device and the host's k-means";
    EXPECT_GT(counter("kv.span_jobs_host_coded"), hosted);
  }
  // the tuning back at 0: the device again, with the default checks
  EXPECT_EQ(counter("kv.span_coder"), 1);
  EXPECT_FALSE(dynamic_cast<PluginBackend&>(*backends().cuda).set_tuning("span.checks", -1).ok());
  ASSERT_TRUE(backends().cuda->status().ok()) << backends().cuda->status();
}

// wm-default-64's session on the device: QVG-2's codes, centroids, map and
// fp16 sink take 57,408 bytes per (layer, head) (the CPU's session holds
// 1,835,008 bytes), inside one 64 KiB page each; QuantWM-2's PSAC records
// and each table's basis take it past one page, and its running query
// statistics take 9 pages more: 8 layers x 4 heads x 2,081 doubles
// (docs/CUDA.md, "Span pages")
TEST(CudaSpan, DefaultModelSessionPages) {
  WM_REQUIRE_CUDA();
  Backend& b = *backends().cuda;
  const KvGeometry g = default_model_geometry();
  const int64_t fp16 = b.kv_reservation_bytes("fp16", g, {});
  EXPECT_EQ(b.kv_reservation_bytes("qvg2", g, {}), fp16 / 5) << "one page per (layer, head)";
  EXPECT_EQ(b.kv_reservation_bytes("quantwm2", g, {}), fp16 / 5 * 2 + 9 * 65536)
      << "two pages per (layer, head) and the statistics'";
  KvFormatOptions no_stats;
  no_stats.qsac = false;
  no_stats.psac = false;
  EXPECT_EQ(b.kv_reservation_bytes("quantwm2", g, no_stats), fp16 / 5) << "without QSAC and PSAC: QVG-2's pages";
  Buffers buf(b);
  const size_t frame_vals = static_cast<size_t>(g.tokens_per_frame) * g.heads * g.head_dim;
  float* k = buf.put(randn(frame_vals, 3));
  float* v = buf.put(randn(frame_vals, 4));
  for (const char* format : {"qvg2", "quantwm2"}) {
    auto c = b.make_kv_cache(format, g, {});
    ASSERT_TRUE(c.ok()) << c.status();
    for (int f = 0; f < 18; ++f)
      for (int l = 0; l < g.layers; ++l) ASSERT_TRUE((*c)->append(l, k, v, f, 1).ok());
    EXPECT_EQ((*c)->bytes().total(), b.kv_reservation_bytes(format, g, {})) << format;
    // an append of more than a block is refused (its centroids would not fit a slot's table), harmlessly
    const absl::Status st = (*c)->append(0, k, v, 18, 2);
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_EQ((*c)->frames(0).back(), 17);
  }
  ASSERT_TRUE(backends().cuda->status().ok()) << backends().cuda->status();
}

// a step over several span sessions (and an fp16 one): their queries
// observed from one batched attention call, their frames coded side by
// side; each cache then holds what the CPU's holds after the same step.
// Once with the coder's scratch for all of them at once, once in rounds
// of one (span, head, side) each
TEST(CudaSpan, BatchesOfSessionsAreCodedAlike) {
  WM_REQUIRE_CUDA();
  for (const int64_t budget : {int64_t{0}, int64_t{1}}) {
    SCOPED_TRACE("span.scratch_bytes " + std::to_string(budget));
    Tuning t(*backends().cuda, {{"span.scratch_bytes", budget}, {"span.coder", 1}});
    AttnSpec a;
    a.tokens_per_frame = 64;
    a.formats = {"quantwm2", "qvg2", "quantwm2", "fp16", "qvg2"};
    a.cached = {0, 3, 6, 1, 4};
    a.observe = true;  // QuantWM-2's statistics and bases exist
    const int64_t before = counter("kv.span_frames_coded");
    AppendBatch b(a, {2, 1, 2, 2, 2}, 23);
    ASSERT_TRUE(b.ok());
    const int64_t launches = counter("kv.span_encode_launches");  // the cached frames' appends came before
    b.attend(91);
    for (int l = 0; l < a.layers; ++l) {
      ASSERT_TRUE(b.append_cpu(l).ok());
      const absl::Status st = b.append_cuda(l);
      ASSERT_TRUE(st.ok()) << st;
    }
    b.expect_same_caches();
    EXPECT_GT(counter("kv.span_frames_coded"), before);
    // a layer's appends: one per format (qvg2, quantwm2), each one coder launch, or
    // one per (span, head, side): 4 span sessions x 2 heads x 2 sides in all
    EXPECT_EQ(counter("kv.span_encode_launches") - launches, a.layers * (budget == 0 ? 2 : 4 * a.heads * 2));
    ASSERT_TRUE(backends().cuda->status().ok()) << backends().cuda->status();
  }
}

// QuantWM-2's query statistics are summed in each session's own pool pages,
// a launch per attention call; the write pass makes the QSAC weights from
// them on the device, and they come down only for the host's bookkeeping:
// before a layer has seen a query, and for a new PSAC basis. A session that
// ends hands its pages back: the other session's codes stay the CPU's, and
// sessions that take those pages next start from zero
TEST(CudaSpan, StatisticsPagesOfAnEndedSessionStartAgainFromZero) {
  WM_REQUIRE_CUDA();
  AttnSpec a;
  a.tokens_per_frame = 64;
  a.formats = {"quantwm2", "quantwm2"};
  a.cached = {2, 3};
  a.observe = true;
  AppendBatch b(a, {2, 2}, 29);
  ASSERT_TRUE(b.ok());
  const int64_t launches = counter("query.gram_launches"), downloads = counter("query.gram_downloads"),
                weights = counter("query.qsac_weight_launches");
  b.attend(93);
  EXPECT_EQ(counter("query.gram_launches") - launches, a.layers) << "one launch per call";
  b.cpu[0].reset();
  b.cuda[0].reset();
  for (int l = 0; l < a.layers; ++l) {
    const std::vector<int64_t> first{b.first[1]};
    ASSERT_TRUE(backends().cpu->kv_append(l, {&b.cpu_slices[1], 1}, first, a.tokens_per_frame, b.ck, b.cv).ok());
    const absl::Status st = backends().cuda->kv_append(l, {&b.cuda_slices[1], 1}, first, a.tokens_per_frame, b.gk, b.gv);
    ASSERT_TRUE(st.ok()) << st;
  }
  EXPECT_EQ(counter("query.gram_downloads"), downloads) << "queries seen, frames 3 and 4 in the first basis' epoch";
  EXPECT_EQ(counter("query.qsac_weight_launches") - weights, a.layers) << "one per layer's write pass";
  b.expect_same_caches();
  b.cpu.clear();
  b.cuda.clear();
  // the pool hands out its lowest free pages first: the new sessions' statistics sit where the old ones' did
  AppendBatch c(a, {1, 2}, 37);
  ASSERT_TRUE(c.ok());
  c.attend(97);
  for (int l = 0; l < a.layers; ++l) {
    ASSERT_TRUE(c.append_cpu(l).ok());
    const absl::Status st = c.append_cuda(l);
    ASSERT_TRUE(st.ok()) << st;
  }
  c.expect_same_caches();
  ASSERT_TRUE(backends().cuda->status().ok()) << backends().cuda->status();
}

absl::StatusOr<std::unique_ptr<PluginBackend>> another_cuda_backend(int64_t kv_pool_bytes);  // below

// where the runtime refuses pinned memory (asked of the emulated device),
// uploads (the coder's jobs, the statistics' jobs) copy from pageable
// memory and the write pass's download of the statistics lands in pageable
// memory too: the codes stay the CPU's
TEST(CudaSpan, WithoutPinnedMemoryTheCodesStayTheCpus) {
  WM_REQUIRE_CUDA();
  if (!absl::StrContains(backends().cuda->device_info().name, "simt emulator"))
    GTEST_SKIP() << "needs the emulated device (a real one cannot be told to refuse pinned memory)";
  struct Refusal {
    Refusal() { setenv("WM_SIMT_HOST_ALLOC_REFUSE", "1", 1); }
    ~Refusal() { unsetenv("WM_SIMT_HOST_ALLOC_REFUSE"); }
  } refusal;
  auto device = another_cuda_backend(int64_t{16} << 20);
  ASSERT_TRUE(device.ok()) << device.status();
  PluginBackend& gpu = **device;
  const auto count = [&gpu](const char* name) {
    auto v = gpu.counter(name);
    EXPECT_TRUE(v.ok()) << v.status();
    return v.ok() ? *v : -1;
  };
  AttnSpec a;
  a.tokens_per_frame = 64;
  a.formats = {"quantwm2", "qvg2", "quantwm2"};
  a.cached = {2, 3, 1};
  a.observe = true;
  AppendBatch b(a, {2, 1, 2}, 31, &gpu);
  ASSERT_TRUE(b.ok());
  const int64_t launches = count("query.gram_launches");
  EXPECT_GT(launches, 0) << "the cached frames' write passes observed their queries";
  b.attend(95);
  EXPECT_EQ(count("query.gram_launches") - launches, a.layers) << "one launch per call";
  for (int l = 0; l < a.layers; ++l) {
    ASSERT_TRUE(b.append_cpu(l).ok());
    const absl::Status st = b.append_cuda(l);
    ASSERT_TRUE(st.ok()) << st;
  }
  b.expect_same_caches();
  EXPECT_GT(count("upload.pageable"), 0) << "no staging ring without pinned memory";
  EXPECT_TRUE(gpu.status().ok()) << gpu.status();
}

// a window of 6 frames in blocks of 3 keeps 4 span tables a layer (whole
// blocks, one partly evicted, a prompt's short chunk): appends shorter than
// the engine's leave more spans live, which the device refuses with a reason
TEST(CudaSpan, SpansBeyondTheTablesAreRefused) {
  WM_REQUIRE_CUDA();
  Backend& b = *backends().cuda;
  AttnSpec a;
  a.tokens_per_frame = 64;
  a.sinks = 0;
  a.window = 6;
  a.frames_per_block = 3;
  a.layers = 1;
  const KvGeometry g = geometry_of(a);
  Buffers buf(b);
  const size_t frame_vals = static_cast<size_t>(a.tokens_per_frame) * a.heads * a.head_dim;
  float* k = buf.put(randn(frame_vals * 3, 5));
  float* v = buf.put(randn(frame_vals * 3, 6));
  auto c = b.make_kv_cache("qvg2", g, {});
  ASSERT_TRUE(c.ok()) << c.status();
  // a prompt of 4 frames (3 + 1), then blocks: never more than 3 spans live
  ASSERT_TRUE((*c)->append(0, k, v, 0, 3).ok());
  ASSERT_TRUE((*c)->append(0, k, v, 3, 1).ok());
  for (int f = 4; f < 16; f += 3) ASSERT_TRUE((*c)->append(0, k, v, f, 3).ok()) << f;
  // frame by frame: the fifth live span has no table
  absl::Status st;
  for (int f = 16; f < 22 && st.ok(); ++f) st = (*c)->append(0, k, v, f, 1);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_TRUE(absl::StrContains(st.message(), "4 spans per layer")) << st;
  ASSERT_TRUE(backends().cuda->status().ok()) << backends().cuda->status();
}

TEST(CudaFfn, MismatchedWeightsAreAnErrorAndHarmNothing) {
  WM_REQUIRE_CUDA();
  Backend& b = *backends().cuda;
  Buffers buf(b);
  const auto w0 = randn(16 * 8, 1), w2 = randn(4 * 12, 2), w2ok = randn(4 * 16, 3), x = randn(3 * 8, 4);
  LinearWeight l0{b.upload_weight(w0.data(), 16, 8), nullptr, 16, 8};
  LinearWeight bad{b.upload_weight(w2.data(), 4, 12), nullptr, 4, 12};
  LinearWeight good{b.upload_weight(w2ok.data(), 4, 16), nullptr, 4, 16};
  float *xd = buf.put(x), *h = buf.zeros(3 * 16), *y = buf.zeros(3 * 4);
  b.ffn(l0, bad, xd, 3, h, y);
  const absl::Status s = backends().cuda->take_status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("ffn: weights are 16x8 and 4x12"), absl::string_view::npos) << s;
  b.ffn(l0, good, xd, 3, h, y);
  ASSERT_TRUE(backends().cuda->status().ok()) << backends().cuda->status();
}

// one more backend on the same plugin and device, with its own KV pool
absl::StatusOr<std::unique_ptr<PluginBackend>> another_cuda_backend(int64_t kv_pool_bytes) {
  PluginBackendOptions o;
  o.path = backends().cuda->plugin().path();
  o.kv_pool_bytes = kv_pool_bytes;
  o.abort_on_error = false;
  return make_plugin_backend(o);
}

// where cuBLASLt offers no GELU epilogue with a bf16 output (or only with a
// bf16 bias) the feed-forward block still runs and matches the CPU: the
// emulated cuBLASLt refuses those epilogues on request
TEST(CudaFfn, FallsBackWhereCublasLtHasNoGeluEpilogue) {
  WM_REQUIRE_CUDA();
  if (!absl::StrContains(backends().cuda->device_info().name, "simt emulator"))
    GTEST_SKIP() << "needs the emulated cuBLASLt (a real one cannot be told to refuse)";
  const OpCase c = ffn_case(37, 96, 200, 96, true, true);
  const std::vector<float> cpu = c.run(*backends().cpu, 5);
  for (const auto& [refuse, fused] : std::vector<std::pair<std::string, int64_t>>{{"gelu", 0}, {"gelu_f32_bias", 1}}) {
    SCOPED_TRACE(refuse);
    setenv("WM_SIMT_CUBLASLT_REFUSE", refuse.c_str(), 1);
    auto b = another_cuda_backend(int64_t{16} << 20);  // a fresh backend: GEMM plans are made per backend
    ASSERT_TRUE(b.ok()) << b.status();
    const std::vector<float> cuda = c.run(**b, 5);
    EXPECT_TRUE(close(cpu, cuda, c.tol));
    EXPECT_EQ(*(*b)->counter("ffn.fused_calls"), fused);
    EXPECT_EQ(*(*b)->counter("gemm.gelu_epilogue_calls"), fused);
    EXPECT_EQ(*(*b)->counter("gemm.fallback_calls"), 0);
    EXPECT_TRUE((*b)->status().ok()) << (*b)->status();
    unsetenv("WM_SIMT_CUBLASLT_REFUSE");
  }
}

// a second backend in the same process does real work (GEMMs with and
// without bias, a KV cache, attention) and is torn down: its plans,
// descriptors, caches and memory released once each, the first backend
// unharmed
TEST(CudaBackendLifetime, ASecondBackendWorksAndTearsDownCleanly) {
  WM_REQUIRE_CUDA();
  for (int round = 0; round < 2; ++round) {
    auto made = another_cuda_backend(int64_t{64} << 20);
    ASSERT_TRUE(made.ok()) << made.status();
    std::unique_ptr<PluginBackend> pb = std::move(*made);
    Backend& b = *pb;
    {
      Buffers buf(b);
      const int n = 19, in = 64, out = 96;
      const auto w = randn(static_cast<size_t>(out) * in, 21, 0.1f), x = randn(static_cast<size_t>(n) * in, 22);
      const auto bias = randn(static_cast<size_t>(out), 23);
      LinearWeight with{b.upload_weight(w.data(), out, in), buf.put(bias), out, in};
      LinearWeight without{b.upload_weight(w.data(), out, in), nullptr, out, in};
      float *xd = buf.put(x), *y = buf.zeros(static_cast<size_t>(n) * out);
      b.linear(with, xd, n, y);
      b.linear(without, xd, n, y);
      AttnSpec a;
      const KvGeometry g = geometry_of(a);
      auto cache = b.make_kv_cache("fp16", g, {});
      ASSERT_TRUE(cache.ok()) << cache.status();
      const size_t frame = static_cast<size_t>(g.tokens_per_frame) * g.heads * g.head_dim;
      float *k = buf.put(randn(frame, 24)), *v = buf.put(randn(frame, 25)), *q = buf.put(randn(frame, 26));
      float* o_att = buf.zeros(frame);
      ASSERT_TRUE((*cache)->append(0, k, v, 0, 1).ok());
      (*cache)->attend(0, q, k, v, g.tokens_per_frame, o_att);
      ASSERT_TRUE(pb->synchronize().ok());
      EXPECT_TRUE(pb->status().ok()) << pb->status();
    }
    pb.reset();  // every plan, descriptor and allocation goes here
  }
  ASSERT_TRUE(backends().cuda->status().ok()) << backends().cuda->status();
}

// the KV page pool runs out cleanly: caches are refused with
// RESOURCE_EXHAUSTED once their worst cases no longer fit, the ones open keep
// working, and closing one lets the next in; reserved bytes come back to 0
TEST(CudaKvCache, PoolRunsOutCleanlyAndRecovers) {
  WM_REQUIRE_CUDA();
  auto made = another_cuda_backend(int64_t{8} << 20);
  ASSERT_TRUE(made.ok()) << made.status();
  std::unique_ptr<PluginBackend> pb = std::move(*made);
  Backend& b = *pb;
  AttnSpec a;
  const KvGeometry g = geometry_of(a);
  const int64_t each = b.kv_reservation_bytes("fp16", g, {});
  ASSERT_GT(each, 0);
  const int64_t fits = (int64_t{8} << 20) / each;
  ASSERT_GE(fits, 2) << "the case needs room for at least two caches";
  std::vector<std::unique_ptr<KvCache>> open;
  for (int64_t i = 0; i < fits; ++i) {
    auto c = b.make_kv_cache("fp16", g, {});
    ASSERT_TRUE(c.ok()) << "cache " << i << " of " << fits << ": " << c.status();
    open.push_back(std::move(*c));
  }
  EXPECT_EQ(b.memory().kv_pool_reserved, fits * each);
  auto refused = b.make_kv_cache("fp16", g, {});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  {
    // the open caches still work at the limit
    Buffers buf(b);
    const size_t frame = static_cast<size_t>(g.tokens_per_frame) * g.heads * g.head_dim;
    float *k = buf.put(randn(frame, 31)), *v = buf.put(randn(frame, 32));
    for (int layer = 0; layer < g.layers; ++layer) EXPECT_TRUE(open.back()->append(layer, k, v, 0, 1).ok());
    ASSERT_TRUE(pb->synchronize().ok());
  }
  open.erase(open.begin());
  auto again = b.make_kv_cache("fp16", g, {});
  EXPECT_TRUE(again.ok()) << again.status();
  again->reset();
  open.clear();
  EXPECT_EQ(b.memory().kv_pool_reserved, 0);
  EXPECT_EQ(b.memory().kv_pool_used, 0);
  EXPECT_TRUE(pb->status().ok()) << pb->status();
}

// LN -> three linears on its output, GELU -> linear: the bf16 copy of an
// activation made by one op and reused by the next GEMM, against the CPU
TEST(CudaShadow, ActivationCopiesFeedTheNextGemmsOnly) {
  WM_REQUIRE_CUDA();
  // d, f multiples of 8 use the flat copy; other widths the padded rows
  auto run = [](Backend& b, int d, int f) {
    Buffers buf(b);
    const int n = 37;
    const auto x = randn(static_cast<size_t>(n) * d, 1), mod = randn(6 * d, 2, 0.2f);
    const auto w1 = randn(static_cast<size_t>(d) * d, 3, 0.1f), w2 = randn(static_cast<size_t>(f) * d, 4, 0.1f);
    const auto w3 = randn(static_cast<size_t>(d) * f, 5, 0.07f);
    LinearWeight l1{b.upload_weight(w1.data(), d, d), nullptr, d, d}, l2{b.upload_weight(w2.data(), f, d), nullptr, f, d};
    LinearWeight l3{b.upload_weight(w3.data(), d, f), nullptr, d, f};
    float *xd = buf.put(x), *m = buf.put(mod), *u = buf.zeros(x.size()), *y1 = buf.zeros(x.size()),
          *y1r = buf.zeros(x.size()), *y2 = buf.zeros(x.size()), *h = buf.zeros(static_cast<size_t>(n) * f),
          *y3 = buf.zeros(x.size());
    b.layer_norm_modulate(xd, n, d, m, m + d, 6 * d, n, 1e-6f, u);
    b.linear(l1, u, n, y1);
    b.linear(l1, u, n, y1r);  // reuses the copy: must equal y1
    b.gated_residual(u, y1, m + 2 * d, 6 * d, n, d, n);  // u changes: its copy must be dropped
    b.linear(l1, u, n, y2);
    b.linear(l2, y2, n, h);
    b.gelu(h, static_cast<int64_t>(n) * f);
    b.linear(l3, h, n, y3);
    std::vector<float> out;
    for (const float* p : {y1, y1r, y2, y3}) {
      auto o = buf.get(p, x.size());
      out.insert(out.end(), o.begin(), o.end());
    }
    return out;
  };
  for (const auto& [d, f] : std::vector<std::pair<int, int>>{{96, 200}, {100, 203}}) {
    const auto cpu = run(*backends().cpu, d, f);
    for (int shadow : {1, 0}) {
      Tuning t(*backends().cuda, {{"shadow", shadow}});
      const auto cuda = run(*backends().cuda, d, f);
      EXPECT_TRUE(close(cpu, cuda, {1e-5, 3e-2, 1e-2})) << "shadow " << shadow << ", d " << d << ", f " << f;
      const size_t part = cuda.size() / 4;
      EXPECT_TRUE(std::equal(cuda.begin(), cuda.begin() + part, cuda.begin() + part))
          << "the reused copy gave another result, d " << d;
    }
  }
  ASSERT_TRUE(backends().cuda->status().ok()) << backends().cuda->status();
}

// ---- which path ran: the plugin's counters ---------------------------------------

int64_t counter(const char* name) {
  auto v = backends().cuda->counter(name);
  EXPECT_TRUE(v.ok()) << v.status();
  return v.ok() ? *v : -1;
}

// the write pass of a batch in one call: sessions of different lengths (one
// wrapping its window), each layer one launch, bit-exact with the CPU's
// append of one cache at a time; a bad batch changes no cache
TEST(CudaKvCache, BatchedAppendMatchesOneCacheAtATime) {
  WM_REQUIRE_CUDA();
  AttnSpec a;
  a.cached = {0, 3, 6};
  AppendBatch b(a, {2, 1, 2}, 9);
  ASSERT_TRUE(b.ok());
  const int64_t launches = counter("kv.append_launches");
  for (int l = 0; l < a.layers; ++l) {
    ASSERT_TRUE(b.append_cpu(l).ok());
    const absl::Status st = b.append_cuda(l);
    ASSERT_TRUE(st.ok()) << st;
  }
  EXPECT_EQ(counter("kv.append_launches") - launches, a.layers) << "one launch per layer for the whole batch";
  b.expect_same_caches();
  Backend& cuda_b = *backends().cuda;
  const auto &cpu = b.cpu, &cuda = b.cuda;
  const auto& cuda_slices = b.cuda_slices;
  float *gk = b.gk, *gv = b.gv;

  // all or nothing: a session out of order, or one cache twice, fails the whole batch
  const BackendMemory before = cuda_b.memory();
  const std::vector<int64_t>& next = b.next;
  std::vector<int64_t> skewed = next;
  skewed[2] += 1;
  EXPECT_EQ(cuda_b.kv_append(0, cuda_slices, skewed, a.tokens_per_frame, gk, gv).code(),
            absl::StatusCode::kFailedPrecondition);
  std::vector<SessionSlice> twice = cuda_slices;
  twice[2].cache = twice[0].cache;
  EXPECT_EQ(cuda_b.kv_append(0, twice, next, a.tokens_per_frame, gk, gv).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cuda_b.kv_append(0, cuda_slices, std::span<const int64_t>(next).first(2), a.tokens_per_frame, gk, gv)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cuda_b.memory().kv_pool_used, before.kv_pool_used);
  for (size_t s = 0; s < cpu.size(); ++s) EXPECT_EQ(cuda[s]->frames(0), cpu[s]->frames(0)) << "session " << s;
  // and the batch still goes in afterwards
  EXPECT_TRUE(cuda_b.kv_append(0, cuda_slices, next, a.tokens_per_frame, gk, gv).ok());
  EXPECT_EQ(cuda[0]->frames(0).size(), 4u);
  ASSERT_TRUE(backends().cuda->status().ok()) << backends().cuda->status();
}

// uploads go through the pinned staging ring: one host buffer reused and
// changed right after every upload, 200 uploads that wrap the ring several
// times, each device buffer must hold what was uploaded to it
TEST(CudaUploads, StagedUploadsKeepEachCopysBytes) {
  WM_REQUIRE_CUDA();
  Backend& b = *backends().cuda;
  std::mt19937 rng(3);
  std::vector<uint32_t> host;
  std::vector<std::pair<void*, std::vector<uint32_t>>> sent;
  const int64_t staged = counter("upload.staged"), pageable = counter("upload.pageable");
  for (int i = 0; i < 200; ++i) {
    const size_t n = 1 + rng() % (256u << 10);  // up to 1 MiB
    host.resize(n);
    for (uint32_t& x : host) x = static_cast<uint32_t>(rng());
    void* d = b.alloc(n * sizeof(uint32_t));
    ASSERT_NE(d, nullptr);
    b.upload(d, host.data(), n * sizeof(uint32_t));
    sent.emplace_back(d, host);
    std::fill(host.begin(), host.end(), 0xdeadbeefu);  // the caller's buffer is free again at once
  }
  // one larger than the ring copies from pageable memory
  std::vector<uint32_t> big(3u << 20, 7u);
  void* dbig = b.alloc(big.size() * sizeof(uint32_t));
  b.upload(dbig, big.data(), big.size() * sizeof(uint32_t));
  EXPECT_EQ(counter("upload.staged") - staged, 200);
  EXPECT_EQ(counter("upload.pageable") - pageable, 1);
  for (auto& [d, want] : sent) {
    std::vector<uint32_t> got(want.size());
    b.download(got.data(), d, got.size() * sizeof(uint32_t));
    EXPECT_EQ(got, want);
    b.free(d);
  }
  std::vector<uint32_t> got(big.size());
  b.download(got.data(), dbig, got.size() * sizeof(uint32_t));
  EXPECT_EQ(got, big);
  b.free(dbig);
  ASSERT_TRUE(backends().cuda->status().ok()) << backends().cuda->status();
}

TEST(CudaCounters, UnknownNamesAreNotFound) {
  WM_REQUIRE_CUDA();
  EXPECT_EQ(backends().cuda->counter("no.such.counter").status().code(), absl::StatusCode::kNotFound);
}

// the model's GEMMs go through cuBLASLt; the CUDA-core kernel runs only when asked
// (a silent fallback would pass every parity test and lose most of the speed)
TEST(CudaCounters, ModelShapedGemmsRunOnCublasLt) {
  WM_REQUIRE_CUDA();
  Backend& b = *backends().cuda;
  struct Shape {
    int n, in, out;
    bool bias;
  };
  // wm-default-64 (dim 256, FFN 1024) and Matrix-Game-2 widths (1536, 8960), odd row counts
  for (const Shape& sh : {Shape{64, 256, 768, true}, Shape{193, 1024, 256, true}, Shape{37, 256, 1024, false},
                          Shape{97, 1536, 8960, true}, Shape{97, 8960, 1536, true}}) {
    Buffers buf(b);
    const auto w = randn(static_cast<size_t>(sh.out) * sh.in, 11, 0.05f), x = randn(static_cast<size_t>(sh.n) * sh.in, 12);
    const auto bias = randn(static_cast<size_t>(sh.out), 13);
    LinearWeight lw{b.upload_weight(w.data(), sh.out, sh.in), sh.bias ? buf.put(bias) : nullptr, sh.out, sh.in};
    float *xd = buf.put(x), *y = buf.zeros(static_cast<size_t>(sh.n) * sh.out);
    const int64_t lt0 = counter("gemm.cublaslt_calls"), fb0 = counter("gemm.fallback_calls");
    b.linear(lw, xd, sh.n, y);
    ASSERT_TRUE(backends().cuda->synchronize().ok());
    EXPECT_EQ(counter("gemm.cublaslt_calls") - lt0, 1) << sh.n << "x" << sh.in << "->" << sh.out;
    EXPECT_EQ(counter("gemm.fallback_calls") - fb0, 0)
        << "cuBLASLt refused " << sh.n << "x" << sh.in << "->" << sh.out << ": this GEMM takes the slow path";
    Tuning t(b, {{"linear.fallback", 1}});
    b.linear(lw, xd, sh.n, y);
    EXPECT_EQ(counter("gemm.fallback_calls") - fb0, 1);
  }
  ASSERT_TRUE(backends().cuda->status().ok()) << backends().cuda->status();
}

// gemm.autotune: a plan's first GEMM times the heuristic's candidates and
// keeps the fastest, once per plan, on the fp32 path and the GELU epilogue's
// alike; the values stay the GEMM's (on the emulator every candidate
// computes the same, so bit for bit); switched off, every plan runs the
// heuristic's first again, and a plan made while it is off is not timed
TEST(CudaCounters, AutotunedGemmsTimeTheCandidatesOncePerPlan) {
  WM_REQUIRE_CUDA();
  Backend& b = *backends().cuda;
  const bool emulated = absl::StrContains(backends().cuda->device_info().name, "simt emulator");
  const int n = 97, in = 256, hidden = 1024, out = 256;
  Buffers buf(b);
  const auto w0 = randn(static_cast<size_t>(hidden) * in, 31, 0.05f);
  const auto w2 = randn(static_cast<size_t>(out) * hidden, 32, 0.05f);
  const auto x = randn(static_cast<size_t>(n) * in, 33), b0 = randn(static_cast<size_t>(hidden), 34);
  LinearWeight l0{b.upload_weight(w0.data(), hidden, in), buf.put(b0), hidden, in};
  LinearWeight l2{b.upload_weight(w2.data(), out, hidden), nullptr, out, hidden};
  float* xd = buf.put(x);
  auto run = [&] {  // the linear alone (fp32 + bias), then the feed-forward block (the GELU epilogue, then fp32)
    float *y = buf.zeros(static_cast<size_t>(n) * hidden), *h = buf.zeros(static_cast<size_t>(n) * hidden),
          *f = buf.zeros(static_cast<size_t>(n) * out);
    b.linear(l0, xd, n, y);
    b.ffn(l0, l2, xd, n, h, f);
    std::vector<float> r = buf.get(y, static_cast<size_t>(n) * hidden), g = buf.get(f, static_cast<size_t>(n) * out);
    r.insert(r.end(), g.begin(), g.end());
    return r;
  };
  const std::vector<float> heuristic = run();  // the plans are made untimed
  const int64_t tuned0 = counter("gemm.autotuned_plans"), lt0 = counter("gemm.cublaslt_calls");
  {
    Tuning t(b, {{"gemm.autotune", 1}});
    const std::vector<float> first = run();
    const int64_t timed = counter("gemm.autotuned_plans") - tuned0;
    // three plans: the linear's, the GELU GEMM's, the second GEMM's; a GPU's heuristic may offer one
    // algorithm only for some, which leaves nothing to time
    if (emulated) {
      EXPECT_EQ(timed, 3);
      // the timing runs are not the model's GEMMs: the counter counts the three calls
      EXPECT_EQ(counter("gemm.cublaslt_calls") - lt0, 3);
    } else {
      EXPECT_LE(timed, 3);
    }
    EXPECT_LE(counter("gemm.autotune_changes"), counter("gemm.autotuned_plans"));
    const std::vector<float> again = run();
    EXPECT_EQ(counter("gemm.autotuned_plans") - tuned0, timed) << "a plan is timed once";
    ASSERT_EQ(first.size(), heuristic.size());
    for (size_t i = 0; i < first.size(); ++i) {
      if (emulated) {
        ASSERT_EQ(first[i], heuristic[i]) << i;
      } else {
        ASSERT_NEAR(first[i], heuristic[i], 1e-3f + 1e-3f * std::fabs(heuristic[i])) << i;
      }
      ASSERT_EQ(again[i], first[i]) << i << ": the chosen algorithm is kept";
    }
  }
  // off again: the heuristic's first, the same values as before tuning
  const int64_t tuned1 = counter("gemm.autotuned_plans");
  const std::vector<float> after = run();
  EXPECT_EQ(counter("gemm.autotuned_plans"), tuned1);
  for (size_t i = 0; i < after.size(); ++i) ASSERT_EQ(after[i], heuristic[i]) << i;
  // a bad value is refused with the key's range
  auto* pb = dynamic_cast<PluginBackend*>(&b);
  ASSERT_NE(pb, nullptr);
  const absl::Status bad = pb->set_tuning("gemm.autotune", 2);
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(bad.message(), "gemm.autotune: 0 or 1")) << bad;
  ASSERT_TRUE(backends().cuda->status().ok()) << backends().cuda->status();
}

// the feed-forward block runs as two cuBLASLt GEMMs, the GELU in the first
// one's epilogue; "ffn.fused" 0 and the forced fallback run the unfused ops
TEST(CudaCounters, FeedForwardRunsFusedOnCublasLt) {
  WM_REQUIRE_CUDA();
  Backend& b = *backends().cuda;
  struct Shape {
    int n, in, hidden, out;
    bool bias0;
  };
  for (const Shape& sh : {Shape{64, 256, 1024, 256, true}, Shape{97, 1536, 8960, 1536, true},
                          Shape{5, 7, 13, 3, false}}) {
    Buffers buf(b);
    const auto w0 = randn(static_cast<size_t>(sh.hidden) * sh.in, 21, 0.05f);
    const auto w2 = randn(static_cast<size_t>(sh.out) * sh.hidden, 22, 0.05f);
    const auto x = randn(static_cast<size_t>(sh.n) * sh.in, 23), b0 = randn(static_cast<size_t>(sh.hidden), 24);
    LinearWeight l0{b.upload_weight(w0.data(), sh.hidden, sh.in), sh.bias0 ? buf.put(b0) : nullptr, sh.hidden, sh.in};
    LinearWeight l2{b.upload_weight(w2.data(), sh.out, sh.hidden), nullptr, sh.out, sh.hidden};
    float *xd = buf.put(x), *h = buf.zeros(static_cast<size_t>(sh.n) * sh.hidden),
          *y = buf.zeros(static_cast<size_t>(sh.n) * sh.out);
    const std::string what = std::to_string(sh.n) + "x" + std::to_string(sh.in) + "->" + std::to_string(sh.hidden);
    const int64_t lt0 = counter("gemm.cublaslt_calls"), fb0 = counter("gemm.fallback_calls");
    const int64_t ge0 = counter("gemm.gelu_epilogue_calls"), fu0 = counter("ffn.fused_calls");
    b.ffn(l0, l2, xd, sh.n, h, y);
    ASSERT_TRUE(backends().cuda->synchronize().ok());
    EXPECT_EQ(counter("gemm.gelu_epilogue_calls") - ge0, 1)
        << "cuBLASLt has no GELU epilogue with a bf16 output for " << what << ": the FFN runs unfused";
    EXPECT_EQ(counter("ffn.fused_calls") - fu0, 1) << what;
    EXPECT_EQ(counter("gemm.cublaslt_calls") - lt0, 2) << what;
    EXPECT_EQ(counter("gemm.fallback_calls") - fb0, 0) << what;
    {
      Tuning t(b, {{"ffn.fused", 0}});
      b.ffn(l0, l2, xd, sh.n, h, y);
      EXPECT_EQ(counter("ffn.fused_calls") - fu0, 1) << what;
      EXPECT_EQ(counter("gemm.gelu_epilogue_calls") - ge0, 1) << what;
      EXPECT_EQ(counter("gemm.cublaslt_calls") - lt0, 4) << what;
    }
    {
      Tuning t(b, {{"linear.fallback", 1}});
      b.ffn(l0, l2, xd, sh.n, h, y);
      EXPECT_EQ(counter("ffn.fused_calls") - fu0, 1) << what;
      EXPECT_EQ(counter("gemm.fallback_calls") - fb0, 2) << what;
    }
  }
  ASSERT_TRUE(backends().cuda->status().ok()) << backends().cuda->status();
}

// STYLE.md 6: attention is planned once per step and every layer of every
// pass (3 denoising forwards + the write pass) runs from that plan
TEST(CudaCounters, AttentionIsPlannedOncePerStep) {
  WM_REQUIRE_CUDA();
  Backend& b = *backends().cuda;
  auto cfg = load_model_config(test::source_file("configs/default.json"));
  ASSERT_TRUE(cfg.ok()) << cfg.status();
  const ModelConfig& c = *cfg;
  Model model(b, c, random_host_weights(c, 5));
  const KvGeometry g = kv_geometry_of(c);
  std::vector<std::unique_ptr<KvCache>> caches;
  for (int s = 0; s < 2; ++s) {
    auto kv = b.make_kv_cache("fp16", g, KvFormatOptions{});
    ASSERT_TRUE(kv.ok()) << kv.status();
    caches.push_back(std::move(*kv));
  }
  const int B = c.frames_per_block, frames = 2 * B;
  Buffers buf(b);
  float* x = buf.put(randn(static_cast<size_t>(frames) * c.frame_values(), 21));
  float* vel = buf.zeros(static_cast<size_t>(frames) * c.frame_values());
  for (int step = 0; step < 4; ++step) {
    const int64_t plans0 = counter("attention.plans"), launches0 = counter("attention.launches");
    auto input = [&](float sigma, bool write) {
      ForwardInput in;
      in.tokens = x;
      in.write_pass = write;
      for (int s = 0; s < 2; ++s) {
        in.sessions.push_back({caches[static_cast<size_t>(s)].get(), s * B, B});
        for (int k = 0; k < B; ++k) {
          in.actions.push_back(Action{});
          in.sigma.push_back(sigma);
          in.frame_index.push_back(static_cast<int64_t>(step) * B + k);
        }
      }
      return in;
    };
    for (float sigma : c.sigmas) ASSERT_TRUE(model.forward(input(sigma, false), vel, nullptr).ok());
    ASSERT_TRUE(model.forward(input(0.0f, true), nullptr, nullptr).ok());
    ASSERT_TRUE(backends().cuda->synchronize().ok());
    EXPECT_EQ(counter("attention.plans") - plans0, 1) << "step " << step;
    EXPECT_EQ(counter("attention.launches") - launches0, static_cast<int64_t>(c.layers) * (c.sigmas.size() + 1))
        << "step " << step;
  }
  ASSERT_TRUE(backends().cuda->status().ok()) << backends().cuda->status();
}

// a batch-invariant session attends in a call of its own, planned as when it
// is alone: its output is bit for bit the one it gets alone, while a session
// that shares the batch's call is planned with the batch (its keys split into
// fewer, longer ranges once the batch fills a wave of CTAs) and rounds
// differently. Every session's cache is full (17 frames of 64 keys, 4 heads):
// alone, each is split into 18 one-tile ranges; 12 sessions are 864 tile-CTAs,
// more than a wave on an H200 or the emulator, so the shared call's ranges
// are longer. The same batch again makes no plan
TEST(CudaAttention, BatchInvariantSessionsAttendAsIfAlone) {
  WM_REQUIRE_CUDA();
  Backend& b = *backends().cuda;
  Tuning t(b, {{"attention.min_tiles_per_split", 1}});
  AttnSpec a;
  a.heads = 4;
  a.head_dim = 64;
  a.tokens_per_frame = 64;
  a.window = 16;
  a.sinks = 1;
  a.frames_per_block = 1;
  a.layers = 2;
  a.cached.assign(12, 17);
  Buffers buf(b);
  auto caches = filled_caches(b, buf, a, 77);
  ASSERT_EQ(caches.size(), a.cached.size());
  const size_t S = caches.size(), rows = static_cast<size_t>(a.tokens_per_frame);
  const size_t per_session = rows * a.heads * a.head_dim, vals = S * per_session;
  float* q = buf.put(randn(vals, 81));
  float* k = buf.put(randn(vals, 82));
  float* v = buf.put(randn(vals, 83));
  float *batched = buf.zeros(vals), *alone = buf.zeros(vals);
  auto invariant = [](size_t s) { return s % 3 == 1; };
  std::vector<SessionSlice> slices;
  for (size_t s = 0; s < S; ++s)
    slices.push_back({caches[s].get(), static_cast<int>(s), 1, invariant(s)});
  for (int l = 0; l < a.layers; ++l) {
    b.attention(l, slices, a.tokens_per_frame, q, k, v, batched);
    for (size_t s = 0; s < S; ++s) {
      const SessionSlice one{caches[s].get(), 0, 1, invariant(s)};
      const size_t o = s * per_session;
      b.attention(l, std::span<const SessionSlice>(&one, 1), a.tokens_per_frame, q + o, k + o, v + o, alone + o);
    }
    ASSERT_TRUE(backends().cuda->status().ok()) << backends().cuda->status();
    const auto got = buf.get(batched, vals), want = buf.get(alone, vals);
    int shared_differ = 0;
    for (size_t s = 0; s < S; ++s) {
      const size_t o = s * per_session;
      const bool same = std::equal(got.begin() + static_cast<std::ptrdiff_t>(o),
                                   got.begin() + static_cast<std::ptrdiff_t>(o + per_session),
                                   want.begin() + static_cast<std::ptrdiff_t>(o));
      if (invariant(s)) {
        EXPECT_TRUE(same) << "batch-invariant session " << s << " layer " << l;
      }
      shared_differ += same ? 0 : 1;
    }
    // what the invariant sessions are kept from: the shared call's plan is the batch's
    EXPECT_GT(shared_differ, 0) << "layer " << l << ": no shared session rounded differently; the test shows nothing";
  }
  // kept plans: the shared call, 4 invariant sessions; alone, 12 sessions
  const int64_t plans0 = counter("attention.plans");
  b.attention(0, slices, a.tokens_per_frame, q, k, v, batched);
  ASSERT_TRUE(backends().cuda->synchronize().ok());
  EXPECT_EQ(counter("attention.plans") - plans0, 0) << "the same batch again is planned already";
  EXPECT_GE(counter("attention.plans_kept"), 5);
  ASSERT_TRUE(backends().cuda->status().ok()) << backends().cuda->status();
}

// rms_norm_rope_qk writes q and k in fp16 as the attention kernels read
// them, and the attention call after it converts v alone: the same outputs
// bit for bit as converting all three (tuning attention.fused_inputs 0).
// A call that lays out fewer rows (its sessions end before the batch's)
// converts all three, and every call after it too (its layout overwrote
// the copies): so a batch-invariant session's call after the shared one,
// and a KIVI-2 session's call before the fp16 sessions'. Copies that a
// write since has made stale are never read.
TEST(CudaAttention, RopeWritesTheAttentionsHalfInputs) {
  WM_REQUIRE_CUDA();
  Backend& b = *backends().cuda;
  AttnSpec a;
  a.heads = 3;
  a.head_dim = 64;
  a.tokens_per_frame = 64;  // KIVI-2 on the GPU: a multiple of its residual
  a.window = 8;
  a.sinks = 1;
  a.frames_per_block = 1;
  a.layers = 1;
  a.cached = {5, 2, 7};
  Buffers buf(b);
  auto fp16 = filled_caches(b, buf, a, 91);
  a.formats = {"kivi2", "fp16", "fp16"};
  auto mixed = filled_caches(b, buf, a, 91);
  ASSERT_EQ(fp16.size(), a.cached.size());
  ASSERT_EQ(mixed.size(), a.cached.size());
  const int S = static_cast<int>(a.cached.size()), n = S * a.tokens_per_frame;
  const size_t vals = static_cast<size_t>(n) * a.heads * a.head_dim;
  const auto q0 = randn(vals, 92, 1.5f), k0 = randn(vals, 93, 0.7f), v0 = randn(vals, 94), later = randn(vals, 95);
  const float* qw = buf.put(randn(static_cast<size_t>(a.head_dim), 96, 0.2f, 1.0f));
  const float* kw = buf.put(randn(static_cast<size_t>(a.head_dim), 97, 0.2f, 0.5f));
  const int32_t* pos = buf.put(rope_positions(n, 11));
  enum Batch { kOneCall, kInvariant, kMixed };
  // the attention over the rotated q, k (q overwritten by `later` after the rotation where asked), and how many
  // of its calls converted v alone
  auto attend = [&](bool fused, Batch batch, bool write_q) {
    Tuning t(b, {{"attention.fused_inputs", fused ? 1 : 0}});
    std::vector<SessionSlice> slices;
    for (int s = 0; s < S; ++s)
      slices.push_back({(batch == kMixed ? mixed : fp16)[static_cast<size_t>(s)].get(), s, 1,
                        batch == kInvariant && s == 1});
    float *q = buf.put(q0), *k = buf.put(k0), *v = buf.put(v0), *out = buf.zeros(vals);
    b.rms_norm_rope_qk(q, qw, k, kw, n, a.heads, a.head_dim, a.heads * a.head_dim, pos, rope_of(a.head_dim), 1e-6f);
    if (write_q) b.upload(q, later.data(), vals * sizeof(float));
    const int64_t before = counter("attention.fused_input_calls");
    b.attention(0, slices, a.tokens_per_frame, q, k, v, out);
    const int64_t calls = counter("attention.fused_input_calls") - before;
    return std::pair{buf.get(out, vals), calls};
  };
  for (Batch batch : {kOneCall, kInvariant, kMixed})
    for (bool write_q : {false, true}) {
      SCOPED_TRACE(std::string(batch == kOneCall ? "one call" : batch == kInvariant ? "a batch-invariant session" : "KIVI-2 first") +
                   (write_q ? ", q written after the rotation" : ""));
      const auto [fused, fused_calls] = attend(true, batch, write_q);
      const auto [plain, plain_calls] = attend(false, batch, write_q);
      ASSERT_TRUE(backends().cuda->status().ok()) << backends().cuda->status();
      EXPECT_EQ(plain_calls, 0);
      EXPECT_EQ(fused_calls, write_q || batch == kMixed ? 0 : 1);
      EXPECT_TRUE(fused == plain) << "the outputs differ where q and k came from the RoPE";
    }
  // the copies are the attention's only: any call between drops them (here a download, which writes nothing)
  float *q = buf.put(q0), *k = buf.put(k0), *v = buf.put(v0), *out = buf.zeros(vals);
  b.rms_norm_rope_qk(q, qw, k, kw, n, a.heads, a.head_dim, a.heads * a.head_dim, pos, rope_of(a.head_dim), 1e-6f);
  buf.get(q, 1);
  std::vector<SessionSlice> slices;
  for (int s = 0; s < S; ++s) slices.push_back({fp16[static_cast<size_t>(s)].get(), s, 1});
  const int64_t before = counter("attention.fused_input_calls");
  b.attention(0, slices, a.tokens_per_frame, q, k, v, out);
  EXPECT_EQ(counter("attention.fused_input_calls") - before, 0);
  ASSERT_TRUE(backends().cuda->status().ok()) << backends().cuda->status();
}

// The attention writes its output in bf16 too, where the output projection
// reads it, so that the linear after it converts nothing: the projection's
// values are bit for bit those of converting, from the kernels' own rows and
// from the combine pass of a split cache alike. A call that writes only some
// rows of the batch (a batch-invariant session's, or the others' beside it)
// leaves the conversion to the linear; appending to the caches in between (a
// write pass) keeps the copy, and any other write drops it.
TEST(CudaAttention, AttentionWritesTheOutputProjectionsOperand) {
  WM_REQUIRE_CUDA();
  Backend& b = *backends().cuda;
  AttnSpec a;
  a.heads = 3;
  a.head_dim = 64;
  a.tokens_per_frame = 64;
  a.window = 16;
  a.frames_per_block = 1;
  a.layers = 1;
  Buffers buf(b);
  const int dim = a.heads * a.head_dim, proj = 40;
  LinearWeight lw{b.upload_weight(randn(static_cast<size_t>(proj) * dim, 71, 0.05f).data(), proj, dim),
                  buf.put(randn(static_cast<size_t>(proj), 72)), proj, dim};
  enum Batch { kOneCall, kInvariant };
  struct Run {
    std::vector<float> out, y;
    int64_t written = 0, converted = 0;
  };
  // the attention of sessions with `cached` frames, then the projection of its output
  auto run = [&](const std::vector<int>& cached, bool bf16_output, Batch batch) {
    Tuning t(b, {{"attention.bf16_output", bf16_output ? 1 : 0}});
    AttnSpec spec = a;
    spec.cached = cached;
    auto caches = filled_caches(b, buf, spec, 73);
    EXPECT_EQ(caches.size(), cached.size());
    const int S = static_cast<int>(cached.size()), n = S * a.tokens_per_frame;
    const size_t vals = static_cast<size_t>(n) * dim;
    float *q = buf.put(randn(vals, 74)), *k = buf.put(randn(vals, 75)), *v = buf.put(randn(vals, 76));
    float *out = buf.zeros(vals), *y = buf.zeros(static_cast<size_t>(n) * proj);
    std::vector<SessionSlice> slices;
    for (int s = 0; s < S; ++s)
      slices.push_back({caches[static_cast<size_t>(s)].get(), s, 1, batch == kInvariant && s == 0});
    Run r;
    const int64_t w0 = counter("attention.bf16_output_calls");
    b.attention(0, slices, a.tokens_per_frame, q, k, v, out);
    r.written = counter("attention.bf16_output_calls") - w0;
    const int64_t c0 = counter("linear.operand_conversions");
    b.linear(lw, out, n, y);
    r.converted = counter("linear.operand_conversions") - c0;
    r.out = buf.get(out, vals);
    r.y = buf.get(y, static_cast<size_t>(n) * proj);
    return r;
  };
  const std::vector<std::pair<std::string, std::vector<int>>> cases = {
      {"three short caches", {3, 0, 5}},
      {"one long cache, split", {14}},
      {"a long and a short cache", {14, 2}}};
  for (const auto& [name, cached] : cases)
    for (Batch batch : {kOneCall, kInvariant}) {
      SCOPED_TRACE(name + (batch == kInvariant ? ", the first session batch-invariant" : ""));
      const Run fused = run(cached, true, batch), plain = run(cached, false, batch);
      ASSERT_TRUE(backends().cuda->status().ok()) << backends().cuda->status();
      EXPECT_EQ(plain.written, 0);
      EXPECT_EQ(plain.converted, 1);
      // (a batch-invariant session's call that starts the batch writes a copy of its rows, which the next
      // call drops; a lone invariant session is the whole batch)
      const bool whole = batch == kOneCall || cached.size() == 1;
      if (whole) {
        EXPECT_EQ(fused.written, 1);
      }
      EXPECT_EQ(fused.converted, whole ? 0 : 1);
      EXPECT_TRUE(fused.out == plain.out);
      EXPECT_TRUE(fused.y == plain.y) << "the projection of the attention's own bf16 output differs";
    }
  // a write pass appends between the attention and the projection: the copy stays; a write to out drops it
  AttnSpec spec = a;
  spec.cached = {2, 4};
  auto caches = filled_caches(b, buf, spec, 77);
  ASSERT_EQ(caches.size(), 2u);
  const int n = 2 * a.tokens_per_frame;
  const size_t vals = static_cast<size_t>(n) * dim;
  float *q = buf.put(randn(vals, 78)), *k = buf.put(randn(vals, 79)), *v = buf.put(randn(vals, 80));
  float *out = buf.zeros(vals), *y = buf.zeros(static_cast<size_t>(n) * proj);
  const std::vector<SessionSlice> slices = {{caches[0].get(), 0, 1}, {caches[1].get(), 1, 1}};
  const int64_t w0 = counter("attention.bf16_output_calls");
  b.attention(0, slices, a.tokens_per_frame, q, k, v, out);
  EXPECT_EQ(counter("attention.bf16_output_calls") - w0, 1);
  const std::vector<int64_t> next_frames = {2, 4};
  ASSERT_TRUE(b.kv_append(0, slices, next_frames, a.tokens_per_frame, k, v).ok());
  int64_t c0 = counter("linear.operand_conversions");
  b.linear(lw, out, n, y);
  EXPECT_EQ(counter("linear.operand_conversions") - c0, 0) << "the cache append dropped the copy";
  b.attention(0, slices, a.tokens_per_frame, q, k, v, out);
  b.upload(out, randn(vals, 81).data(), vals * sizeof(float));
  c0 = counter("linear.operand_conversions");
  b.linear(lw, out, n, y);
  EXPECT_EQ(counter("linear.operand_conversions") - c0, 1) << "a write to the output left the copy in use";
  ASSERT_TRUE(backends().cuda->status().ok()) << backends().cuda->status();
}

// more attention calls in a pass than the plugin keeps plans for (64; every
// batch-invariant session is a call): each call is planned once, not again
// at every layer, and the same batch again plans nothing
TEST(CudaAttention, APassWithMoreCallsThanKeptPlansPlansEachCallOnce) {
  WM_REQUIRE_CUDA();
  Backend& b = *backends().cuda;
  AttnSpec a;
  a.heads = 2;
  a.head_dim = 64;
  a.tokens_per_frame = 16;
  a.frames_per_block = 1;
  a.layers = 3;
  a.cached.assign(70, 1);
  Buffers buf(b);
  auto caches = filled_caches(b, buf, a, 5);
  ASSERT_EQ(caches.size(), a.cached.size());
  const size_t S = caches.size(), vals = S * a.tokens_per_frame * a.heads * a.head_dim;
  float *q = buf.put(randn(vals, 6)), *k = buf.put(randn(vals, 7)), *v = buf.put(randn(vals, 8)), *out = buf.zeros(vals);
  std::vector<SessionSlice> slices;
  for (size_t s = 0; s < S; ++s) slices.push_back({caches[s].get(), static_cast<int>(s), 1, /*invariant=*/true});
  for (int pass = 0; pass < 2; ++pass) {
    const int64_t plans0 = counter("attention.plans");
    for (int l = 0; l < a.layers; ++l) b.attention(l, slices, a.tokens_per_frame, q, k, v, out);
    ASSERT_TRUE(backends().cuda->status().ok()) << backends().cuda->status();
    EXPECT_EQ(counter("attention.plans") - plans0, pass == 0 ? static_cast<int64_t>(S) : 0) << "pass " << pass;
  }
  EXPECT_GE(counter("attention.plans_kept"), static_cast<int64_t>(S));
}

// a GEMM whose output is not where cuBLASLt's heuristic assumes (256-byte
// aligned: the rows of one session inside a batch) is computed in an aligned
// buffer by the same algorithm: the same values bit for bit
TEST(CudaCounters, MisalignedGemmOutputsGiveTheAlignedValues) {
  WM_REQUIRE_CUDA();
  Backend& b = *backends().cuda;
  const int n = 9, in = 96, out = 40;
  Buffers buf(b);
  const auto w = randn(static_cast<size_t>(out) * in, 31, 0.05f), x = randn(static_cast<size_t>(n) * in, 32);
  LinearWeight lw{b.upload_weight(w.data(), out, in), buf.put(randn(static_cast<size_t>(out), 33)), out, in};
  float* xd = buf.put(x);
  float* y = buf.zeros(static_cast<size_t>(n) * out + 64);
  const int64_t re0 = counter("gemm.realigned_outputs"), fb0 = counter("gemm.fallback_calls");
  b.linear(lw, xd, n, y);
  const auto aligned = buf.get(y, static_cast<size_t>(n) * out);
  b.linear(lw, xd, n, y + 4);  // 16 bytes past a 256-byte boundary
  const auto shifted = buf.get(y + 4, static_cast<size_t>(n) * out);
  ASSERT_TRUE(backends().cuda->status().ok()) << backends().cuda->status();
  EXPECT_EQ(aligned, shifted);
  // (the CUDA-core fallback, where cuBLASLt has no algorithm, takes any output)
  if (counter("gemm.fallback_calls") == fb0) {
    EXPECT_EQ(counter("gemm.realigned_outputs") - re0, 1);
  }
}

// one session's 128-query tile (2 frames of 64 tokens: two warpgroups) over `cached` of a window of 22
// frames, head_dim 128, 2 heads
AttnSpec two_warpgroups_over(int cached) {
  AttnSpec a;
  a.heads = 2;
  a.head_dim = 128;
  a.tokens_per_frame = 64;
  a.window = 22;
  a.sinks = 0;
  a.frames_per_block = 2;
  a.cached = {cached};
  a.q_scale = 3.0f;
  return a;
}

// The TMA build's ring as deep as asked where the device holds it: 6 stages of 64 keys take 224 KiB
// (head_dim 128, 128 queries), which an H100 or H200 CTA may have (227). Where it may not, the backend
// runs the deepest that fits and says so in attention.ws_stages.*: the test "simt:...SmallerDevice"
// emulates a CTA of 230,430 bytes, 18 short of 6 stages (WM_TEST_TMA_DEEPEST is what it expects: 5).
// Either way the attention of two warpgroups through 24 key tiles matches the CPU's.
TEST(CudaCounters, TmaRingsAreAsDeepAsTheDeviceHolds) {
  WM_REQUIRE_CUDA();
  Backend& b = *backends().cuda;
  auto* pb = backends().cuda.get();
  if (!ws_available() || !pb->set_tuning("attention.ws_tma", 1).ok())
    GTEST_SKIP() << "no warp-specialised kernel with tensor maps here";
  ASSERT_TRUE(pb->set_tuning("attention.ws_tma", -1).ok());
  const char* e = std::getenv("WM_TEST_TMA_DEEPEST");
  const int64_t deepest = e != nullptr && *e != '\0' ? std::atoi(e) : 6;
  for (int64_t asked : {5, 6}) {
    AttnSpec a = two_warpgroups_over(22);
    a.tuning = {{"attention.kernel", 4},        {"attention.ws_tma", 1},  {"attention.ws_keys", 64},
                {"attention.stages", asked},    {"attention.block_q", 128}, {"attention.split", 1}};
    {
      Tuning t(b, a.tuning);
      EXPECT_EQ(counter("attention.ws_stages.block_q_128"), std::min(asked, deepest)) << asked;
      EXPECT_EQ(counter("attention.ws_stages.block_q_64"), std::min(asked, deepest)) << asked;
    }
    const OpCase c = attention_case(a);
    const auto cpu = c.run(*backends().cpu, 11);
    const int64_t tma0 = counter("attention.ws_tma_launches");
    const auto cuda = c.run(b, 11);
    ASSERT_TRUE(backends().cuda->status().ok()) << backends().cuda->status();
    EXPECT_EQ(counter("attention.ws_tma_launches") - tma0, a.layers) << asked;
    const auto r = close(cpu, cuda, c.tol);
    EXPECT_TRUE(r) << asked << c.explain(cpu, cuda);
  }
}

// "attention.ws_ablate": the warp-specialised kernel with half of its work taken out, for the benchmark
// that times each half (docs/CUDA.md, "Ablations"). Two warpgroups over 22 cached frames of 64 tokens and a
// block of 2 (24 steps of 64 keys, 4 stages), by cp.async and by TMA: 1 (the loads alone) leaves every output
// 0, since no score was computed; 2 (the consumers alone) gives finite outputs that are not the attention's,
// since the steps past the ring's first 4 compute on the tiles already there; over 1 cached frame (3 steps,
// all in the ring's first round) 2 is the attention bit for bit; and 0 is the attention again
TEST(CudaCounters, WarpSpecialisedAblationsTakeOutHalfTheWork) {
  WM_REQUIRE_CUDA();
  Backend& b = *backends().cuda;
  auto* pb = backends().cuda.get();
  if (!ws_available()) GTEST_SKIP() << "no warp-specialised kernel here";
  for (int64_t bad : {int64_t{-1}, int64_t{3}, (int64_t{1} << 32) + 1})
    EXPECT_EQ(pb->set_tuning("attention.ws_ablate", bad).code(), absl::StatusCode::kInvalidArgument) << bad;
  EXPECT_EQ(counter("attention.ws_ablate"), 0);
  const bool tma_here = pb->set_tuning("attention.ws_tma", 1).ok();
  ASSERT_TRUE(pb->set_tuning("attention.ws_tma", -1).ok());
  for (int64_t tma : {0, 1}) {
    if (tma == 1 && !tma_here) continue;
    for (int cached : {22, 1}) {
      AttnSpec a = two_warpgroups_over(cached);
      a.layers = 1;
      a.tuning = {{"attention.kernel", 4}, {"attention.ws_tma", tma},    {"attention.ws_keys", 64},
                  {"attention.stages", 4}, {"attention.block_q", 128}, {"attention.split", 1}};
      const std::string label = "TMA " + std::to_string(tma) + ", " + std::to_string(cached) + " cached frames";
      std::vector<float> out[3];
      for (int64_t ablate : {0, 1, 2}) {
        AttnSpec ab = a;
        ab.tuning.emplace_back("attention.ws_ablate", ablate);
        const int64_t ws0 = counter("attention.ws_launches"), tma0 = counter("attention.ws_tma_launches");
        out[ablate] = attention_case(ab).run(b, 13);
        ASSERT_TRUE(backends().cuda->status().ok()) << label << ", ablation " << ablate << ": "
                                                    << backends().cuda->status();
        EXPECT_EQ(counter("attention.ws_launches") - ws0, 1) << label << ", ablation " << ablate;
        EXPECT_EQ(counter("attention.ws_tma_launches") - tma0, tma) << label << ", ablation " << ablate;
        ASSERT_FALSE(out[ablate].empty()) << label;
      }
      EXPECT_EQ(counter("attention.ws_ablate"), 0) << "reset with the scope's tuning";
      const OpCase c = attention_case(a);
      const auto cpu = c.run(*backends().cpu, 13);
      EXPECT_TRUE(close(cpu, out[0], c.tol)) << label << c.explain(cpu, out[0]);
      size_t nonzero = 0, nonfinite = 0, differ = 0;
      for (size_t i = 0; i < out[0].size(); ++i) {
        nonzero += out[1][i] != 0.0f;
        nonfinite += !std::isfinite(out[2][i]);
        differ += std::memcmp(&out[2][i], &out[0][i], sizeof(float)) != 0;
      }
      EXPECT_EQ(nonzero, 0u) << label << ": the loads alone compute nothing";
      EXPECT_EQ(nonfinite, 0u) << label;
      if (cached == 1) {
        EXPECT_EQ(differ, 0u) << label << ": every step in the ring's first round is loaded";
      } else {
        EXPECT_GT(differ, out[0].size() / 2) << label << ": steps past the ring's first round reuse its tiles";
      }
    }
  }
}

// "attention.kernel" picks the kernel that runs: 1 mma.sync, 2 wgmma, 3 wgmma overlapped, 4 warp-specialised
// (2, 3 and 4 for head_dim 64 and 128 only, on compute capability 9.0), 0 the process default
// (WM_CUDA_ATTENTION, else 4 for 128-query tiles at head_dim 128 and 3 for the rest, wherever they run)
TEST(CudaCounters, AttentionKernelChoiceIsHonoured) {
  WM_REQUIRE_CUDA();
  Backend& b = *backends().cuda;
  const bool wgmma = wgmma_available(), ws = ws_available();
  const std::map<std::string, int64_t> by_name = {{"auto", 3}, {"mma", 1}, {"wgmma", 2}, {"overlap", 3}, {"ws", 4}};
  const char* env = std::getenv("WM_CUDA_ATTENTION");
  const int64_t default_kernel = env == nullptr || *env == '\0' ? 3 : by_name.at(env);
  for (int hd : {32, 64, 128})
    for (int64_t kernel : {0, 1, 2, 3, 4}) {
      if (kernel >= 2 && !wgmma) continue;
      if (kernel == 4 && !ws_available()) continue;
      AttnSpec a;
      a.head_dim = hd;
      a.cached = {0, 3};
      a.tuning = {{"attention.kernel", kernel}};
      int64_t expect = !wgmma || hd == 32 ? 1 : kernel == 0 ? default_kernel : kernel;
      if (expect == 2 && hd == 64) expect = 3;  // the plain wgmma kernel is built for head_dim 128 only
      const int64_t sm90_0 = counter("attention.sm90_launches"), overlap0 = counter("attention.overlap_launches"),
                    ws0 = counter("attention.ws_launches"), all0 = counter("attention.launches");
      attention_case(a).run(b, 7);
      ASSERT_TRUE(backends().cuda->synchronize().ok());
      const int64_t all = counter("attention.launches") - all0;
      EXPECT_EQ(all, a.layers) << "head_dim " << hd << " kernel " << kernel;
      EXPECT_EQ(counter("attention.sm90_launches") - sm90_0, expect >= 2 ? all : 0)
          << "head_dim " << hd << " kernel " << kernel;
      EXPECT_EQ(counter("attention.overlap_launches") - overlap0, expect == 3 ? all : 0)
          << "head_dim " << hd << " kernel " << kernel;
      EXPECT_EQ(counter("attention.ws_launches") - ws0, expect == 4 ? all : 0)
          << "head_dim " << hd << " kernel " << kernel;
      Tuning t(b, {{"attention.kernel", kernel}});
      EXPECT_EQ(counter(("attention.kernel.head_dim_" + std::to_string(hd)).c_str()), expect);
      // 128-query tiles: by default the warp-specialised kernel at head_dim 128, where it fits
      const int64_t expect_128 =
          kernel == 0 && hd == 128 && expect == 3 && (env == nullptr || *env == '\0') && ws ? 4 : expect;
      EXPECT_EQ(counter(("attention.kernel.head_dim_" + std::to_string(hd) + ".block_q_128").c_str()), expect_128)
          << "head_dim " << hd << " kernel " << kernel;
    }
  EXPECT_EQ(counter("attention.kernel.head_dim_48"), 0);
  auto* pb = backends().cuda.get();
  EXPECT_EQ(pb->set_tuning("attention.kernel", 5).code(), absl::StatusCode::kInvalidArgument);
  // stages and ping-pong: the process defaults (WM_CUDA_ATTENTION_STAGES, _PINGPONG, else 3 and 1) come back
  // when the knobs are reset
  const int64_t stages0 = counter("attention.stages"), pingpong0 = counter("attention.pingpong");
  if (std::getenv("WM_CUDA_ATTENTION_STAGES") == nullptr) {
    EXPECT_EQ(stages0, kStagesDefault);
  }
  if (std::getenv("WM_CUDA_ATTENTION_PINGPONG") == nullptr) {
    EXPECT_EQ(pingpong0, kPingpongDefault);
  }
  for (int64_t bad : {int64_t{-1}, int64_t{1}, int64_t{2}, int64_t{7}, int64_t{64}, (int64_t{1} << 32) + 4})
    EXPECT_EQ(pb->set_tuning("attention.stages", bad).code(), absl::StatusCode::kInvalidArgument) << bad;
  for (int64_t bad : {int64_t{-2}, int64_t{2}, (int64_t{1} << 32) + 1})
    EXPECT_EQ(pb->set_tuning("attention.pingpong", bad).code(), absl::StatusCode::kInvalidArgument) << bad;
  // the warp-specialised kernel's keys per step and stages: 64 keys in 4 stages by default, the H200's
  // fastest at 2640 queries (docs/PERFORMANCE.md)
  for (int64_t bad : {int64_t{-1}, int64_t{32}, int64_t{96}, int64_t{256}, (int64_t{1} << 32) + 64})
    EXPECT_EQ(pb->set_tuning("attention.ws_keys", bad).code(), absl::StatusCode::kInvalidArgument) << bad;
  if (std::getenv("WM_CUDA_ATTENTION_WS_KEYS") == nullptr) {
    EXPECT_EQ(counter("attention.ws_keys.block_q_128"), 64);
    EXPECT_EQ(counter("attention.ws_keys.block_q_64"), 64);
    if (std::getenv("WM_CUDA_ATTENTION_STAGES") == nullptr) {
      EXPECT_EQ(counter("attention.ws_stages.block_q_128"), 4);
    }
  }
  {  // 128 keys a step run 3 stages whatever attention.stages says; 64 keys run 3 or 4 (5 runs 4)
    Tuning t(b, {{"attention.ws_keys", 128}, {"attention.stages", 4}});
    EXPECT_EQ(counter("attention.ws_keys.block_q_64"), 128);
    EXPECT_EQ(counter("attention.ws_stages.block_q_64"), 3);
  }
  {
    Tuning t(b, {{"attention.ws_keys", 64}, {"attention.stages", 5}});
    EXPECT_EQ(counter("attention.ws_stages.block_q_128"), 4);
  }
  {  // 6 stages: the overlapped kernel runs 5, the cp.async build 4, the TMA build 6
    Tuning t(b, {{"attention.ws_keys", 64}, {"attention.stages", 6}, {"attention.ws_tma", 0}});
    EXPECT_EQ(counter("attention.stages"), 5);
    EXPECT_EQ(counter("attention.ws_stages.block_q_128"), 4);
    if (ws_available()) {
      Tuning tma(b, {{"attention.ws_tma", 1}});
      EXPECT_EQ(counter("attention.ws_stages.block_q_128"), 6);
      EXPECT_EQ(counter("attention.ws_stages.block_q_64"), 6);
    }
  }
  // TMA for the warp-specialised kernel's cache tiles: off by default (not yet timed on the H200), 0 or 1;
  // on compute capability 9.0 the tensor maps of the pool exist (the driver's encoder, or the emulator's)
  for (int64_t bad : {int64_t{-2}, int64_t{2}, (int64_t{1} << 32) + 1})
    EXPECT_EQ(pb->set_tuning("attention.ws_tma", bad).code(), absl::StatusCode::kInvalidArgument) << bad;
  if (std::getenv("WM_CUDA_ATTENTION_WS_TMA") == nullptr) {
    EXPECT_EQ(counter("attention.ws_tma"), 0);
  }
  if (ws_available()) {
    Tuning t(b, {{"attention.ws_tma", 1}});
    EXPECT_EQ(counter("attention.ws_tma"), 1);
    for (int64_t tma : {1, 0}) {  // the launches count only where the TMA build ran
      AttnSpec a;
      a.head_dim = 128;
      a.cached = {2, 5};
      a.tuning = {{"attention.kernel", 4}, {"attention.ws_tma", tma}};
      const int64_t tma0 = counter("attention.ws_tma_launches"), ws0 = counter("attention.ws_launches");
      attention_case(a).run(b, 3);
      ASSERT_TRUE(backends().cuda->synchronize().ok());
      EXPECT_EQ(counter("attention.ws_launches") - ws0, a.layers);
      EXPECT_EQ(counter("attention.ws_tma_launches") - tma0, tma == 1 ? a.layers : 0);
    }
  } else {
    EXPECT_EQ(pb->set_tuning("attention.ws_tma", 1).code(), absl::StatusCode::kFailedPrecondition);
  }
  {
    Tuning t(b, {{"attention.stages", 5}, {"attention.pingpong", 1 - pingpong0}});
    EXPECT_EQ(counter("attention.stages"), 5);
    EXPECT_EQ(counter("attention.pingpong"), 1 - pingpong0);
  }
  EXPECT_EQ(counter("attention.stages"), stages0);
  EXPECT_EQ(counter("attention.pingpong"), pingpong0);
  if (!wgmma) {
    EXPECT_EQ(pb->set_tuning("attention.kernel", 2).code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(pb->set_tuning("attention.kernel", 3).code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(pb->set_tuning("attention.kernel", 4).code(), absl::StatusCode::kFailedPrecondition);
  }
  ASSERT_TRUE(backends().cuda->status().ok()) << backends().cuda->status();
}

// every kernel once on small shapes: compute-sanitizer (memcheck, racecheck)
// runs this test alone (tools/gpu-run.sh)
TEST(CudaSanitizerSmoke, EveryKernelOnce) {
  WM_REQUIRE_CUDA();
  std::vector<OpCase> small = {linear_case(5, 64, 96, true), linear_case(5, 7, 3, true, true),
                               layer_norm_case(7, 100, 3), rms_norm_rope_case(9, 3, 64, 16, 5000), gelu_case(1003),
                               ffn_case(5, 7, 13, 3, false, true), ffn_case(9, 64, 96, 64, true, true),
                               gated_residual_case(9, 33, 4), gated_residual_norm_case(9, 33, 4, 6 * 33),
                               rms_norm_rope_qk_case(9, 3, 64, 16, 5000), patchify_case({8, 12, 3, 4}, 2, false),
                               patchify_case({8, 12, 3, 4}, 2, true), euler_case(2, 77, true), noise_case(300),
                               add_rows_case(5, 3, 70)};
  // head_dim 128 runs the mma.sync kernel split, the plain wgmma kernel with one warpgroup, the default
  // kernel (overlapped wgmma on compute capability 9.0) with two, and the warp-specialised one with 64 and
  // 128 keys a step, by cp.async and by TMA; head_dim 32 runs mma.sync throughout
  for (int hd : {32, 128})
    for (const auto& tu : std::vector<std::vector<std::pair<std::string, int64_t>>>{
             {{"attention.block_q", 64}, {"attention.split", 3}, {"attention.kernel", 1}},
             {{"attention.block_q", 64}, {"attention.split", 2}, {"attention.kernel", wgmma_available() ? 2 : 1}},
             {{"attention.block_q", 128}, {"attention.split", 1}},
             {{"attention.block_q", 128}, {"attention.split", 2}, {"attention.kernel", ws_available() ? 4 : 1}},
             {{"attention.block_q", 128},
              {"attention.split", 2},
              {"attention.kernel", ws_available() ? 4 : 1},
              {"attention.ws_keys", ws_available() ? 128 : 0}},
             {{"attention.block_q", 128},
              {"attention.split", 2},
              {"attention.kernel", ws_available() ? 4 : 1},
              {"attention.ws_tma", ws_available() ? 1 : 0}},
             {{"attention.block_q", 128},
              {"attention.split", 1},
              {"attention.kernel", ws_available() ? 4 : 1},
              {"attention.ws_keys", ws_available() ? 128 : 0},
              {"attention.ws_tma", ws_available() ? 1 : 0}}}) {
      AttnSpec a;
      a.head_dim = hd;
      a.cached = {0, 6};
      a.tuning = tu;
      a.label = "smoke";
      small.push_back(attention_case(a));
    }
  // the quantized formats' write passes and tile decoders: KIVI-2, and QuantWM-2 with frames that end
  // mid-tile, on mma.sync and on the default kernel
  for (const int64_t kernel : {1, 0}) {
    AttnSpec a;
    a.tokens_per_frame = 64;
    a.format = "kivi2";
    a.cached = {0, 6};
    a.tuning = {{"attention.kernel", kernel}};
    a.label = "smoke_kivi2";
    small.push_back(attention_case(a));
    a.head_dim = 128;
    a.tokens_per_frame = 80;
    a.sinks = 0;
    a.format = "quantwm2";
    a.observe = true;
    a.label = "smoke_quantwm2";
    small.push_back(attention_case(a));
  }
  for (const OpCase& c : small) {
    const auto cpu = c.run(*backends().cpu, 99);
    const auto cuda = c.run(*backends().cuda, 99);
    EXPECT_TRUE(close(cpu, cuda, c.tol)) << c.name;
  }
  // audit mode's probes (kv_probe.cuh): the fp16, KIVI-2 and QuantWM-2 tile decoders, the combine, the rank
  for (const char* format : {"kivi2", "quantwm2"}) {
    AttnSpec a;
    a.tokens_per_frame = 64;
    a.format = format;
    if (std::string(format) == "quantwm2") {
      a.head_dim = 128;
      a.tokens_per_frame = 80;
      a.sinks = 0;
      a.observe = true;
    }
    a.cached = {6};
    Buffers buf(*backends().cuda);
    auto c = filled_caches(*backends().cuda, buf, a, 13);
    a.format = "fp16";
    auto ref = filled_caches(*backends().cuda, buf, a, 13);
    ASSERT_EQ(c.size(), 1u);
    ASSERT_EQ(ref.size(), 1u);
    const size_t vals = static_cast<size_t>(a.tokens_per_frame) * a.heads * a.head_dim;
    ProbeRanks r;
    EXPECT_TRUE(c[0]->probe_against(*ref[0], 1, buf.put(randn(vals, 1)), buf.put(randn(vals, 2)),
                                    buf.put(randn(vals, 3)), a.tokens_per_frame,
                                    probe_sample(a.tokens_per_frame, a.heads, 4, 5), 8, &r))
        << format;
  }
  ASSERT_TRUE(backends().cuda->synchronize().ok());
  ASSERT_TRUE(backends().cuda->status().ok()) << backends().cuda->status();
}

// ---- end to end ---------------------------------------------------------------------

double psnr_rgb(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  double se = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    se += d * d;
  }
  const double mse = se / std::max<size_t>(1, a.size());
  return mse == 0 ? 99.0 : 10.0 * std::log10(255.0 * 255.0 / mse);
}

// a small model with 3-frame blocks, a sink and a short window, so that 8
// blocks exercise multi-frame appends and ring eviction
std::string block_config_path() {
  const std::string path = (std::filesystem::temp_directory_path() / "wm_backend_ops_blocks.json").string();
  std::ofstream f(path);
  f << R"({"format": "wmserve-cldit", "version": 1, "name": "blocks-test",
  "frame": {"channels": 3, "height": 32, "width": 48, "patch": 4, "decoder": "pixels"},
  "dim": 128, "layers": 3, "heads": 2, "head_dim": 64, "ffn": 320, "freq_dim": 64, "norm_eps": 1e-6,
  "rope": {"theta": 10000.0, "t_pairs": 12, "h_pairs": 10, "w_pairs": 10},
  "actions": {"keys": ["W", "A", "S", "D"], "mouse": ["yaw", "pitch"], "mouse_scale": 10.0, "mouse_limit": 45.0},
  "sampling": {"frames_per_block": 3, "sigmas": [1.0, 0.7, 0.35]},
  "cache": {"window_frames": 6, "sink_frames": 1}})";
  return path;
}

std::unique_ptr<Engine> engine_on(const std::string& device, const std::string& config, bool defer_writes = false,
                                  bool graphs = false, double audit_blocks = 0.125) {
  EngineOptions o;
  o.audit_block_fraction = audit_blocks;
  o.defer_writes = defer_writes;
  o.device_graphs = graphs;
  o.random_weights = true;
  o.random_seed = 3;
  o.config_path = config;
  o.device = device;
  o.cuda_plugin = test::cuda_plugin_path();
  o.kv_budget_bytes = int64_t{256} << 20;
  o.abort_on_device_error = false;  // a device failure fails the step, the other tests still report
  auto e = Engine::create(o);
  EXPECT_TRUE(e.ok()) << e.status();
  return e.ok() ? std::move(*e) : nullptr;
}

Action act(int i) {
  Action a;
  a.keys = 1u << (i % 4);
  a.mouse[0] = static_cast<float>((i * 7) % 30 - 15);
  a.mouse[1] = 1.0f;
  return a;
}

// three sessions at different lengths stepped as one batch on both devices
void expect_same_rollouts(const std::string& config, int blocks, bool defer_cuda_writes = false,
                          const std::string& format = "fp16") {
  auto cpu = engine_on("cpu", config), cuda = engine_on("cuda", config, defer_cuda_writes);
  ASSERT_NE(cpu, nullptr);
  ASSERT_NE(cuda, nullptr);
  ASSERT_EQ(cuda->device(), "cuda");
  const int B = cpu->config().frames_per_block;
  std::vector<SessionId> ci, gi;
  for (uint64_t seed : {7u, 8u, 9u}) {
    SessionOptions so;
    so.seed = seed;
    so.cache_format = format;
    auto c = cpu->open_session(so);
    auto g = cuda->open_session(so);
    ASSERT_TRUE(c.ok()) << c.status();
    ASSERT_TRUE(g.ok()) << g.status();
    ci.push_back(*c);
    gi.push_back(*g);
  }
  double worst = 99, sum = 0;
  int frames = 0;
  for (int step = 0; step < blocks; ++step) {
    std::vector<StepRequest> rc, rg;
    // session k joins at step k: different cache lengths in every batch
    for (size_t k = 0; k < ci.size(); ++k) {
      if (step < static_cast<int>(k)) continue;
      std::vector<Action> acts;
      for (int b = 0; b < B; ++b) acts.push_back(act(step * B + b + static_cast<int>(k)));
      rc.push_back({ci[k], acts, {}});
      rg.push_back({gi[k], acts, {}});
    }
    auto oc = cpu->step(rc), og = cuda->step(rg);
    ASSERT_TRUE(oc.ok()) << oc.status();
    ASSERT_TRUE(og.ok()) << og.status();
    for (size_t r = 0; r < oc->size(); ++r)
      for (size_t f = 0; f < (*oc)[r].frames.size(); ++f) {
        const double p = psnr_rgb((*oc)[r].frames[f].rgb, (*og)[r].frames[f].rgb);
        worst = std::min(worst, p);
        sum += p;
        ++frames;
        EXPECT_GE(p, kMinPsnrDb) << "step " << step << " session " << r << " frame " << f;
      }
  }
  std::printf("end to end (%s, %s): %d frames, PSNR cuda vs cpu: min %.2f dB, mean %.2f dB\n", config.c_str(),
              format.c_str(), frames, worst, sum / std::max(1, frames));
  const BackendMemory m = cuda->device_memory();
  EXPECT_GT(m.kv_pool_used, 0);
  EXPECT_EQ(cuda->kv_capacity_bytes(), m.kv_pool_capacity);
  auto info = cuda->session_info(gi[0]);
  ASSERT_TRUE(info.ok());
  EXPECT_GE(info->kv.total(), 1);
}

TEST(CudaEndToEnd, DefaultModelShapesMatchTheCpu) {
  WM_REQUIRE_CUDA();
  // wm-default-64's shapes (4 heads x 64, 64 tokens per frame, window 16 + 1 sink): 20 frames pass the window
  expect_same_rollouts(test::source_file("configs/default.json"), 20);
}

// the server's way: frames out first, the write pass after (EngineOptions::defer_writes)
TEST(CudaEndToEnd, DeferredWritesMatchTheCpu) {
  WM_REQUIRE_CUDA();
  expect_same_rollouts(test::source_file("configs/default.json"), 12, /*defer_cuda_writes=*/true);
}

// wm-default-64's shapes with a window of 4 frames (and its sink), so that
// a few blocks pass the window
std::string short_window_config_path() {
  std::ifstream in(test::source_file("configs/default.json"));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string from = "\"window_frames\": 16";
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos);
  if (at != std::string::npos) text.replace(at, from.size(), "\"window_frames\": 4");
  const std::string path = (std::filesystem::temp_directory_path() / "wm_backend_ops_short_window.json").string();
  std::ofstream(path) << text;
  return path;
}

// KIVI-2 sessions on both devices, past the window: the device's K/V differ
// from the CPU's by bf16 GEMM rounding, so a value near a level boundary can
// take the other code; the frames stay as close as fp16's all the same
TEST(CudaEndToEnd, KiviSessionsMatchTheCpu) {
  WM_REQUIRE_CUDA();
  expect_same_rollouts(short_window_config_path(), 9, /*defer_cuda_writes=*/true, "kivi2");
}

// QVG-2 and QuantWM-2 sessions on both devices, past the window: coded from
// the device's K/V (and QuantWM-2's from its queries), which differ from
// the CPU's by bf16 rounding, so a token near a boundary can take another
// centroid or code (WM_CUDA_SPAN_CODER picks where the coder runs)
TEST(CudaEndToEnd, SpanSessionsMatchTheCpu) {
  WM_REQUIRE_CUDA();
  for (const char* format : {"qvg2", "quantwm2"})
    expect_same_rollouts(short_window_config_path(), 9, /*defer_cuda_writes=*/true, format);
}

// audit mode on the device: a kivi2 and an fp16 session audited against
// their fp16 shadows in the device's pages (the probes download queries and
// K/V), the drift alike on both devices (the same sessions, K/V apart by
// rounding; the CPU's shadow is fp32), fp16's none
TEST(CudaEndToEnd, AuditedSessionsMeasureDriftOnTheDevice) {
  WM_REQUIRE_CUDA();
  const std::string config = short_window_config_path();
  auto cpu = engine_on("cpu", config), cuda = engine_on("cuda", config);
  ASSERT_NE(cpu, nullptr);
  ASSERT_NE(cuda, nullptr);
  EXPECT_TRUE(cuda->audit_supported());
  // the shadow is counted against the budget: an fp16 cache's pages on top of the format's
  EXPECT_EQ(cuda->session_reservation("kivi2", true) - cuda->session_reservation("kivi2"),
            cuda->session_reservation("fp16"));
  EXPECT_EQ(cpu->session_reservation("kivi2", true) - cpu->session_reservation("kivi2"),
            cpu->session_reservation("fp32"));
  std::vector<SessionId> ci, gi;
  for (const char* format : {"kivi2", "fp16"}) {
    SessionOptions so;
    so.seed = 11;
    so.cache_format = format;
    so.audit = true;
    auto c = cpu->open_session(so);
    auto g = cuda->open_session(so);
    ASSERT_TRUE(c.ok()) << c.status();
    ASSERT_TRUE(g.ok()) << g.status();
    ci.push_back(*c);
    gi.push_back(*g);
  }
  for (int step = 0; step < 8; ++step) {
    std::vector<StepRequest> rc, rg;
    for (size_t k = 0; k < ci.size(); ++k) {
      rc.push_back({ci[k], {act(step)}, {}});
      rg.push_back({gi[k], {act(step)}, {}});
    }
    ASSERT_TRUE(cpu->step(rc).ok());
    auto og = cuda->step(rg);
    ASSERT_TRUE(og.ok()) << og.status();
  }
  const auto dc = cpu->drift_by_format(), dg = cuda->drift_by_format();
  for (const char* format : {"kivi2", "fp16"}) {
    ASSERT_TRUE(dg.count(format)) << format;
    const DriftStats &c = dc.at(format), &g = dg.at(format);
    std::printf("audit %s: cpu %lld probes, drift %.3f; cuda %lld probes, drift %.3f\n", format,
                static_cast<long long>(c.queries), c.drift(), static_cast<long long>(g.queries), g.drift());
    EXPECT_GT(g.queries, 0) << format;
    EXPECT_EQ(g.queries, c.queries) << format << ": the same calls are probed";
    EXPECT_NEAR(g.drift(), c.drift(), 0.1) << format;
  }
  EXPECT_GT(dg.at("kivi2").drift(), dg.at("fp16").drift()) << "2-bit keys move the top-1 token, fp16 hardly";
  EXPECT_LT(dg.at("fp16").drift(), 0.05);
  // the probes ran on the device (kv_probe.cuh), one launch set per probed call
  ASSERT_NE(cuda->device_plugin(), nullptr);
  EXPECT_GT(*cuda->device_plugin()->counter("kv.probe_launches"), 0);
}

// shadow frames on the device (every block, --audit_blocks 1): an audited
// session is served the frames an unaudited one gets, and the blocks made
// again against its fp16 device shadow rank the formats as on the CPU:
// fp16 identical to its shadow, kivi2 visibly not
TEST(CudaEndToEnd, ShadowFramesOnTheDeviceLeaveTheServedFramesAlone) {
  WM_REQUIRE_CUDA();
  const std::string config = short_window_config_path();
  const int blocks = 6;
  std::map<std::string, std::map<std::string, DriftStats>> drift;  // device -> format -> stats
  for (const std::string device : {"cpu", "cuda"}) {
    auto plain = engine_on(device, config), audited = engine_on(device, config, false, false, /*audit_blocks=*/1.0);
    ASSERT_NE(plain, nullptr);
    ASSERT_NE(audited, nullptr);
    for (const std::string format : {"fp16", "kivi2"}) {
      std::vector<std::vector<uint8_t>> served[2];
      Engine* engines[2] = {plain.get(), audited.get()};
      for (int k = 0; k < 2; ++k) {
        SessionOptions so;
        so.seed = 21;
        so.cache_format = format;
        so.audit = k == 1;
        auto id = engines[k]->open_session(so);
        ASSERT_TRUE(id.ok()) << id.status();
        for (int step = 0; step < blocks; ++step) {
          const StepRequest r{*id, std::vector<Action>(static_cast<size_t>(engines[k]->config().frames_per_block),
                                                       act(step)), {}};
          auto out = engines[k]->step(std::span<const StepRequest>(&r, 1));
          ASSERT_TRUE(out.ok()) << out.status();
          for (const Frame& f : (*out)[0].frames) served[k].push_back(f.rgb);
        }
      }
      EXPECT_EQ(served[0], served[1]) << device << " " << format << ": the audit changed the served frames";
      const auto d = audited->drift_by_format();
      ASSERT_EQ(d.count(format), 1u);
      drift[device][format] = d.at(format);
      EXPECT_EQ(d.at(format).frames, blocks * audited->config().frames_per_block) << device << " " << format;
    }
  }
  for (const auto& [device, formats] : drift)
    for (const auto& [format, d] : formats)
      std::printf("shadow frames %s %s: %lld frames, PSNR %.2f dB (worst %.2f), drift %.3f\n", device.c_str(),
                  format.c_str(), static_cast<long long>(d.frames), d.frame_psnr(), d.frame_psnr_min, d.drift());
  // the device's shadow is its own fp16 cache: an fp16 session's blocks come out the same
  EXPECT_EQ(drift["cuda"]["fp16"].frame_psnr_min, DriftStats::kPsnrCapDb);
  EXPECT_LT(drift["cuda"]["kivi2"].frame_psnr(), drift["cuda"]["fp16"].frame_psnr());
  EXPECT_LT(drift["cpu"]["kivi2"].frame_psnr(), drift["cpu"]["fp16"].frame_psnr());
  EXPECT_NEAR(drift["cuda"]["kivi2"].frame_psnr(), drift["cpu"]["kivi2"].frame_psnr(), 3.0)
      << "the same format's one-block cost on both devices";
}

TEST(CudaEndToEnd, MultiFrameBlocksMatchTheCpu) {
  WM_REQUIRE_CUDA();
  expect_same_rollouts(block_config_path(), 8);
}

// ---- graphs: a denoising pass recorded once, run again ----------------------------

// the same sessions with and without graphs give the same frames bit for bit
// (the same kernels in the same order); sessions join at different steps, and
// prepare_recording grows the buffers for a larger batch, so only the very
// first step's recording fails (its pass makes the RoPE table and the first
// bf16 copies) and runs as usual; the last steps repeat a shape of work (the
// graph is updated in place). `fused`: the feed-forward block's tuning;
// `format`: the sessions' cache format
void expect_graphs_change_no_frame(bool fused, int steps, const std::string& format = "fp16") {
  SCOPED_TRACE(format);
  const std::string config = test::source_file("configs/default.json");
  auto plain = engine_on("cuda", config, true), graphed = engine_on("cuda", config, true, /*graphs=*/true);
  ASSERT_NE(plain, nullptr);
  ASSERT_NE(graphed, nullptr);
  ASSERT_NE(graphed->device_plugin(), nullptr);
  Tuning tp(*plain->device_plugin(), {{"ffn.fused", fused ? 1 : 0}});
  Tuning tg(*graphed->device_plugin(), {{"ffn.fused", fused ? 1 : 0}});
  const int B = plain->config().frames_per_block;
  const int64_t passes = static_cast<int64_t>(plain->config().sigmas.size());
  std::vector<SessionId> pi, gi;
  for (uint64_t seed : {4u, 5u, 6u}) {
    SessionOptions so;
    so.seed = seed;
    so.cache_format = format;
    auto p = plain->open_session(so), g = graphed->open_session(so);
    ASSERT_TRUE(p.ok()) << p.status();
    ASSERT_TRUE(g.ok()) << g.status();
    pi.push_back(*p);
    gi.push_back(*g);
  }
  for (int step = 0; step < steps; ++step) {
    std::vector<StepRequest> rp, rg;
    for (size_t k = 0; k < pi.size(); ++k) {
      if (step < 2 * static_cast<int>(k)) continue;  // session k joins at step 2k
      std::vector<Action> acts;
      for (int b = 0; b < B; ++b) acts.push_back(act(step * B + b + static_cast<int>(k)));
      rp.push_back({pi[k], acts, {}});
      rg.push_back({gi[k], acts, {}});
    }
    auto op = plain->step(rp), og = graphed->step(rg);
    ASSERT_TRUE(op.ok()) << op.status();
    ASSERT_TRUE(og.ok()) << og.status();
    ASSERT_EQ(op->size(), og->size());
    for (size_t r = 0; r < op->size(); ++r)
      for (size_t f = 0; f < (*op)[r].frames.size(); ++f)
        ASSERT_EQ((*op)[r].frames[f].rgb, (*og)[r].frames[f].rgb) << "step " << step << " session " << r;
    ASSERT_TRUE(graphed->flush_writes().ok());
    ASSERT_TRUE(plain->flush_writes().ok());
  }
  const PluginBackend& pb = *graphed->device_plugin();
  const int64_t recorded = *pb.counter("graph.recorded"), failed = *pb.counter("graph.recordings_failed");
  const int64_t launches = *pb.counter("graph.launches");
  EXPECT_EQ(recorded + failed, steps) << "one recording a step";
  EXPECT_EQ(failed, 1) << "a batch larger than any before records too";
  EXPECT_EQ(launches, recorded * passes) << "a recorded step runs every denoising pass from the graph";
  // one executable graph per batch shape (1, 2, 3 sessions); a shape seen again is updated in place
  EXPECT_EQ(*pb.counter("graph.instantiated"), 3);
  EXPECT_EQ(*pb.counter("ffn.fused_calls") > 0, fused);
  // QuantWM-2's statistics: summed by the recorded passes too (a replay
  // that left them out would code the next blocks otherwise: other frames)
  EXPECT_EQ(*pb.counter("query.gram_launches") > 0, format == "quantwm2");
  std::printf("graphs (%s feed-forward): %lld steps recorded, %lld recordings failed, %lld instantiated, %lld "
              "launches\n",
              fused ? "fused" : "unfused", static_cast<long long>(recorded), static_cast<long long>(failed),
              static_cast<long long>(*pb.counter("graph.instantiated")), static_cast<long long>(launches));
  EXPECT_EQ(*plain->device_plugin()->counter("graph.launches"), 0);
}

TEST(CudaGraphs, RecordedPassesGiveTheSameFrames) {
  WM_REQUIRE_CUDA();
  expect_graphs_change_no_frame(/*fused=*/true, 8);
}

TEST(CudaGraphs, RecordedPassesGiveTheSameFramesUnfused) {
  WM_REQUIRE_CUDA();
  expect_graphs_change_no_frame(/*fused=*/false, 5);
}

// the quantized formats' denoising passes are recorded as fp16's are: their
// caches change only at the write pass, and QuantWM-2's query statistics
// are summed on the device by jobs uploaded before the recording
TEST(CudaGraphs, RecordedPassesOverQuantizedCachesGiveTheSameFrames) {
  WM_REQUIRE_CUDA();
  for (const char* format : {"qvg2", "kivi2", "quantwm2"}) expect_graphs_change_no_frame(/*fused=*/true, 5, format);
}

// batch-invariant sessions on a device: their frames bit for bit those they
// get stepped alone, in a batch with two sessions that are not, joining at
// different steps, the batch's steps with deferred writes and graphs (each
// attention call of a recorded pass is planned before the recording). Both
// engines plan as for a GPU of 5 SMs, which two sessions of this model fill
// (alone a session's query tile is 64 rows, in a call of two 128): the
// sessions that share a call round differently from their lone steps. Every session batch-invariant
// (EngineOptions::batch_invariant) is a device engine too, with "auto" as
// with "cuda"
TEST(CudaEndToEnd, BatchInvariantSessionsGiveTheFramesOfSteppingAlone) {
  WM_REQUIRE_CUDA();
  const std::string config = test::source_file("configs/default.json");
  auto alone = engine_on("cuda", config), batched = engine_on("cuda", config, true, /*graphs=*/true);
  ASSERT_NE(alone, nullptr);
  ASSERT_NE(batched, nullptr);
  const std::vector<std::pair<std::string, int64_t>> small_gpu = {{"attention.sms", 5},
                                                                  {"attention.min_tiles_per_split", 1}};
  Tuning ta(*alone->device_plugin(), small_gpu), tb(*batched->device_plugin(), small_gpu);
  const int B = alone->config().frames_per_block;
  std::vector<SessionId> ia, ib;
  for (int k = 0; k < 4; ++k) {
    SessionOptions so;
    so.seed = static_cast<uint64_t>(40 + k);
    ia.push_back(*alone->open_session(so));
    so.batch_invariant = k % 2 == 0;
    auto id = batched->open_session(so);
    ASSERT_TRUE(id.ok()) << id.status();
    ib.push_back(*id);
  }
  const int64_t plans0 = *batched->device_plugin()->counter("attention.plans");
  bool shared_differed = false;
  int64_t calls = 0;  // attention calls of the batched steps
  for (int step = 0; step < 6; ++step) {
    std::vector<StepRequest> reqs;
    std::vector<size_t> who;
    for (size_t k = 0; k < ib.size(); ++k) {
      if (step < static_cast<int>(k)) continue;  // session k joins at step k
      std::vector<Action> acts;
      for (int b = 0; b < B; ++b) acts.push_back(act(step * B + b + static_cast<int>(k)));
      reqs.push_back({ib[k], acts, {}});
      who.push_back(k);
    }
    auto res = batched->step(reqs, nullptr, /*keep_values=*/true);
    ASSERT_TRUE(res.ok()) << res.status();
    calls += std::count_if(who.begin(), who.end(), [](size_t k) { return k % 2 == 0; }) +
             (std::any_of(who.begin(), who.end(), [](size_t k) { return k % 2 == 1; }) ? 1 : 0);
    for (size_t r = 0; r < who.size(); ++r) {
      StepRequest one = reqs[r];
      one.session = ia[who[r]];
      auto ref = alone->step(std::span<const StepRequest>(&one, 1), nullptr, /*keep_values=*/true);
      ASSERT_TRUE(ref.ok()) << ref.status();
      if (who[r] % 2 == 1) {  // not asked: equal up to rounding
        for (size_t f = 0; f < (*ref)[0].frames.size(); ++f)
          shared_differed |= (*res)[r].frames[f].values != (*ref)[0].frames[f].values;
        continue;
      }
      ASSERT_EQ((*res)[r].frames.size(), (*ref)[0].frames.size());
      for (size_t f = 0; f < (*ref)[0].frames.size(); ++f) {
        ASSERT_EQ((*res)[r].frames[f].values, (*ref)[0].frames[f].values)
            << "session " << who[r] << " step " << step << " frame " << f;
        ASSERT_EQ((*res)[r].frames[f].rgb, (*ref)[0].frames[f].rgb);
      }
    }
  }
  EXPECT_TRUE(shared_differed) << "the shared session's batches were planned as its lone steps: the test shows nothing";
  const PluginBackend& pb = *batched->device_plugin();
  EXPECT_GT(*pb.counter("graph.launches"), 0) << "the batched engine's steps ran from graphs";
  // every call's plan and the batch's activation copies were prepared: only the very first
  // recording fails (it makes the RoPE table and the first copies), not those of the batches
  // that grew since
  EXPECT_EQ(*pb.counter("graph.recordings_failed"), 1);
  // a call planned once per step, or twice: with writes deferred, a step's write pass
  // runs at the start of the next, its calls planned before the appends
  EXPECT_GE(*pb.counter("attention.plans") - plans0, calls);
  EXPECT_LE(*pb.counter("attention.plans") - plans0, 2 * calls);
  ASSERT_TRUE(batched->flush_writes().ok());

  EngineOptions o;
  o.random_weights = true;
  o.random_seed = 3;
  o.config_path = config;
  o.cuda_plugin = test::cuda_plugin_path();
  o.kv_budget_bytes = int64_t{64} << 20;
  o.batch_invariant = true;
  for (const char* device : {"cuda", "auto"}) {
    o.device = device;
    auto e = Engine::create(o);
    ASSERT_TRUE(e.ok()) << device << ": " << e.status();
    EXPECT_EQ((*e)->device(), "cuda") << device;
    EXPECT_TRUE((*e)->all_batch_invariant());
  }
}

// a recording runs the ops once and again on demand: GELU twice
TEST(CudaGraphs, ARecordingRunsAgain) {
  WM_REQUIRE_CUDA();
  Backend &cpu = *backends().cpu, &cuda = *backends().cuda;
  const auto x = randn(1003, 21, 3.0f);
  Buffers cb(cpu), gb(cuda);
  float *xc = cb.put(x), *xg = gb.put(x);
  cpu.gelu(xc, 1003);
  cpu.gelu(xc, 1003);
  cuda.gelu(gb.zeros(1003), 1003);  // its bf16 copy's buffer grows now: a recording cannot grow one
  ASSERT_TRUE(cuda.graph_begin());
  cuda.gelu(xg, 1003);  // recorded: graph_end runs it once, graph_launch again
  ASSERT_TRUE(cuda.graph_end().ok());
  ASSERT_TRUE(cuda.graph_launch().ok());
  EXPECT_TRUE(close(cb.get(xc, 1003), gb.get(xg, 1003), {1e-5, 0, 1e-5}));
  ASSERT_TRUE(backends().cuda->status().ok()) << backends().cuda->status();
}

// an op a recording cannot hold (an upload) fails the recording: nothing of
// it ran, the backend reports no error afterwards and runs ops as before
TEST(CudaGraphs, AFailedRecordingRunsNothingAndHarmsNothing) {
  WM_REQUIRE_CUDA();
  Backend& cuda = *backends().cuda;
  const auto x = randn(257, 22, 2.0f), y = randn(64, 23);
  Buffers gb(cuda);
  float *xg = gb.put(x), *yg = gb.zeros(64);
  // a recording that succeeds first: the failed one must not leave it to run
  float* scratch = gb.zeros(257);
  cuda.gelu(scratch, 257);
  ASSERT_TRUE(cuda.graph_begin());
  cuda.gelu(scratch, 257);
  ASSERT_TRUE(cuda.graph_end().ok());
  const int64_t failed = counter("graph.recordings_failed");
  ASSERT_TRUE(cuda.graph_begin());
  EXPECT_FALSE(cuda.graph_begin()) << "one recording at a time";
  cuda.gelu(xg, 257);
  cuda.upload(yg, y.data(), y.size() * sizeof(float));
  std::vector<float> back(64, 5.0f);
  cuda.download(back.data(), yg, 64 * sizeof(float));  // refused as well: nothing to wait for yet
  EXPECT_EQ(back, std::vector<float>(64, 5.0f));
  const absl::Status ended = cuda.graph_end();
  EXPECT_EQ(ended.code(), absl::StatusCode::kFailedPrecondition) << ended;
  EXPECT_EQ(counter("graph.recordings_failed") - failed, 1);
  EXPECT_EQ(gb.get(xg, 257), x) << "nothing ran";
  EXPECT_EQ(gb.get(yg, 64), std::vector<float>(64, 0.0f));
  EXPECT_TRUE(backends().cuda->status().ok()) << backends().cuda->status();
  EXPECT_EQ(cuda.graph_end().code(), absl::StatusCode::kFailedPrecondition) << "no recording to end";
  EXPECT_EQ(cuda.graph_launch().code(), absl::StatusCode::kFailedPrecondition)
      << "after a failed recording no older graph runs in its place";
  cuda.upload(yg, y.data(), y.size() * sizeof(float));
  EXPECT_EQ(gb.get(yg, 64), y);
  ASSERT_TRUE(backends().cuda->status().ok()) << backends().cuda->status();
}

}  // namespace
}  // namespace wm
