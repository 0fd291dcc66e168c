#include "engine/model.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "engine/blas.h"

namespace wm {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// y[rows, out] = x[rows, in] W[out, in]^T + b: one GEMM over every frame of the batch
void host_linear(const std::vector<float>& w, const std::vector<float>& b, const float* x, int rows, int out, int in,
                 float* y) {
  for (int r = 0; r < rows; ++r) std::copy(b.begin(), b.end(), y + static_cast<size_t>(r) * out);
  blas::sgemm_nt(rows, out, in, 1.0f, x, in, w.data(), in, 1.0f, y, out);
}

inline float silu(float x) { return x / (1.0f + std::exp(-x)); }

enum Buf : size_t { kH = 0, kU, kQ, kK, kV, kAtt, kY, kF, kCount };

}  // namespace

Model::Model(Backend& backend, const ModelConfig& config, const HostWeights& weights)
    : backend_(backend), config_(config), weights_(backend, config, weights) {}

Model::~Model() {
  for (float* b : bufs_) backend_.free(b);
  if (mods_ != nullptr) backend_.free(mods_);
  if (pos_ != nullptr) backend_.free(pos_);
}

absl::Status Model::reserve(int tokens, int frames) {
  if (tokens <= capacity_tokens_ && frames <= capacity_frames_) return absl::OkStatus();
  for (float* b : bufs_) backend_.free(b);
  if (mods_ != nullptr) backend_.free(mods_);
  if (pos_ != nullptr) backend_.free(pos_);
  bufs_.clear();
  capacity_tokens_ = std::max(tokens, capacity_tokens_);
  capacity_frames_ = std::max(frames, capacity_frames_);
  const size_t n = static_cast<size_t>(capacity_tokens_);
  const size_t D = config_.dim, Q = config_.qkv_dim(), F = config_.ffn;
  const size_t widths[kCount] = {D, D, Q, Q, Q, Q, std::max(D, static_cast<size_t>(config_.patch_dim())), F};
  for (size_t i = 0; i < kCount; ++i) bufs_.push_back(static_cast<float*>(backend_.alloc(n * widths[i] * sizeof(float))));
  // every layer's [frames, 6D], the head's [frames, 2D], then e [frames, 6D]
  const size_t mod_floats = (static_cast<size_t>(config_.layers) * 6 + 2 + 6) * D * capacity_frames_;
  mods_ = static_cast<float*>(backend_.alloc(mod_floats * sizeof(float)));
  pos_ = static_cast<int32_t*>(backend_.alloc(n * 3 * sizeof(int32_t)));
  const bool failed = mods_ == nullptr || pos_ == nullptr ||
                      std::any_of(bufs_.begin(), bufs_.end(), [](const float* b) { return b == nullptr; });
  if (!failed) return absl::OkStatus();
  for (float* b : bufs_)
    if (b != nullptr) backend_.free(b);
  if (mods_ != nullptr) backend_.free(mods_);
  if (pos_ != nullptr) backend_.free(pos_);
  bufs_.clear();
  mods_ = nullptr;
  pos_ = nullptr;
  capacity_tokens_ = capacity_frames_ = 0;
  size_t bytes = (mod_floats + n * 3) * sizeof(float);
  for (size_t w : widths) bytes += n * w * sizeof(float);
  return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", bytes, " bytes of activations for ", tokens,
                                                   " tokens (", frames, " frames) on ", backend_.name()));
}

std::vector<int> Model::frame_groups(const ForwardInput& in) {
  const int frames = static_cast<int>(in.sigma.size());
  std::vector<int> groups;
  bool any_invariant = false, open = false;  // open: the last group takes more sessions
  int next = 0;
  for (const SessionSlice& s : in.sessions) {
    // sessions in batch order, back to back (the engine's batches are): else
    // one group, since there is nothing to split by
    if (s.batch_frame != next || s.frames <= 0) return {frames};
    any_invariant |= s.invariant;
    if (s.invariant || !open) {
      groups.push_back(s.frames);
    } else {
      groups.back() += s.frames;
    }
    open = !s.invariant;
    next += s.frames;
  }
  if (!any_invariant || next != frames) return {frames};
  return groups;
}

