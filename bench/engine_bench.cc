// Engine throughput on the CPU: frames/s for batches of sessions against the
// same sessions stepped one by one, the time split by op group, and memory
// per session. Prints a Markdown table and one JSON line per case.
//
//   engine_bench [--config configs/default.json] [--frames 16] [--threads 0]
//   engine_bench --config configs/mg2-shape.json --forward-only   (one forward, empty cache)
//   engine_bench --batch-invariant   (batches run their dense ops per session)
//   engine_bench --host-costs   (the host's work per step: a frame's initial noise,
//                                the conditioning of a pass)
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench/bench_flags.h"
#include "engine/engine.h"
#include "engine/model.h"
#include "engine/model_config.h"
#include "engine/noise.h"

namespace {

struct Args {
  std::string config = "configs/default.json";
  int frames = 16;
  int threads = 0;
  bool forward_only = false;
  bool host_costs = false;
  bool batch_invariant = false;
  std::string format = "fp16";
};

wm::Action action(int i) {
  wm::Action a;
  a.keys = 1u << (i % 4);
  a.mouse[0] = static_cast<float>((i * 7) % 20 - 10) * 0.01f;
  return a;
}

std::unique_ptr<wm::Engine> make(const Args& args) {
  wm::EngineOptions o;
  o.random_weights = true;
  o.random_seed = 1;
  o.config_path = args.config;
  o.threads = args.threads;
  o.kv_budget_bytes = int64_t{64} << 30;
  o.batch_invariant = args.batch_invariant;
  auto e = wm::Engine::create(o);
  if (!e.ok()) {
    std::fprintf(stderr, "engine_bench: %s\n", e.status().ToString().c_str());
    std::exit(1);
  }
  return std::move(*e);
}

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

}  // namespace

