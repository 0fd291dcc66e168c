// wmgen: an offline rollout through the engine API.
//   wmgen --model DIR --seed S --script actions.txt --out DIR [--format fp16] [--prompt a.jpg,...]
// Writes frame_%05d.jpg for every generated frame (numbered from 0; wmplay
// numbers by session index, after the prompt's frames) and summary.json, in
// place of an earlier run's; the same seed, prompt and actions give the same
// frames.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "common/cli.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "engine/engine.h"
#include "quant/kv_options.h"

ABSL_FLAG(std::string, model, "models/default", "model directory");
ABSL_FLAG(uint64_t, seed, 0, "session seed");
ABSL_FLAG(std::string, script, "", "action script (one action per frame)");
ABSL_FLAG(std::string, out, "", "output directory");
ABSL_FLAG(std::string, format, "fp16", "KV cache format");
ABSL_FLAG(std::string, kv_options, "", "cache format options, e.g. block=32,psac_bits=4 (as wmserve's; docs/QUANT.md)");
ABSL_FLAG(std::string, prompt, "", "comma-separated JPEG frames written into the cache first");
ABSL_FLAG(int, threads, 0, "CPU threads, 0..1024 (0: all cores)");
ABSL_FLAG(int, quality, 90, "JPEG quality, 1..100");

namespace {

int fail(const absl::Status& st) {
  std::fprintf(stderr, "wmgen: %s\n", st.ToString().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("wmgen --model DIR --seed S --script actions.txt --out DIR");
  if (auto bad = wm::parse_flags_only(argc, argv)) {
    std::fprintf(stderr, "wmgen: %s\n", bad->c_str());
    return 2;
  }
  const std::string out = absl::GetFlag(FLAGS_out);
  if (absl::GetFlag(FLAGS_script).empty() || out.empty()) {
    std::fprintf(stderr, "wmgen: --script and --out are required\n");
    return 2;
  }
  if (!wm::threads_in_range(absl::GetFlag(FLAGS_threads))) {
    std::fprintf(stderr, "wmgen: %s\n", wm::kThreadsRange);
    return 2;
  }
  // jpeg_encode's range, checked before a frame is made or --out created
  if (const int q = absl::GetFlag(FLAGS_quality); q < 1 || q > 100) {
    std::fprintf(stderr, "wmgen: --quality=%d must be within 1..100\n", q);
    return 2;
  }
  wm::EngineOptions eo;
  eo.model_dir = absl::GetFlag(FLAGS_model);
  eo.threads = absl::GetFlag(FLAGS_threads);
  if (auto kv = wm::parse_kv_format_options(absl::GetFlag(FLAGS_kv_options)); kv.ok()) {
    eo.kv_options = *kv;
  } else {
    return fail(absl::InvalidArgumentError(absl::StrCat("--kv_options: ", kv.status().message())));
  }
  auto engine = wm::Engine::create(eo);
  if (!engine.ok()) return fail(engine.status());
  const wm::ModelConfig& cfg = (*engine)->config();
  auto actions = wm::load_action_script(absl::GetFlag(FLAGS_script), cfg.actions);
  if (!actions.ok()) return fail(actions.status());
  if (actions->empty())
    return fail(absl::InvalidArgumentError(absl::StrCat(absl::GetFlag(FLAGS_script), ": the script has no actions")));
  wm::SessionOptions so;
  so.seed = absl::GetFlag(FLAGS_seed);
  so.cache_format = absl::GetFlag(FLAGS_format);
  if (!absl::GetFlag(FLAGS_prompt).empty()) {
    for (absl::string_view p : absl::StrSplit(absl::GetFlag(FLAGS_prompt), ',', absl::SkipEmpty())) {
      auto bytes = wm::read_file(std::string(p), 64 << 20);
      if (!bytes.ok()) return fail(bytes.status());
      // anything larger than the model's frame is refused before it is decoded
      auto img = wm::jpeg_decode(bytes->data(), bytes->size(), int64_t{cfg.width} * cfg.height);
      if (!img.ok()) return fail(absl::Status(img.status().code(), absl::StrCat(p, ": ", img.status().message())));
      so.prompt.push_back(std::move(*img));
    }
  }
  auto id = (*engine)->open_session(so);
  if (!id.ok()) return fail(id.status());
  std::error_code ec;
  std::filesystem::create_directories(out, ec);
  if (ec) return fail(absl::UnavailableError("cannot create " + out));
  // an earlier run's frames and summary go first: a longer run's later
  // frames would otherwise sit beside this run's as if they were its own.
  // Only the regular files a run writes: a link there is the user's
  for (const auto& e : std::filesystem::directory_iterator(out, ec)) {
    const std::string name = e.path().filename().string();
    if ((name == "summary.json" || (name.starts_with("frame_") && name.ends_with(".jpg"))) &&
        e.symlink_status(ec).type() == std::filesystem::file_type::regular && !std::filesystem::remove(e.path(), ec))
      return fail(absl::UnavailableError(absl::StrCat("cannot remove ", e.path().string(), ": ", ec.message())));
  }
  if (ec) return fail(absl::UnavailableError(absl::StrCat("cannot list ", out, ": ", ec.message())));

  const int B = cfg.frames_per_block;
  wm::OpTimes ops;
  double model_s = 0;
  int64_t frames = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t i = 0; i < actions->size(); i += B) {
    wm::StepRequest req;
    req.session = *id;
    for (int b = 0; b < B; ++b) req.actions.push_back((*actions)[std::min(actions->size() - 1, i + b)]);
    wm::StepStats stats;
    auto res = (*engine)->step(std::span<const wm::StepRequest>(&req, 1), &stats);
    if (!res.ok()) return fail(res.status());
    ops += stats.ops;
    model_s += stats.seconds;
    for (const auto& fr : (*res)[0].frames) {
      auto jpg = wm::jpeg_encode(fr.rgb.data(), fr.width, fr.height, absl::GetFlag(FLAGS_quality));
      if (!jpg.ok()) return fail(jpg.status());
      const std::string path = absl::StrFormat("%s/frame_%05d.jpg", out, frames);
      if (auto st = wm::write_file(path, jpg->data(), jpg->size()); !st.ok()) return fail(st);
      ++frames;
    }
  }
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  auto info = (*engine)->session_info(*id);
  nlohmann::json j;
  j["model"] = cfg.name;
  j["seed"] = so.seed;
  j["cache_format"] = so.cache_format;
  j["kv_options"] = wm::kv_format_options_text(eo.kv_options);
  j["frames"] = frames;
  j["prompt_frames"] = so.prompt.size();
  j["width"] = cfg.width;
  j["height"] = cfg.height;
  j["wall_seconds"] = wall;
  j["frames_per_second"] = frames / std::max(wall, 1e-9);
  j["model_seconds"] = model_s;
  j["ops_seconds"] = {{"gemm", ops.gemm}, {"attention", ops.attention}, {"other", ops.other}};
  j["kv_bytes"] = info.ok() ? info->kv.total() : 0;
  j["kv_reserved_bytes"] = info.ok() ? info->kv_reserved : 0;
  const std::string s = j.dump(2) + "\n";
  if (auto st = wm::write_file(out + "/summary.json", s.data(), s.size()); !st.ok()) return fail(st);
  std::printf("%s", s.c_str());
  if (auto st = wm::flush_stdout(); !st.ok()) return fail(st);
  return 0;
}