void Model::conditioning(const std::vector<float>& sigma, const std::vector<Action>& actions, float* c, float* e,
                         const std::vector<int>& group_frames) const {
  const int F = static_cast<int>(sigma.size()), D = config_.dim, half = config_.freq_dim / 2;
  const int A = config_.actions.input_width();
  const auto& w = weights_;
  // the noise-level branch once per distinct level (a pass's frames share theirs)
  std::vector<float> levels;
  std::vector<int> level_of(static_cast<size_t>(F));
  for (int f = 0; f < F; ++f) {
    const auto it = std::find(levels.begin(), levels.end(), sigma[static_cast<size_t>(f)]);
    level_of[static_cast<size_t>(f)] = static_cast<int>(it - levels.begin());
    if (it == levels.end()) levels.push_back(sigma[static_cast<size_t>(f)]);
  }
  const int U = static_cast<int>(levels.size());
  std::vector<float> temb(static_cast<size_t>(U) * config_.freq_dim), t1(static_cast<size_t>(F) * D);
  std::vector<float> tc(static_cast<size_t>(U) * D);
  for (int u = 0; u < U; ++u) {
    const double s = 1000.0 * levels[static_cast<size_t>(u)];
    float* row = temb.data() + static_cast<size_t>(u) * config_.freq_dim;
    for (int i = 0; i < half; ++i) {
      const double freq = std::exp(-std::log(10000.0) * i / half);
      row[i] = static_cast<float>(std::cos(s * freq));
      row[i + half] = static_cast<float>(std::sin(s * freq));
    }
  }
  // a level at a time: its numbers do not depend on the other levels present
  for (int u = 0; u < U; ++u) {
    const size_t o = static_cast<size_t>(u) * D;
    host_linear(w.time0_w, w.time0_b, temb.data() + static_cast<size_t>(u) * config_.freq_dim, 1, D,
                config_.freq_dim, t1.data() + o);
    for (int i = 0; i < D; ++i) t1[o + static_cast<size_t>(i)] = silu(t1[o + static_cast<size_t>(i)]);
    host_linear(w.time2_w, w.time2_b, t1.data() + o, 1, D, D, tc.data() + o);
  }
  // the frame-wise GEMMs group by group (groups: rows, in order)
  std::vector<int> groups = group_frames;
  if (groups.empty()) groups.push_back(F);
  auto grouped = [&](const std::vector<float>& wt, const std::vector<float>& b, const float* x, int out, int in,
                     float* y) {
    int f0 = 0;
    for (int g : groups) {
      host_linear(wt, b, x + static_cast<size_t>(f0) * in, g, out, in, y + static_cast<size_t>(f0) * out);
      f0 += g;
    }
  };
  // the action branch: the passes of a step embed the same actions, so the last result is kept
  std::vector<float> a_in(static_cast<size_t>(F) * A);
  for (int f = 0; f < F; ++f)
    config_.actions.embed_input(actions[static_cast<size_t>(f)], a_in.data() + static_cast<size_t>(f) * A);
  if (a_in != action_in_ || groups != action_groups_) {
    action_out_.assign(static_cast<size_t>(F) * D, 0.0f);
    grouped(w.action0_w, w.action0_b, a_in.data(), D, A, t1.data());
    for (float& x : t1) x = silu(x);
    grouped(w.action2_w, w.action2_b, t1.data(), D, D, action_out_.data());
    action_in_ = std::move(a_in);
    action_groups_ = groups;
  }
  for (int f = 0; f < F; ++f) {
    const float* t = tc.data() + static_cast<size_t>(level_of[static_cast<size_t>(f)]) * D;
    const float* a = action_out_.data() + static_cast<size_t>(f) * D;
    float* cf = c + static_cast<size_t>(f) * D;
    float* sf = t1.data() + static_cast<size_t>(f) * D;
    for (int i = 0; i < D; ++i) {
      cf[i] = t[i] + a[i];
      sf[i] = silu(cf[i]);
    }
  }
  grouped(w.cond_w, w.cond_b, t1.data(), 6 * D, D, e);
}

absl::Status Model::forward(const ForwardInput& in, float* out, OpTimes* times, const TraceFn* trace) {
  WM_RETURN_IF_ERROR(prepare_forward(in, times, trace));
  return run_forward(in, out, times, trace);
}