int main(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "engine_bench: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    // a whole integer in range, or exit 2 naming the flag (std::stoi threw on "abc" and took "8x")
    auto number = [&](const wm::bench::FlagValues& allowed) -> int {
      const std::string text = next();
      int64_t v = 0;
      if (!wm::bench::parse_flag_int(text, allowed, &v)) {
        std::fprintf(stderr, "engine_bench: %s %s: expected %s\n", a.c_str(), text.c_str(),
                     allowed.describe(false).c_str());
        std::exit(2);
      }
      return static_cast<int>(v);
    };
    if (a == "--config") args.config = next();
    else if (a == "--frames") args.frames = number({1, 100000, {}});
    else if (a == "--threads") args.threads = number({0, 1024, {}});  // 0: the libraries' defaults
    else if (a == "--format") args.format = next();
    else if (a == "--forward-only") args.forward_only = true;
    else if (a == "--host-costs") args.host_costs = true;
    else if (a == "--batch-invariant") args.batch_invariant = true;
    else {
      std::fprintf(stderr,
                   "usage: engine_bench [--config F] [--frames N] [--threads T] [--format F] [--forward-only] "
                   "[--host-costs] [--batch-invariant]\n");
      return 2;
    }
  }
  if (args.host_costs) {
    // the initial noise of a frame: the reference on one thread, and a
    // 32-frame batch through the CPU backend's noise_frames (all threads)
    auto cfg = wm::load_model_config(args.config);
    if (!cfg.ok()) {
      std::fprintf(stderr, "%s\n", cfg.status().ToString().c_str());
      return 1;
    }
    const int64_t fv = cfg->frame_values();
    std::vector<float> out(32 * static_cast<size_t>(fv));
    double t0 = now();
    for (int f = 0; f < 32; ++f) wm::noise_fill_frame(1, f, out.data() + f * fv, fv);
    const double one = (now() - t0) / 32;
    auto cpu = wm::make_cpu_backend(args.threads);
    std::vector<uint64_t> seeds(32, 1);
    std::vector<int64_t> frames(32);
    for (int f = 0; f < 32; ++f) frames[static_cast<size_t>(f)] = f;
    cpu->noise_frames(seeds, frames, fv, out.data());  // the thread pool's start
    t0 = now();
    cpu->noise_frames(seeds, frames, fv, out.data());
    const double batch = (now() - t0) / 32;
    // a denoising pass's conditioning (time and action MLPs, the projection
    // to 6 x dim per frame) for 1 and 32 frames: the passes after a step's
    // first reuse the action branch, as they do when serving
    wm::Model model(*cpu, *cfg, wm::random_host_weights(*cfg, 1));
    auto conditioning_us = [&](int frames) {
      std::vector<float> sigma(static_cast<size_t>(frames), cfg->sigmas.front());
      std::vector<wm::Action> acts;
      for (int f = 0; f < frames; ++f) acts.push_back(action(f));
      std::vector<float> c(static_cast<size_t>(frames) * cfg->dim), e(c.size() * 6);
      model.conditioning(sigma, acts, c.data(), e.data());
      const int reps = 20;
      const double t = now();
      for (int r = 0; r < reps; ++r) {
        sigma.assign(sigma.size(), cfg->sigmas[static_cast<size_t>(r) % cfg->sigmas.size()]);
        model.conditioning(sigma, acts, c.data(), e.data());
      }
      return std::round((now() - t) / reps * 1e7) / 10;
    };
    const double cond1 = conditioning_us(1), cond32 = conditioning_us(32);
    nlohmann::json j = {{"case", "host_costs"},
                        {"config", cfg->name},
                        {"frame_values", fv},
                        {"noise_us_per_frame_one_thread", std::round(one * 1e7) / 10},
                        {"noise_us_per_frame_cpu_backend", std::round(batch * 1e7) / 10},
                        {"conditioning_us_per_pass_1_frame", cond1},
                        {"conditioning_us_per_pass_32_frames", cond32}};
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }
  auto engine = make(args);
  const wm::ModelConfig& c = engine->config();
  const int B = c.frames_per_block;
  std::printf("model %s: %lld parameters, %d tokens/frame, %d frames/block, %zu denoising steps + write pass\n",
              c.name.c_str(), static_cast<long long>(c.parameter_count()), c.tokens_per_frame(), B, c.sigmas.size());

  if (args.forward_only) {
    auto id = *engine->open_session({1, args.format, {}});
    wm::StepRequest r{id, std::vector<wm::Action>(static_cast<size_t>(B), action(0)), {}};
    wm::StepStats st;
    const double t0 = now();
    auto res = engine->step(std::span<const wm::StepRequest>(&r, 1), &st);
    if (!res.ok()) {
      std::fprintf(stderr, "%s\n", res.status().ToString().c_str());
      return 1;
    }
    const double block = now() - t0;
    const double forward = block / static_cast<double>(c.sigmas.size() + 1);
    nlohmann::json j = {{"case", "block_empty_cache"}, {"config", c.name}, {"block_s", block},
                        {"forward_s_mean", forward}, {"gemm_s", st.ops.gemm}, {"attention_s", st.ops.attention},
                        {"other_s", st.ops.other}, {"kv_bytes_after", engine->session_info(id)->kv.total()}};
    std::printf("%s\n", j.dump().c_str());
    return 0;
  }

  std::printf("\n| sessions | mode | frames/s | ms/block | gemm %% | attention %% | other %% | KV bytes/session |\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  double single_rate = 0;
  for (int n : {1, 2, 4, 8}) {
    for (int batched = 0; batched < 2; ++batched) {
      if (n == 1 && batched == 0) continue;
      auto e = make(args);
      std::vector<wm::SessionId> ids;
      for (int s = 0; s < n; ++s) ids.push_back(*e->open_session({static_cast<uint64_t>(s + 1), args.format, {}}));
      wm::OpTimes ops;
      int frames = 0;
      // warm up one block so buffers exist, then measure
      const int blocks = std::max(1, args.frames / B);
      double t0 = 0;
      for (int b = -1; b < blocks; ++b) {
        if (b == 0) {
          t0 = now();
          ops = {};
          frames = 0;
        }
        std::vector<wm::StepRequest> reqs;
        for (int s = 0; s < n; ++s)
          reqs.push_back({ids[static_cast<size_t>(s)], std::vector<wm::Action>(static_cast<size_t>(B), action(b + s)), {}});
        if (batched || n == 1) {
          wm::StepStats st;
          auto r = e->step(reqs, &st);
          if (!r.ok()) return 1;
          ops += st.ops;
          frames += st.frames;
        } else {
          for (const auto& rq : reqs) {
            wm::StepStats st;
            auto r = e->step(std::span<const wm::StepRequest>(&rq, 1), &st);
            if (!r.ok()) return 1;
            ops += st.ops;
            frames += st.frames;
          }
        }
      }
      const double dt = now() - t0;
      const double rate = frames / dt;
      if (n == 1) single_rate = rate;
      const double tot = std::max(ops.total(), 1e-12);
      const int64_t kv = e->session_info(ids[0])->kv.total();
      const char* mode = n == 1 ? "single" : (batched ? "batched" : "one by one");
      std::printf("| %d | %s | %.1f | %.1f | %.0f | %.0f | %.0f | %lld |\n", n, mode, rate, 1000.0 * dt / blocks,
                  100 * ops.gemm / tot, 100 * ops.attention / tot, 100 * ops.other / tot, static_cast<long long>(kv));
      nlohmann::json j = {{"case", "throughput"}, {"config", c.name}, {"sessions", n}, {"mode", mode},
                          {"frames_per_s", rate}, {"speedup_vs_single", rate / std::max(single_rate, 1e-12)},
                          {"gemm_s", ops.gemm}, {"attention_s", ops.attention}, {"other_s", ops.other},
                          {"kv_bytes_per_session", kv}, {"kv_reserved_per_session", e->session_reservation(args.format)}};
      std::fprintf(stderr, "%s\n", j.dump().c_str());
    }
  }
  return 0;
}
