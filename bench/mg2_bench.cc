// The Matrix-Game-2-shaped model (configs/mg2-shape.json: 30 layers, dim 1536,
// 12 x 128 heads, FFN 8960, 880 tokens per latent frame, 3 frames per block,
// 3 denoising steps + the cache-write pass) with random weights, on the
// backend under test, for a grid of sessions x window. One JSON line per
// configuration: forward and block time, video frames/s (one latent frame =
// 4 video frames, one block = 12), KV bytes per session; the same fields as
// ../shared/research/torch_mg2_step.py, which tools/gpu-run.sh runs beside it.
//
// On a device it also times every layer's attention alone over the same
// sessions and caches: attention_ms_per_forward, its share and TFLOP/s;
// every layer's dense ops (the four projections and the feed-forward block
// with their operands' bf16 copies as the forward has them):
// dense_ms_per_forward, its share and TFLOP/s; the two residual norms of
// every layer alone (residual_norms_ms_per_forward); what is left of a
// forward (other_ms_per_forward: the norms, modulation, RoPE, the
// attention's input conversion, the head); and a forward run from a
// recorded CUDA graph (forward_ms_graph).
//
// A block is what Engine::step does on the device: 3 x (forward + Euler),
// unpatchify, the frames' download, then the write pass. The caches are
// filled to the window with random K/V first (the write path, not a forward
// per frame). The host-side conditioning and uploads are inside the timings.
//
// With --batch_invariant=1 every session is batch-invariant
// (SessionOptions::batch_invariant): its GEMMs and, on a device, its
// attention run on their own; what that costs against the shared batch.
// --format: the sessions' cache format (fp16 by default; kivi2, qvg2,
// quantwm2: their attention and their write pass, whose coding
// write_pass_ms shows: the mean over the blocks, and the shortest and the
// longest, which for QuantWM-2 is the first, where its PSAC bases are made).
//
//   mg2_bench [--device=cuda|cpu] [--plugin=PATH] [--config=configs/mg2-shape.json]
//             [--sessions=1,2,4,8] [--windows=6,60] [--reps=3] [--blocks=2] [--batch_invariant=0|1]
//             [--format=fp16|kivi2|qvg2|quantwm2] [--tuning=key=value,...]
//
// --tuning sets plugin tunings (docs/CUDA.md) for the whole run, e.g.
// --tuning=attention.fused_inputs=0 to time a setting against the default.
#include <algorithm>
#include <array>
#include <cstdio>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>

#include "bench/bench_util.h"
#include "engine/model.h"
#include "engine/model_config.h"