absl::Status Model::prepare_forward(const ForwardInput& in, OpTimes* times, const TraceFn* trace) {
  const ModelConfig& c = config_;
  const int frames = static_cast<int>(in.sigma.size());
  const int T = c.tokens_per_frame(), N = frames * T, D = c.dim, L = c.layers;
  if (in.actions.size() != static_cast<size_t>(frames) || in.frame_index.size() != static_cast<size_t>(frames))
    return absl::InvalidArgumentError("forward: sigma, actions and frame_index differ in length");
  WM_RETURN_IF_ERROR(reserve(N, frames));
  OpTimes local;
  OpTimes& tm = times != nullptr ? *times : local;
  auto t0 = Clock::now();

  // the conditioning on the host (small MLPs), then one upload: the head's
  // modulation [frames, 2D] and e [frames, 6D], which run_forward adds to
  // every layer's modulation on the backend (L times the bytes otherwise)
  const size_t per_layer = static_cast<size_t>(frames) * 6 * D;
  std::vector<float> cond(static_cast<size_t>(frames) * D);
  std::vector<float> tail(static_cast<size_t>(frames) * 2 * D + per_layer);  // head modulation, then e
  float* e = tail.data() + static_cast<size_t>(frames) * 2 * D;
  conditioning(in.sigma, in.actions, cond.data(), e, frame_groups(in));
  for (int f = 0; f < frames; ++f) {
    const float* cf = cond.data() + static_cast<size_t>(f) * D;
    float* hm = tail.data() + static_cast<size_t>(f) * 2 * D;
    for (int i = 0; i < 2 * D; ++i) hm[i] = weights_.head_modulation[static_cast<size_t>(i)] + cf[i % D];
  }
  if (trace != nullptr) (*trace)("cond", cond.data(), static_cast<int64_t>(cond.size()));
  backend_.upload(mods_ + per_layer * L, tail.data(), tail.size() * sizeof(float));
  std::vector<int32_t> pos(static_cast<size_t>(N) * 3);
  for (int f = 0; f < frames; ++f)
    for (int n = 0; n < T; ++n) {
      int32_t* p = pos.data() + (static_cast<size_t>(f) * T + n) * 3;
      p[0] = static_cast<int32_t>(in.frame_index[static_cast<size_t>(f)]);
      p[1] = n / c.grid_w();
      p[2] = n % c.grid_w();
    }
  backend_.upload(pos_, pos.data(), pos.size() * sizeof(int32_t));
  tm.other += seconds_since(t0);
  return absl::OkStatus();
}

