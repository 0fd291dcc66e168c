// Attention over a long paged KV cache (fp16, or --format), one session, 12 heads x 128,
// through Backend::attention (the path the model runs: input conversion,
// fused kernel, split combine). One JSON line per (cached tokens, query
// tokens): time, cache bandwidth against 4.8 TB/s HBM (of an fp16 cache's
// bytes, whatever the format; cache_GBps: of the format's own), FLOP rate
// against the bf16 dense peak (790 TFLOP/s measured on the H200, 989 datasheet).
// The side-by-side PyTorch numbers come from ../shared/research/torch_attn.py
// run in the same device call (tools/gpu-run.sh).
//
//   attention_bench [--device=cuda|cpu] [--plugin=PATH] [--reps=20]
//                   [--cached=1024,...,65536] [--queries=64,2640] [--heads=12] [--head_dim=128]
//                   [--kernel=auto|mma|wgmma|overlap|ws|all] [--stages=0,3,4,5,6] [--pingpong=0,1]
//                   [--ws_keys=0,64,128] [--ws_tma=-1,0,1] [--ws_ablate=0,1,2]
//                   [--format=fp16|kivi2|qvg2|quantwm2] [--probe=0|1]
// append_ms: one append's wall time while the cache fills (a span
// format's includes its k-means and coding, on the device, docs/PERFORMANCE.md).
// --format: the cache format (kivi2: the kernels decoding 2-bit tiles; on
// the GPU only where a frame is whole chunks, so 64-token queries; qvg2,
// quantwm2: decoding per-token codes, the cache filled a block per append,
// coded as the write pass codes it)
// --stages: the overlapped and warp-specialised kernels' K/V stages to time ("attention.stages"; 0 the
// default; 6 for the latter's TMA build only)
// --pingpong: its two warpgroups in ping-pong or not ("attention.pingpong"; -1 the default)
// --ws_keys: the warp-specialised kernel's keys per step ("attention.ws_keys"; 0 the default)
// --ws_tma: whether it copies whole key tiles by TMA ("attention.ws_tma"; -1 the default)
// --ws_ablate: its loads alone (1) or its consumers alone (2), beside the whole kernel (0)
// ("attention.ws_ablate", docs/CUDA.md "Ablations"): what each half of it takes. The outputs of 1 and 2
// are wrong, so their rows (ws_ablate 1, 2) time the kernel and nothing else
// --probe=1: audit mode's drift probe of one call (4 queries per head, top
// 8) against an fp16 reference cache of the same frames: probe_ms, on the
// device (KvCache::probe_against, cuda/kv_probe.cuh; wall time, with its
// upload and download), and probe_host_ms, the host probe (probe_caches:
// both caches' layer reconstructed on the host, as a device audit did until
// 2026-12-03), once
#include <cmath>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "bench/bench_util.h"
#include "quant/probe.h"