namespace wm::bench {
namespace {

int run(int argc, char** argv) {
  // every flag first, so that a bad one is refused before the model config is read or the device opens
  Flags f(argc, argv);
  const DeviceFlags device_flags = read_device_flags(f);
  const std::string config_path = f.str("config", "configs/mg2-shape.json");
  // bounded so that the KV pool's bytes (sessions x layers x heads x window pages) fit an int64_t
  const std::vector<int> sessions = f.list("sessions", "1,2,4,8", 1, 256);
  const std::vector<int> windows = f.list("windows", "6,60", 1, 10000);  // latent frames
  const int reps = static_cast<int>(f.num("reps", 3, 1, 100000));
  const int block_reps = static_cast<int>(f.num("blocks", 2, 1, 100000));
  const bool invariant = f.num("batch_invariant", 0, 0, 1) != 0;
  const std::string format = f.str("format", "fp16");
  const std::string tuning_spec = f.str("tuning", "");
  const uint64_t seed = static_cast<uint64_t>(f.num("seed", 1, 0, std::numeric_limits<int64_t>::max()));
  f.reject_unknown();

  auto cfg_or = load_model_config(config_path);
  if (!cfg_or.ok()) {
    std::fprintf(stderr, "%s\n", cfg_or.status().ToString().c_str());
    return 1;
  }
  const ModelConfig cfg = *cfg_or;
  // a window holds at least a block, as a config's own window must (model_config.cc)
  for (int W : windows)
    if (W < cfg.frames_per_block) {
      std::fprintf(stderr, "wm_mg2_bench: --windows=%d: expected windows of at least %d latent frames (%s's block)\n",
                   W, cfg.frames_per_block, config_path.c_str());
      return 2;
    }
  const int T = cfg.tokens_per_frame(), B = cfg.frames_per_block, D = cfg.dim, L = cfg.layers;
  const int64_t Q = cfg.qkv_dim();

  // the pool holds the largest grid point that fits the device: where one does not (8 sessions at
  // window 60 hold 78 GB of cache, more than an H100 has beside the model), the points whose caches
  // would not fit are left out, each with a line that says so
  const int64_t page_bytes = int64_t{64} << 10, page_tokens = page_bytes / (4 * cfg.head_dim);
  auto pool_for = [&](int S, int W) {
    const int64_t pages_per_head = (static_cast<int64_t>(W + cfg.sink_frames) * T + page_tokens - 1) / page_tokens;
    return S * L * cfg.heads * pages_per_head * page_bytes;
  };
  int64_t pool = 0;
  for (int W : windows)
    for (int S : sessions) pool = std::max(pool, pool_for(S, W));
  Device dev;
  for (;;) {
    auto d = try_open_device(device_flags, pool, cfg.parameter_count() * 2);
    int64_t smaller = 0;  // the next smaller grid point's pool
    for (int W : windows)
      for (int S : sessions)
        if (pool_for(S, W) < pool) smaller = std::max(smaller, pool_for(S, W));
    if (d.ok()) {
      dev = std::move(*d);
      break;
    }
    if (d.status().code() != absl::StatusCode::kResourceExhausted || smaller == 0) {
      std::fprintf(stderr, "no CUDA backend: %s\n", d.status().ToString().c_str());
      return 2;
    }
    std::fprintf(stderr, "a KV pool of %lld bytes does not fit (%s): trying %lld\n", static_cast<long long>(pool),
                 d.status().ToString().c_str(), static_cast<long long>(smaller));
    pool = smaller;
  }
  auto tuning = apply_tuning(tuning_spec, dev);
  if (!tuning.ok()) {
    std::fprintf(stderr, "%s\n", tuning.status().ToString().c_str());
    return 1;
  }
  Backend& b = *dev.backend;
  double t0 = now_s();
  HostWeights weights = fast_random_weights(cfg, seed);
  const double weights_s = now_s() - t0;
  t0 = now_s();
  auto model = std::make_unique<Model>(b, cfg, weights);
  dev.sync();
  const double upload_s = now_s() - t0;
  weights = HostWeights{};  // the device holds them now
  nlohmann::json head = {{"bench", "mg2_setup"},      {"device", dev.name},
                         {"params_M", cfg.parameter_count() / 1e6}, {"layers", L},
                         {"dim", D},                  {"tokens_per_frame", T},
                         {"frames_per_block", B},     {"random_weights_s", std::round(weights_s * 100) / 100},
                         {"upload_s", std::round(upload_s * 100) / 100}, {"kv_pool_bytes", pool},
                         {"tuning", *tuning}};
  if (dev.plugin != nullptr) {
    const BackendMemory m = b.memory();
    head["device_total_bytes"] = m.device_total;
    head["device_free_bytes"] = m.device_free;
  }
  std::printf("%s\n", head.dump().c_str());
  std::fflush(stdout);

  // one layer's dense weights, for timing the dense ops alone (below): uploaded once, since the
  // backend keeps its weights as long as it lives
  const int64_t F = cfg.ffn;
  auto upload_dense_weights = [&] {
    uint32_t lcg = 12345;
    auto weight = [&](int out, int in) {
      std::vector<float> w(static_cast<size_t>(out) * in);
      for (float& x : w) x = static_cast<float>((lcg = lcg * 1664525u + 1013904223u) >> 8) * 0x1p-24f * 0.04f - 0.02f;
      LinearWeight lw;
      lw.w = b.upload_weight(w.data(), out, in);
      lw.out = out;
      lw.in = in;
      return lw;
    };
    return std::array<LinearWeight, 6>{weight(static_cast<int>(Q), D), weight(static_cast<int>(Q), D),
                                       weight(static_cast<int>(Q), D), weight(D, static_cast<int>(Q)),
                                       weight(static_cast<int>(F), D), weight(D, static_cast<int>(F))};
  };
  std::optional<std::array<LinearWeight, 6>> dense_weights;  // q, k, v, o, ffn0, ffn2

  std::mt19937 rng(7);
  std::normal_distribution<float> nd;
  for (int W : windows)
    for (int S : sessions) {
      if (pool_for(S, W) > pool) {
        const nlohmann::json skipped = {{"bench", "mg2"},
                                        {"device", dev.name},
                                        {"sessions_batched", S},
                                        {"window_latent_frames", W},
                                        {"skipped", "the KV pool does not fit the device"},
                                        {"kv_pool_bytes_needed", pool_for(S, W)}};
        std::printf("%s\n", skipped.dump().c_str());
        std::fflush(stdout);
        continue;
      }
      KvGeometry g;
      g.layers = L;
      g.heads = cfg.heads;
      g.head_dim = cfg.head_dim;
      g.tokens_per_frame = T;
      g.window_frames = W;
      g.sink_frames = cfg.sink_frames;
      g.frames_per_block = B;
      const int frames = S * B;
      const int64_t fv = cfg.frame_values();
      DeviceArrays arrays(b);
      auto put = [&](const std::vector<float>& h) { return arrays.put(h); };
      std::vector<float> host_kv(static_cast<size_t>(B) * T * Q);
      for (float& x : host_kv) x = nd(rng);
      float* kv = put(host_kv);
      std::vector<std::unique_ptr<KvCache>> caches;
      for (int s = 0; s < S; ++s) {
        auto c = b.make_kv_cache(format, g, KvFormatOptions{});
        if (!c.ok()) {
          std::fprintf(stderr, "cache: %s\n", c.status().ToString().c_str());
          return 1;
        }
        for (int fr = 0; fr < W; fr += B)
          for (int l = 0; l < L; ++l) {
            const absl::Status st = (*c)->append(l, kv, kv, fr, std::min(B, W - fr));
            if (!st.ok()) {
              std::fprintf(stderr, "append: %s\n", st.ToString().c_str());
              return 1;
            }
          }
        caches.push_back(std::move(*c));
      }
      std::vector<float> host_noise(static_cast<size_t>(frames) * fv);
      for (float& x : host_noise) x = nd(rng);
      float* pixels = put(host_noise);
      float* x = put(std::vector<float>(host_noise.size(), 0.0f));
      float* vel = put(std::vector<float>(host_noise.size(), 0.0f));
      float* dt = put(std::vector<float>(static_cast<size_t>(frames), 0.0f));
      const FrameShape shape{cfg.height, cfg.width, cfg.channels, cfg.patch};
      std::vector<int64_t> generated(static_cast<size_t>(S), W);
      auto input = [&](float sigma, bool write) {
        ForwardInput in;
        in.tokens = x;
        in.write_pass = write;
        for (int s = 0; s < S; ++s) {
          in.sessions.push_back({caches[static_cast<size_t>(s)].get(), s * B, B, invariant});
          for (int k = 0; k < B; ++k) {
            Action a;
            a.keys = 1u << (k % 4);
            in.actions.push_back(a);
            in.sigma.push_back(sigma);
            in.frame_index.push_back(generated[static_cast<size_t>(s)] + k);
          }
        }
        return in;
      };
      b.patchify(pixels, frames, shape, x);
      // warm-up: workspaces and GEMM plans for this batch size
      if (!model->forward(input(cfg.sigmas[0], false), vel, nullptr).ok()) return 1;
      dev.sync();
      t0 = now_s();
      for (int r = 0; r < reps; ++r)
        if (!model->forward(input(cfg.sigmas[0], false), vel, nullptr).ok()) return 1;
      dev.sync();
      const double forward_s = (now_s() - t0) / reps;
      std::vector<float> host_frames(host_noise.size());
      auto count = [&](const char* name) -> int64_t {
        if (dev.plugin == nullptr) return 0;
        auto v = dev.plugin->counter(name);
        return v.ok() ? *v : -1;
      };
      const int64_t plans0 = count("attention.plans"), fallback0 = count("gemm.fallback_calls");
      const int64_t ffn0 = count("ffn.fused_calls"), inputs0 = count("attention.fused_input_calls"),
                    out16_0 = count("attention.bf16_output_calls");
      const int64_t downloads0 = count("query.gram_downloads");
      const int64_t span_host0 = count("kv.span_append_host_us"), span_wait0 = count("kv.span_append_wait_us");
      double write_s = 0;  // the write passes' part (their coding, for a quantized format)
      double write_min_s = 1e30, write_max_s = 0;  // one that refreshes QuantWM-2's bases is the longest
      t0 = now_s();
      for (int r = 0; r < block_reps; ++r) {
        b.upload(pixels, host_noise.data(), host_noise.size() * sizeof(float));
        b.patchify(pixels, frames, shape, x);
        for (size_t i = 0; i < cfg.sigmas.size(); ++i) {
          if (!model->forward(input(cfg.sigmas[i], false), vel, nullptr).ok()) return 1;
          const float next = i + 1 < cfg.sigmas.size() ? cfg.sigmas[i + 1] : 0.0f;
          const std::vector<float> step(static_cast<size_t>(frames), next - cfg.sigmas[i]);
          b.upload(dt, step.data(), step.size() * sizeof(float));
          b.euler_step(x, vel, dt, frames, fv, i + 1 == cfg.sigmas.size());
        }
        b.unpatchify(x, frames, shape, pixels);
        b.download(host_frames.data(), pixels, host_frames.size() * sizeof(float));
        const double w0 = now_s();
        const absl::Status st = model->forward(input(0.0f, true), nullptr, nullptr);
        if (!st.ok()) {
          std::fprintf(stderr, "write pass: %s\n", st.ToString().c_str());
          return 1;
        }
        dev.sync();
        write_s += now_s() - w0;
        write_min_s = std::min(write_min_s, now_s() - w0);
        write_max_s = std::max(write_max_s, now_s() - w0);
        for (int64_t& gen : generated) gen += B;
      }
      dev.sync();
      const double block_s = (now_s() - t0) / block_reps;
      const double video_frames = 4.0 * B;  // one latent frame decodes to 4 video frames
      const int64_t kv_values_bytes = static_cast<int64_t>(L) * 2 * W * T * Q * 2;
      nlohmann::json j = {{"bench", "mg2"},
                          {"device", dev.name},
                          {"format", format},
                          {"sessions_batched", S},
                          {"window_latent_frames", W},
                          {"batch_invariant", invariant},
                          {"forward_ms", std::round(forward_s * 1e5) / 100},
                          {"block_ms", std::round(block_s * 1e4) / 10},
                          {"write_pass_ms", std::round(write_s / block_reps * 1e4) / 10},
                          {"write_pass_ms_min", std::round(write_min_s * 1e4) / 10},
                          {"write_pass_ms_max", std::round(write_max_s * 1e4) / 10},
                          {"fps_per_session", std::round(video_frames / block_s * 100) / 100},
                          {"fps_aggregate", std::round(video_frames * S / block_s * 10) / 10},
                          {"kv_bytes_per_session_device", caches[0]->bytes().total()},
                          {"kv_gb_per_session_fp16", std::round(kv_values_bytes / 1e6) / 1e3}};
      if (dev.plugin != nullptr) {
        const BackendMemory m = b.memory();
        // once per block is the design (docs/CUDA.md); fallback GEMMs would be a slow path
        j["attention_plans_per_block"] = static_cast<double>(count("attention.plans") - plans0) / block_reps;
        j["gemm_fallback_calls"] = count("gemm.fallback_calls") - fallback0;
        // QuantWM-2: the layers whose write pass stopped for the query statistics (a new PSAC basis)
        j["statistics_downloads_per_block"] = static_cast<double>(count("query.gram_downloads") - downloads0) / block_reps;
        // the span formats: the host's time inside the write pass's appends per block, and of that the
        // waits for the device (the statistics' downloads, the coder's checks). The rest (bookkeeping,
        // PSAC bases, the coder's jobs) runs while the device has queued work, except after a wait
        if (format == "qvg2" || format == "quantwm2") {
          j["span_append_host_ms_per_block"] =
              std::round(static_cast<double>(count("kv.span_append_host_us") - span_host0) / block_reps / 100) / 10;
          j["span_append_wait_ms_per_block"] =
              std::round(static_cast<double>(count("kv.span_append_wait_us") - span_wait0) / block_reps / 100) / 10;
        }
        // feed-forward blocks with the GELU in the GEMM epilogue (every layer of every forward but
        // the write pass's last), and the forward without that fusion
        j["ffn_fused_per_block"] = static_cast<double>(count("ffn.fused_calls") - ffn0) / block_reps;
        // attention calls whose q and k the RoPE wrote in fp16 (every attention call of a forward
        // but a batch-invariant session's, which lays out its own rows)
        j["attention_fused_inputs_per_block"] =
            static_cast<double>(count("attention.fused_input_calls") - inputs0) / block_reps;
        // attention calls that wrote the output projection's bf16 operand (one a layer and forward
        // where no session is batch-invariant: a call that writes only some rows leaves it)
        j["attention_bf16_outputs_per_block"] =
            static_cast<double>(count("attention.bf16_output_calls") - out16_0) / block_reps;
        // one forward's seconds with tuning KEY at VALUE (after one untimed forward; then KEY back to
        // BACK), where --tuning left KEY alone: 0 where not timed (KEY named by --tuning, or refused),
        // -1 where a forward failed. One session only: a fusion saves a share of each layer's traffic
        // at any batch, and the GPU check's stage has a time limit.
        auto forward_with = [&](const char* key, int64_t value, int64_t back) -> double {
          if (S != 1 || tuning->find(std::string(key) + "=") != std::string::npos) return 0;
          if (!dev.plugin->set_tuning(key, value).ok()) return 0;
          if (!model->forward(input(cfg.sigmas[0], false), vel, nullptr).ok()) return -1;
          dev.sync();
          const double u0 = now_s();
          for (int r = 0; r < reps; ++r)
            if (!model->forward(input(cfg.sigmas[0], false), vel, nullptr).ok()) return -1;
          dev.sync();
          const double secs = (now_s() - u0) / reps;
          return dev.plugin->set_tuning(key, back).ok() ? secs : -1;
        };
        // the forward with a fusion switched off (tuning KEY 0, then back to 1): its time and the
        // fusion's speedup
        auto without = [&](const char* key, const char* ms_field, const char* speedup_field) -> bool {
          const double off_s = forward_with(key, 0, 1);
          if (off_s > 0) {
            j[ms_field] = std::round(off_s * 1e5) / 100;
            j[speedup_field] = std::round(off_s / forward_s * 1000) / 1000;
          }
          return off_s >= 0;
        };
        // and with the GEMMs' algorithms timed (gemm.autotune, off by default): its untimed forward
        // times each plan's candidates, the timed ones run the choice; back off, the plans are the
        // heuristic's again
        {
          const int64_t plans0 = count("gemm.autotuned_plans"), changes0 = count("gemm.autotune_changes");
          const double tuned_s = forward_with("gemm.autotune", 1, 0);
          if (tuned_s < 0) return 1;
          if (tuned_s > 0) {
            j["forward_ms_gemm_autotuned"] = std::round(tuned_s * 1e5) / 100;
            j["gemm_autotune_speedup"] = std::round(forward_s / tuned_s * 1000) / 1000;
            j["gemm_autotuned_plans"] = count("gemm.autotuned_plans") - plans0;
            j["gemm_autotune_changes"] = count("gemm.autotune_changes") - changes0;
          }
        }
        if (!without("ffn.fused", "forward_ms_ffn_unfused", "ffn_fusion_speedup")) return 1;
        if (!without("attention.fused_inputs", "forward_ms_inputs_unfused", "inputs_fusion_speedup")) return 1;
        if (!without("attention.bf16_output", "forward_ms_output_unfused", "output_fusion_speedup")) return 1;
        // a denoising forward run from a recorded graph (EngineOptions::device_graphs): the host's
        // part, then one graph launch instead of the ops
        {
          const ForwardInput gin = input(cfg.sigmas[0], false);
          bool recorded = model->prepare_forward(gin, nullptr).ok() && b.prepare_recording(gin.sessions, T) &&
                          b.graph_begin();
          if (recorded) {
            const absl::Status pass = model->run_forward(gin, vel, nullptr);
            recorded = b.graph_end(pass.ok()).ok() && pass.ok();
          }
          if (recorded) {
            dev.sync();
            const double g0 = now_s();
            for (int r = 0; r < reps; ++r)
              if (!model->prepare_forward(gin, nullptr).ok() || !b.graph_launch().ok()) return 1;
            dev.sync();
            const double graph_s = (now_s() - g0) / reps;
            j["forward_ms_graph"] = std::round(graph_s * 1e5) / 100;
            j["graph_speedup"] = std::round(forward_s / graph_s * 1000) / 1000;
          } else {
            j["forward_ms_graph"] = nullptr;  // the recording failed: the ops ran as usual
          }
        }
        j["device_used_bytes"] = m.device_total - m.device_free;
        j["kv_pool_used_bytes"] = m.kv_pool_used;
        // where a forward's time goes: every layer's attention alone, same sessions, caches and kernel
        const size_t vals = static_cast<size_t>(frames) * T * Q;
        const std::vector<float> filler(vals, 0.5f);  // the timing does not depend on the values
        float* aq = put(filler);
        float* ak = put(filler);
        float* av = put(filler);
        float* ao = put(filler);
        std::vector<SessionSlice> slices;
        for (int s = 0; s < S; ++s) slices.push_back({caches[static_cast<size_t>(s)].get(), s * B, B});
        b.attention(0, slices, T, aq, ak, av, ao);
        dev.sync();
        const std::string kernel = dev.plugin->attention_kernel(cfg.head_dim);
        if (dev.plugin->timer_start().ok()) {
          for (int r = 0; r < reps; ++r)
            for (int l = 0; l < L; ++l) b.attention(l, slices, T, aq, ak, av, ao);
          const double ms = dev.plugin->timer_stop_ms().value_or(-1.0) / reps;
          const double keys = static_cast<double>(W) * T + static_cast<double>(B) * T;  // cache + own block
          const double flops = 4.0 * L * S * cfg.heads * (static_cast<double>(B) * T) * keys * cfg.head_dim;
          j["attention_ms_per_forward"] = std::round(ms * 100) / 100;
          j["attention_share_of_forward"] = std::round(ms / (forward_s * 1e3) * 1000) / 1000;
          j["attention_TFLOPs"] = std::round(flops / (ms / 1e3) / 1e11) / 10;
          j["attention_kernel"] = kernel;
          if (kernel == "overlap" || kernel == "ws") {
            // Matrix-Game-2's 2640-query blocks run 128-query tiles
            j["attention_stages"] = count(kernel == "ws" ? "attention.ws_stages.block_q_128" : "attention.stages");
            j["attention_pingpong"] = count("attention.pingpong");
          }
          if (kernel == "ws") {
            j["attention_ws_keys"] = count("attention.ws_keys.block_q_128");
            j["attention_ws_tma"] = count("attention.ws_tma");
          }
        }
        // and every layer's dense ops, at the forward's rows: the q, k, v and output projections and
        // the feed-forward block, with their operands' bf16 copies as the forward has them (the
        // residual norms write the projections' and the feed-forward's as they normalise; the
        // attention's output is converted). Timed as the layer's sequence with its two residual norms,
        // less the norms alone. What neither these nor the attention take is the rest of a forward:
        // the norms, modulation, RoPE, the attention's input conversion, the conditioning, the head.
        const int64_t rows = static_cast<int64_t>(frames) * T;
        if (!dense_weights) dense_weights = upload_dense_weights();
        const auto& [wq, wk, wv, wo, w0, w2] = *dense_weights;
        const std::vector<float> rows_d(static_cast<size_t>(rows) * D, 0.5f), rows_q(static_cast<size_t>(rows) * Q, 0.5f);
        float* dh = put(rows_d);  // the residual stream
        float* du = put(rows_d);  // the norms' output: the projections' and the feed-forward block's input
        float* att = put(rows_q);
        float* dq = put(rows_q);
        float* dk = put(rows_q);
        float* dv = put(rows_q);
        float* dy = put(rows_d);
        float* hidden = put(std::vector<float>(static_cast<size_t>(rows) * F, 0.0f));
        // gate, shift and scale rows of each frame, as the modulation holds them
        float* mods = put(std::vector<float>(static_cast<size_t>(frames) * 6 * D, 0.01f));
        const int n = static_cast<int>(rows);
        auto norm = [&] { b.gated_residual_norm(dh, dy, mods, 6 * D, n, D, T, mods + D, mods + 2 * D, 6 * D, 1e-6f, du); };
        auto dense_layer = [&] {
          norm();
          b.linear(wq, du, n, dq);
          b.linear(wk, du, n, dk);
          b.linear(wv, du, n, dv);
          b.linear(wo, att, n, dy);
          norm();
          b.ffn(w0, w2, du, n, hidden, dy);
        };
        auto timed = [&](const auto& layer) {
          layer();
          dev.sync();
          if (!dev.plugin->timer_start().ok()) return -1.0;
          for (int r = 0; r < reps; ++r)
            for (int l = 0; l < L; ++l) layer();
          return dev.plugin->timer_stop_ms().value_or(-1.0) / reps;
        };
        const double with_norms = timed(dense_layer), norms = timed([&] {
          norm();
          norm();
        });
        if (with_norms >= 0 && norms >= 0) {
          const double ms = with_norms - norms;
          const double flops = 2.0 * L * static_cast<double>(rows) * (4.0 * D * Q + 2.0 * D * F);
          j["dense_ms_per_forward"] = std::round(ms * 100) / 100;
          j["dense_share_of_forward"] = std::round(ms / (forward_s * 1e3) * 1000) / 1000;
          j["dense_TFLOPs"] = std::round(flops / (ms / 1e3) / 1e11) / 10;
          j["residual_norms_ms_per_forward"] = std::round(norms * 100) / 100;  // part of the rest below
          if (j.contains("attention_ms_per_forward"))
            j["other_ms_per_forward"] =
                std::round((forward_s * 1e3 - ms - j["attention_ms_per_forward"].get<double>()) * 100) / 100;
        }
      }
      std::printf("%s\n", j.dump().c_str());
      std::fflush(stdout);
      caches.clear();
      dev.sync();
    }
  return dev.exit_code();
}

}  // namespace
}  // namespace wm::bench

int main(int argc, char** argv) { return wm::bench::run(argc, argv); }