absl::Status Model::run_forward(const ForwardInput& in, float* out, OpTimes* times, const TraceFn* trace) {
  const ModelConfig& c = config_;
  const int frames = static_cast<int>(in.sigma.size());
  const int T = c.tokens_per_frame(), N = frames * T, D = c.dim, Q = c.qkv_dim(), H = c.heads, Dh = c.head_dim;
  const int L = c.layers, P = c.patch_dim();
  if (N > capacity_tokens_ || frames > capacity_frames_)
    return absl::FailedPreconditionError("run_forward: prepare_forward was not called for this batch");
  const size_t per_layer = static_cast<size_t>(frames) * 6 * D;
  OpTimes local;
  OpTimes& tm = times != nullptr ? *times : local;
  auto t0 = Clock::now();
  // every layer's modulation: e (uploaded behind the head's) + the layer's own
  backend_.add_rows(mods_ + per_layer * L + static_cast<size_t>(frames) * 2 * D, weights_.modulation, frames, L,
                    6 * D, mods_);
  tm.other += seconds_since(t0);

  float *h = buf(kH), *u = buf(kU), *q = buf(kQ), *k = buf(kK), *v = buf(kV), *att = buf(kAtt), *y = buf(kY),
        *ff = buf(kF);
  const RopeParams rope{c.rope_theta, c.t_pairs, c.h_pairs, c.w_pairs};
  const int stride6 = 6 * D;
  std::vector<float> host_trace;
  auto emit = [&](absl::string_view name, const float* dev, int64_t count) {
    if (trace == nullptr) return;
    host_trace.resize(static_cast<size_t>(count));
    backend_.download(host_trace.data(), dev, static_cast<size_t>(count) * sizeof(float));
    (*trace)(name, host_trace.data(), count);
  };

  std::vector<int64_t> first_frames;  // the write pass: each session's first frame
  for (const SessionSlice& s : in.sessions)
    first_frames.push_back(in.frame_index[static_cast<size_t>(s.batch_frame)]);
  // the dense ops (GEMMs) over the batch's rows: in one call, or one per
  // session when batch-invariant (a GEMM's rounding may depend on its rows)
  std::vector<std::pair<int, int>> row_groups;  // first row, rows
  for (int f0 = 0; int g : frame_groups(in)) {
    row_groups.emplace_back(f0 * T, g * T);
    f0 += g;
  }
  auto dense = [&](const LinearWeight& w, const float* x, float* y) {
    for (const auto& [r0, n] : row_groups)
      backend_.linear(w, x + static_cast<size_t>(r0) * w.in, n, y + static_cast<size_t>(r0) * w.out);
  };
  t0 = Clock::now();
  dense(weights_.patch_embed, in.tokens, h);
  tm.gemm += seconds_since(t0);
  const float* head_mod = mods_ + per_layer * L;
  // layer 0's first norm; every later norm runs fused with the residual add before it
  t0 = Clock::now();
  backend_.layer_norm_modulate(h, N, D, mods_, mods_ + D, stride6, T, c.norm_eps, u);
  tm.other += seconds_since(t0);
  for (int l = 0; l < L; ++l) {
    const LayerWeights& lw = weights_.layers[static_cast<size_t>(l)];
    const float* m = mods_ + per_layer * l;
    t0 = Clock::now();
    dense(lw.q, u, q);
    dense(lw.k, u, k);
    dense(lw.v, u, v);
    tm.gemm += seconds_since(t0);
    t0 = Clock::now();
    backend_.rms_norm_rope_qk(q, lw.q_norm, k, lw.k_norm, N, H, Dh, Q, pos_, rope, c.norm_eps);
    tm.other += seconds_since(t0);
    t0 = Clock::now();
    backend_.attention(l, in.sessions, T, q, k, v, att);
    tm.attention += seconds_since(t0);
    if (in.write_pass) {
      t0 = Clock::now();
      WM_RETURN_IF_ERROR(backend_.kv_append(l, in.sessions, first_frames, T, k, v));
      tm.other += seconds_since(t0);
      // the last layer's output feeds nothing once its K/V are cached
      if (l == L - 1) break;
    }
    t0 = Clock::now();
    dense(lw.o, att, y);
    tm.gemm += seconds_since(t0);
    t0 = Clock::now();
    backend_.gated_residual_norm(h, y, m + 2 * D, stride6, N, D, T, m + 3 * D, m + 4 * D, stride6, c.norm_eps, u);
    tm.other += seconds_since(t0);
    t0 = Clock::now();
    for (const auto& [r0, n] : row_groups)
      backend_.ffn(lw.ffn0, lw.ffn2, u + static_cast<size_t>(r0) * D, n, ff + static_cast<size_t>(r0) * lw.ffn0.out,
                   y + static_cast<size_t>(r0) * D);
    tm.gemm += seconds_since(t0);
    // the residual, then the next norm: the next layer's first, or the head's
    t0 = Clock::now();
    if (l + 1 < L) {
      const float* next = m + per_layer;
      backend_.gated_residual_norm(h, y, m + 5 * D, stride6, N, D, T, next, next + D, stride6, c.norm_eps, u);
    } else {
      backend_.gated_residual_norm(h, y, m + 5 * D, stride6, N, D, T, head_mod, head_mod + D, 2 * D, c.norm_eps, u);
    }
    tm.other += seconds_since(t0);
    emit(absl::StrCat("layer", l), h, static_cast<int64_t>(N) * D);
  }
  if (in.write_pass) return absl::OkStatus();
  t0 = Clock::now();
  dense(weights_.head, u, out);
  tm.gemm += seconds_since(t0);
  emit("velocity", out, static_cast<int64_t>(N) * P);
  return absl::OkStatus();
}

KvGeometry kv_geometry_of(const ModelConfig& c) {
  KvGeometry g;
  g.layers = c.layers;
  g.heads = c.heads;
  g.head_dim = c.head_dim;
  g.tokens_per_frame = c.tokens_per_frame();
  g.window_frames = c.window_frames;
  g.sink_frames = c.sink_frames;
  g.frames_per_block = c.frames_per_block;
  return g;
}

}  // namespace wm