namespace wm::bench {
namespace {

constexpr double kHbmBytesPerSecond = 4.8e12;
constexpr double kBf16MeasuredFlops = 790e12;
constexpr double kBf16DatasheetFlops = 989e12;

std::vector<float> randn(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d;
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

int run(int argc, char** argv) {
  // every flag first, so that a bad one is refused before the device opens
  Flags f(argc, argv);
  const DeviceFlags device_flags = read_device_flags(f);
  const int heads = static_cast<int>(f.num("heads", 12, 1, 128));
  const int hd = static_cast<int>(f.num("head_dim", 128, {32, 64, 128}));  // the CUDA caches' head sizes
  const int reps = static_cast<int>(f.num("reps", 20, 1, 1000000));
  // at most 16M tokens: their int arithmetic (frames x tokens) stays far from overflow
  const std::vector<int> cached = f.list("cached", "1024,2048,4096,8192,16384,32768,65536", 1, 1 << 24);
  const std::vector<int> queries = f.list("queries", "64,2640", 1, 1 << 16);
  const std::string format = f.str("format", "fp16");
  const bool probe = f.num("probe", 0, 0, 1) != 0;
  // --kernel=auto|mma|wgmma|overlap|ws|all: the CUDA attention kernel(s) to time ("attention.kernel")
  const std::string kernel_flag = f.choice("kernel", "auto", {"auto", "mma", "wgmma", "overlap", "ws", "all"});
  // the values the plugin's tunings take (cuda/cuda_backend.cc set_tuning), so that none fails half-way
  const std::vector<int> stage_list = f.list("stages", "0", {0, 3, 4, 5, 6});
  const std::vector<int> pingpong_list = f.list("pingpong", "-1", -1, 1);
  const std::vector<int> ws_keys_list = f.list("ws_keys", "0", {0, 64, 128});
  const std::vector<int> ws_tma_list = f.list("ws_tma", "-1", -1, 1);
  // 0 the whole kernel, 1 its loads, 2 its consumers
  const std::vector<int> ablate_list = f.list("ws_ablate", "0", 0, 2);
  f.reject_unknown();

  int max_cached = 0;
  for (int c : cached) max_cached = std::max(max_cached, c);
  // one cache alive at a time (and its fp16 reference with --probe); whole pages plus a frame of slack
  const int64_t pool = (probe ? 2 : 1) * (static_cast<int64_t>(max_cached) + 2 * 880) * heads * hd * 4 +
                       (int64_t{256} << 20);
  Device dev = open_device(device_flags, pool, int64_t{1} << 30);
  Backend& b = *dev.backend;
  const std::map<std::string, std::vector<std::pair<std::string, int64_t>>> kernel_sets = {
      {"auto", {{"auto", 0}}},
      {"mma", {{"mma", 1}}},
      {"wgmma", {{"wgmma", 2}}},
      {"overlap", {{"overlap", 3}}},
      {"ws", {{"ws", 4}}},
      {"all", {{"mma", 1}, {"wgmma", 2}, {"overlap", 3}, {"ws", 4}}}};
  const auto kernels_it = kernel_sets.find(kernel_flag);
  struct Variant {
    std::string name;
    int64_t kernel = 0, stages = 0, pingpong = -1, ws_keys = 0, ws_tma = -1, ablate = 0;
  };
  std::vector<Variant> variants;
  for (const auto& [kernel_name, kernel] : kernels_it->second)
    for (int st : stage_list)
      for (int pp : pingpong_list)
        for (int keys : ws_keys_list)
          for (int tma : ws_tma_list)
            for (int ablate : ablate_list) {
              // stages and ping-pong are the overlapped and warp-specialised kernels' (3, 4), keys per step and
              // TMA the latter's: the others run once. No variant twice: the overlapped kernel runs 6 stages as
              // 5; the warp-specialised one 3 of 128 keys a step, 3 or 4 of 64 by cp.async (5 and 6 as 4), 3 to
              // 6 of 64 by TMA (attention_sm90_ws_stages)
              if ((st != stage_list.front() || pp != pingpong_list.front()) && kernel != 3 && kernel != 4) continue;
              if ((keys != ws_keys_list.front() || tma != ws_tma_list.front() || ablate != ablate_list.front()) &&
                  kernel != 4)
                continue;
              if (kernel == 3 && st == 6) continue;
              if (kernel == 4 && ((keys == 128 && st >= 4) || (tma != 1 && st >= 5))) continue;
              variants.push_back({kernel_name, kernel, st, pp, keys, tma, kernel == 4 ? ablate : 0});
            }

  for (const Variant& var : variants) {
    const int64_t kernel = var.kernel;
    if (dev.plugin == nullptr && &var != &variants.front()) break;  // the CPU has one kernel
    if (dev.plugin != nullptr) {
      absl::Status ks = dev.plugin->set_tuning("attention.kernel", kernel);
      if (ks.ok()) ks = dev.plugin->set_tuning("attention.stages", var.stages);
      if (ks.ok()) ks = dev.plugin->set_tuning("attention.pingpong", var.pingpong);
      if (ks.ok()) ks = dev.plugin->set_tuning("attention.ws_keys", var.ws_keys);
      if (ks.ok()) ks = dev.plugin->set_tuning("attention.ws_tma", var.ws_tma);
      if (ks.ok()) ks = dev.plugin->set_tuning("attention.ws_ablate", var.ablate);
      if (!ks.ok()) {
        std::fprintf(stderr, "kernel %s, stages %lld: %s\n", var.name.c_str(), static_cast<long long>(var.stages),
                     ks.ToString().c_str());
        continue;
      }
    }
    for (int tq : queries) {
      // a query block is one frame of 64 tokens (the default model) or 3 frames of 880 (Matrix-Game-2)
      const int T = tq == 2640 ? 880 : tq, fpb = tq == 2640 ? 3 : 1;
      const size_t q_vals = static_cast<size_t>(tq) * heads * hd;
      DeviceArrays arrays(b);
      auto put = [&](const std::vector<float>& h) { return arrays.put(h); };
      std::vector<float> host_q = randn(q_vals, 1), host_k = randn(q_vals, 2), host_v = randn(q_vals, 3);
      float* q = put(host_q);
      float* k = put(host_k);
      float* v = put(host_v);
      float* out = put(std::vector<float>(q_vals, 0.0f));
      // random frames appended in chunks, as the write pass does
      const int chunk_frames = std::max(1, 4096 / T);
      float* chunk_k = put(randn(static_cast<size_t>(chunk_frames) * T * heads * hd, 4));
      float* chunk_v = put(randn(static_cast<size_t>(chunk_frames) * T * heads * hd, 5));
      for (int n_cached : cached) {
        const int frames = std::max(1, (n_cached + T / 2) / T);
        KvGeometry g;
        g.layers = 1;
        g.heads = heads;
        g.head_dim = hd;
        g.tokens_per_frame = T;
        g.window_frames = frames;
        g.sink_frames = 0;
        g.frames_per_block = fpb;
        for (const int64_t split : {int64_t{-1}, int64_t{1}}) {
          if (split == 1 && (dev.plugin == nullptr || tq != 64)) continue;  // no-split contrast for the small block only
          if (dev.plugin != nullptr) dev.plugin->set_tuning("attention.split", split).IgnoreError();
          auto cache = b.make_kv_cache(format, g, KvFormatOptions{});
          if (!cache.ok() && cache.status().code() == absl::StatusCode::kUnimplemented) {
            std::fprintf(stderr, "skipped: %s\n", cache.status().ToString().c_str());
            continue;
          }
          if (!cache.ok()) {
            std::fprintf(stderr, "cache: %s\n", cache.status().ToString().c_str());
            return 1;
          }
          // a span cache on the GPU takes a block per append (its centroids fill a slot's table)
          const bool span = format == "qvg2" || format == "quantwm2";
          const int step = span ? fpb : chunk_frames;
          // the appends are timed too: a span cache's are the write pass's coding
          const double a0 = now_s();
          int appends = 0;
          for (int fr = 0; fr < frames; fr += step, ++appends) {
            const absl::Status s = (*cache)->append(0, chunk_k, chunk_v, fr, std::min(step, frames - fr));
            if (!s.ok()) {
              std::fprintf(stderr, "append: %s\n", s.ToString().c_str());
              return 1;
            }
          }
          dev.sync();
          const double append_ms = (now_s() - a0) * 1e3 / std::max(1, appends);
          const SessionSlice slice{cache->get(), 0, fpb};
          const std::span<const SessionSlice> slices(&slice, 1);
          for (int i = 0; i < 3; ++i) b.attention(0, slices, T, q, k, v, out);
          dev.sync();
          std::string ran = dev.plugin == nullptr ? "cpu" : dev.plugin->attention_kernel(hd);
          if (format != "fp16" && ran == "ws") ran = "overlap";  // the quantized formats have no warp-specialised kernel
          const bool staged = ran == "overlap" || ran == "ws";
          const char* bq = tq == 64 ? "block_q_64" : "block_q_128";  // the planner's tile for these shapes
          const int64_t stages =
              !staged ? 0
                      : dev.plugin->counter(ran == "ws" ? std::string("attention.ws_stages.") + bq : "attention.stages")
                            .value_or(0);
          const int64_t pingpong = staged ? dev.plugin->counter("attention.pingpong").value_or(0) : 0;
          const int64_t ws_keys = ran == "ws" ? dev.plugin->counter(std::string("attention.ws_keys.") + bq).value_or(0) : 0;
          const int64_t ws_tma = ran == "ws" ? dev.plugin->counter("attention.ws_tma").value_or(0) : 0;
          const int64_t ws_ablate = ran == "ws" ? dev.plugin->counter("attention.ws_ablate").value_or(0) : 0;
          double ms = 0;
          const int n = dev.plugin != nullptr ? reps : 1;
          if (dev.plugin != nullptr) {
            dev.plugin->timer_start().IgnoreError();
            for (int i = 0; i < n; ++i) b.attention(0, slices, T, q, k, v, out);
            ms = dev.plugin->timer_stop_ms().value_or(-1.0);
          } else {
            const double t0 = now_s();
            b.attention(0, slices, T, q, k, v, out);
            ms = (now_s() - t0) * 1e3;
          }
          const double s = ms / 1e3 / n;
          // --probe: the same frames in an fp16 reference, then one probed call on the device and on the host
          double probe_ms = -1, probe_host_ms = -1;
          if (probe && split < 0) {
            auto ref = b.make_kv_cache("fp16", g, KvFormatOptions{});
            if (!ref.ok()) {
              std::fprintf(stderr, "reference cache: %s\n", ref.status().ToString().c_str());
              return 1;
            }
            for (int fr = 0; fr < frames; fr += step)
              if (const absl::Status st = (*ref)->append(0, chunk_k, chunk_v, fr, std::min(step, frames - fr));
                  !st.ok()) {
                std::fprintf(stderr, "reference append: %s\n", st.ToString().c_str());
                return 1;
              }
            dev.sync();
            const auto samples = probe_sample(tq, heads, 4, 1);
            ProbeRanks ranks;
            if ((*cache)->probe_against(**ref, 0, q, k, v, tq, samples, 8, &ranks)) {
              const int probe_reps = std::max(1, std::min(reps, 5));
              const double p0 = now_s();
              for (int i = 0; i < probe_reps; ++i) (*cache)->probe_against(**ref, 0, q, k, v, tq, samples, 8, &ranks);
              probe_ms = (now_s() - p0) * 1e3 / probe_reps;
            }
            DriftStats host_stats;
            const double h0 = now_s();
            probe_caches(**ref, **cache, 0, host_q.data(), host_k.data(), host_v.data(), tq, samples, 8, &host_stats);
            probe_host_ms = (now_s() - h0) * 1e3;
          }
          const int64_t tokens = static_cast<int64_t>(frames) * T;
          const double kv_bytes = 2.0 * heads * static_cast<double>(tokens) * hd * 2;
          const double flops = 4.0 * heads * tq * static_cast<double>(tokens + tq) * hd;
          nlohmann::json j = {{"bench", "attention"},
                              {"device", dev.name},
                              {"cached_tokens", tokens},
                              {"query_tokens", tq},
                              {"heads", heads},
                              {"head_dim", hd},
                              {"split", split < 0 ? "auto" : "none"},
                              {"kernel", ran},
                              {"format", format},
                              {"cache_bytes", (*cache)->bytes().total()},
                              // one layer's append of `append_frames` frames, wall time
                              {"append_frames", step},
                              {"append_ms", std::round(append_ms * 1000) / 1000},
                              // the bytes the format holds (whole pages) over the time: what a 2-bit cache reads
                              {"cache_GBps", std::round(static_cast<double>((*cache)->bytes().total()) / s / 1e8) / 10},
                              {"stages", stages},
                              {"pingpong", pingpong},
                              {"ws_keys", ws_keys},
                              {"ws_tma", ws_tma},
                              {"ws_ablate", ws_ablate},
                              {"us", std::round(s * 1e7) / 10},
                              {"kv_bytes_fp16", kv_bytes},
                              {"GBps", std::round(kv_bytes / s / 1e8) / 10},
                              {"pct_hbm_4800", std::round(kv_bytes / s / kHbmBytesPerSecond * 1000) / 10},
                              {"TFLOPs", std::round(flops / s / 1e11) / 10},
                              {"pct_bf16_790", std::round(flops / s / kBf16MeasuredFlops * 1000) / 10},
                              {"pct_bf16_989", std::round(flops / s / kBf16DatasheetFlops * 1000) / 10}};
          if (probe && split < 0) {
            j["probe_ms"] = probe_ms < 0 ? nlohmann::json() : nlohmann::json(std::round(probe_ms * 1000) / 1000);
            j["probe_host_ms"] = std::round(probe_host_ms * 1000) / 1000;
            if (probe_ms > 0) j["probe_speedup"] = std::round(probe_host_ms / probe_ms * 10) / 10;
          }
          std::printf("%s\n", j.dump().c_str());
          std::fflush(stdout);
        }
      }
      if (dev.plugin != nullptr) dev.plugin->set_tuning("attention.split", -1).IgnoreError();
      dev.sync();
    }
  }
  if (dev.plugin != nullptr) {
    dev.plugin->set_tuning("attention.kernel", 0).IgnoreError();
    dev.plugin->set_tuning("attention.stages", 0).IgnoreError();
    dev.plugin->set_tuning("attention.pingpong", -1).IgnoreError();
    dev.plugin->set_tuning("attention.ws_keys", 0).IgnoreError();
    dev.plugin->set_tuning("attention.ws_tma", -1).IgnoreError();
    dev.plugin->set_tuning("attention.ws_ablate", 0).IgnoreError();
  }
  return dev.exit_code();
}

}  // namespace
}  // namespace wm::bench

int main(int argc, char** argv) { return wm::bench::run(argc, argv); }
