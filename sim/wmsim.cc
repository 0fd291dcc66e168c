// wmsim: the ground-truth maze world on the command line. Renders action
// scripts, writes training datasets of policy episodes, and writes the
// policy's actions as scripts. See docs/SIM.md.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/image_io.h"
#include "engine/action.h"
#include "nlohmann/json.hpp"
#include "sim/episode.h"
#include "sim/maze.h"
#include "sim/npy.h"
#include "sim/policy.h"
#include "sim/raycaster.h"
#include "sim/world.h"

namespace {

using wm::sim::Pose;

constexpr int kExitBadInput = 2;
constexpr int kExitFailure = 1;

constexpr char kUsage[] =
    R"(wmsim: the ground-truth first-person maze world of wmserve

usage:
  wmsim render  --seed S --script FILE --out DIR [--width 64] [--height 64]
      renders frame 0 (the initial view) and one frame per script action to
      DIR/frame_00000.jpg ..., DIR/frames.npy (uint8 [N,H,W,3]),
      DIR/actions.npy (float32 [N,6]) and DIR/summary.json
  wmsim dataset --seed S --episodes N --frames F --out DIR
                [--width 64] [--height 64] [--threads T]
      N policy episodes of F frames each in DIR/episode_%05d/ (frames.npy,
      actions.npy, poses.npy, meta.json) and DIR/dataset.json
  wmsim script  --seed S --frames N --out FILE
      writes N actions of the exploration policy in the world of seed S as an
      action script (FILE "-" writes to stdout)
  wmsim --help

flags:
  --seed S       unsigned 64-bit seed of the maze, start pose and policy
  --script FILE  action script (keys W A S D, mouse yaw and pitch in degrees)
  --out PATH     output directory (render, dataset) or file (script)
  --width W      frame width in pixels, 8..1024 (default 64)
  --height H     frame height in pixels, 8..1024 (default 64)
  --episodes N   episodes, 1..1000000
  --frames F     frames per episode, 1..100000 (dataset); actions, 0..1000000 (script)
  --threads T    worker threads, 1..256 (default: the number of cores); the
                 output does not depend on it

exit status: 0 ok, 1 failure while writing, 2 bad flags or input
)";

struct Flags {
  std::map<std::string, std::string> values;
};

int bad_input(const std::string& message) {
  std::fprintf(stderr, "wmsim: error: %s\n(run wmsim --help for usage)\n", message.c_str());
  return kExitBadInput;
}

int failure(const absl::Status& st) {
  std::fprintf(stderr, "wmsim: error: %s\n", std::string(st.message()).c_str());
  return kExitFailure;
}

// parses --name value and --name=value; every flag must be in allowed, none repeated
absl::StatusOr<Flags> parse_flags(int argc, char** argv, int first, const std::set<std::string>& allowed) {
  Flags flags;
  for (int i = first; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.rfind("--", 0) != 0) return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", arg, "'"));
    std::string name = arg.substr(2);
    std::string value;
    if (const size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    } else {
      if (i + 1 >= argc) return absl::InvalidArgumentError(absl::StrCat("flag --", name, " needs a value"));
      value = argv[++i];
    }
    if (!allowed.contains(name)) return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name, " for this command"));
    if (flags.values.contains(name)) return absl::InvalidArgumentError(absl::StrCat("flag --", name, " given twice"));
    flags.values[name] = value;
  }
  return flags;
}

absl::StatusOr<std::string> get_string(const Flags& f, const std::string& name) {
  auto it = f.values.find(name);
  if (it == f.values.end()) return absl::InvalidArgumentError(absl::StrCat("missing required flag --", name));
  if (it->second.empty()) return absl::InvalidArgumentError(absl::StrCat("flag --", name, " is empty"));
  return it->second;
}

absl::StatusOr<uint64_t> get_seed(const Flags& f) {
  auto s = get_string(f, "seed");
  if (!s.ok()) return s.status();
  uint64_t v = 0;
  if (!absl::SimpleAtoi(*s, &v)) return absl::InvalidArgumentError(absl::StrCat("--seed '", *s, "' is not an unsigned 64-bit integer"));
  return v;
}

// an integer flag in [lo, hi]; fallback when absent, unless required
absl::StatusOr<int> get_int(const Flags& f, const std::string& name, int lo, int hi, int fallback, bool required) {
  auto it = f.values.find(name);
  if (it == f.values.end()) {
    if (required) return absl::InvalidArgumentError(absl::StrCat("missing required flag --", name));
    return fallback;
  }
  int v = 0;
  if (!absl::SimpleAtoi(it->second, &v) || v < lo || v > hi) {
    return absl::InvalidArgumentError(absl::StrCat("--", name, " '", it->second, "' is not an integer in ", lo, "..", hi));
  }
  return v;
}

nlohmann::json pose_json(const Pose& p) {
  return {{"x", p.x}, {"y", p.y}, {"yaw_deg", p.yaw_deg}, {"pitch_deg", p.pitch_deg}};
}

absl::Status write_json(const std::string& path, const nlohmann::json& j) {
  const std::string text = j.dump(2) + "\n";
  return wm::write_file(path, text.data(), text.size());
}

absl::Status make_dir(const std::string& path) {
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  if (ec) return absl::UnavailableError(absl::StrCat("cannot create directory ", path, ": ", ec.message()));
  return absl::OkStatus();
}

// removes a file of an earlier run that marks its output as complete
absl::Status remove_stale(const std::string& path) {
  std::error_code ec;
  std::filesystem::remove(path, ec);
  if (ec) return absl::UnavailableError(absl::StrCat("cannot remove ", path, ": ", ec.message()));
  return absl::OkStatus();
}

// bytes free on the file system that holds path, or would hold it once
// created (its nearest existing ancestor); nullopt when unknown
std::optional<uint64_t> free_bytes(const std::filesystem::path& path) {
  std::error_code ec;
  std::filesystem::path p = std::filesystem::absolute(path, ec);
  if (ec) return std::nullopt;
  while (!std::filesystem::exists(p, ec)) {
    if (p == p.parent_path()) return std::nullopt;
    p = p.parent_path();
  }
  const std::filesystem::space_info info = std::filesystem::space(p, ec);
  if (ec) return std::nullopt;
  return info.available;
}

// bytes of the regular files under dir, which a new output there may replace
uint64_t held_bytes(const std::filesystem::path& dir) {
  uint64_t held = 0;
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) return 0;
  for (auto it = std::filesystem::recursive_directory_iterator(dir, ec); !ec && it != std::filesystem::end(it);
       it.increment(ec)) {
    std::error_code size_ec;
    if (it->is_regular_file(size_ec)) held += it->file_size(size_ec);
  }
  return held;
}

// refuses an output that certainly does not fit, before anything is written
absl::Status check_room(const std::string& out, double need_bytes, const std::string& what) {
  const std::optional<uint64_t> free = free_bytes(out);
  if (!free.has_value() || need_bytes <= static_cast<double>(*free)) return absl::OkStatus();
  const double room = static_cast<double>(*free) + static_cast<double>(held_bytes(out));
  if (need_bytes <= room) return absl::OkStatus();
  constexpr double kGiB = 1ull << 30;
  return absl::ResourceExhaustedError(absl::StrFormat(
      "%s needs at least %.1f GiB but only %.1f GiB are free for %s; use fewer or smaller frames or another disk",
      what, need_bytes / kGiB, room / kGiB, out));
}

nlohmann::json action_space_json() {
  const wm::ActionSpace space = wm::default_action_space();
  return {{"keys", space.keys}, {"mouse", space.mouse}, {"mouse_scale", space.mouse_scale}, {"mouse_limit", space.mouse_limit}};
}

int cmd_render(int argc, char** argv) {
  auto flags = parse_flags(argc, argv, 2, {"seed", "script", "out", "width", "height"});
  if (!flags.ok()) return bad_input(std::string(flags.status().message()));
  auto seed = get_seed(*flags);
  auto script = get_string(*flags, "script");
  auto out = get_string(*flags, "out");
  auto width = get_int(*flags, "width", 8, 1024, 64, false);
  auto height = get_int(*flags, "height", 8, 1024, 64, false);
  for (const absl::Status& st : {seed.status(), script.status(), out.status(), width.status(), height.status()}) {
    if (!st.ok()) return bad_input(std::string(st.message()));
  }
  auto actions = wm::load_action_script(*script, wm::default_action_space());
  if (!actions.ok()) return bad_input(std::string(actions.status().message()));
  wm::sim::RenderConfig rc;
  rc.width = *width;
  rc.height = *height;
  auto raycaster = wm::sim::Raycaster::create(rc);
  if (!raycaster.ok()) return bad_input(std::string(raycaster.status().message()));
  auto world = wm::sim::World::from_seed(*seed);
  if (!world.ok()) return failure(world.status());
  const int64_t frames = static_cast<int64_t>(actions->size()) + 1;
  // frames.npy alone; the JPEGs come on top
  if (auto st = check_room(*out, static_cast<double>(frames) * raycaster->frame_bytes(), "the render"); !st.ok()) {
    return bad_input(std::string(st.message()));
  }
  if (auto st = make_dir(*out); !st.ok()) return failure(st);
  // summary.json is written last: one from an earlier render must not outlive a failure
  if (auto st = remove_stale((std::filesystem::path(*out) / "summary.json").string()); !st.ok()) return failure(st);

  const std::filesystem::path dir(*out);
  wm::sim::NpyWriter frames_npy;
  if (auto st = frames_npy.open((dir / "frames.npy").string(), wm::sim::NpyDtype::kUint8, {frames, rc.height, rc.width, 3});
      !st.ok()) {
    return failure(st);
  }
  std::vector<float> action_rows(static_cast<size_t>(frames) * wm::sim::kActionRowWidth, 0.0f);
  const Pose start = world->pose();
  std::vector<uint8_t> pixels(raycaster->frame_bytes());
  for (int64_t i = 0; i < frames; ++i) {
    if (i > 0) {
      const wm::Action& a = (*actions)[i - 1];
      world->step(a);
      wm::sim::action_row(a, action_rows.data() + i * wm::sim::kActionRowWidth);
    }
    raycaster->render(world->maze(), world->pose(), pixels.data());
    auto jpeg = wm::jpeg_encode(pixels.data(), rc.width, rc.height, 95);
    if (!jpeg.ok()) return failure(jpeg.status());
    const std::string name = absl::StrFormat("frame_%05d.jpg", i);
    if (auto st = wm::write_file((dir / name).string(), jpeg->data(), jpeg->size()); !st.ok()) return failure(st);
    if (auto st = frames_npy.append(pixels.data(), pixels.size()); !st.ok()) return failure(st);
  }
  if (auto st = frames_npy.finish(); !st.ok()) return failure(st);
  if (auto st = wm::sim::npy_write((dir / "actions.npy").string(), wm::sim::NpyDtype::kFloat32,
                                   {frames, wm::sim::kActionRowWidth}, action_rows.data());
      !st.ok()) {
    return failure(st);
  }
  nlohmann::json summary = {
      {"format", "wmserve-sim-render"},
      {"version", 1},
      {"seed", *seed},
      {"script", *script},
      {"frames", frames},
      {"actions", frames - 1},
      {"width", rc.width},
      {"height", rc.height},
      {"fov_deg", rc.fov_deg},
      {"start_pose", pose_json(start)},
      {"final_pose", pose_json(world->pose())},
  };
  if (auto st = write_json((dir / "summary.json").string(), summary); !st.ok()) return failure(st);
  std::fprintf(stderr, "wmsim: rendered %lld frames to %s\n", static_cast<long long>(frames), out->c_str());
  return 0;
}

absl::Status write_episode(const std::filesystem::path& dir, const wm::sim::Episode& ep, int index, int width, int height) {
  if (auto st = make_dir(dir.string()); !st.ok()) return st;
  const int64_t f = ep.frames;
  if (auto st = wm::sim::npy_write((dir / "frames.npy").string(), wm::sim::NpyDtype::kUint8, {f, height, width, 3},
                                   ep.pixels.data());
      !st.ok()) {
    return st;
  }
  if (auto st = wm::sim::npy_write((dir / "actions.npy").string(), wm::sim::NpyDtype::kFloat32,
                                   {f, wm::sim::kActionRowWidth}, ep.actions.data());
      !st.ok()) {
    return st;
  }
  if (auto st = wm::sim::npy_write((dir / "poses.npy").string(), wm::sim::NpyDtype::kFloat32,
                                   {f, wm::sim::kPoseRowWidth}, ep.poses.data());
      !st.ok()) {
    return st;
  }
  nlohmann::json meta = {
      {"episode", index},
      {"seed", ep.seed},
      {"frames", ep.frames},
      {"width", width},
      {"height", height},
      {"start_pose", pose_json(ep.start)},
      {"final_pose", pose_json(ep.end)},
      {"reproduce", absl::StrFormat("wmsim script --seed %d --frames %d --out s.txt && wmsim render --seed %d "
                                    "--script s.txt --out DIR --width %d --height %d",
                                    ep.seed, ep.frames - 1, ep.seed, width, height)},
  };
  return write_json((dir / "meta.json").string(), meta);
}

int cmd_dataset(int argc, char** argv) {
  auto flags = parse_flags(argc, argv, 2, {"seed", "episodes", "frames", "out", "width", "height", "threads"});
  if (!flags.ok()) return bad_input(std::string(flags.status().message()));
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  auto seed = get_seed(*flags);
  auto episodes = get_int(*flags, "episodes", 1, 1000000, 0, true);
  auto frames = get_int(*flags, "frames", 1, 100000, 0, true);
  auto out = get_string(*flags, "out");
  auto width = get_int(*flags, "width", 8, 1024, 64, false);
  auto height = get_int(*flags, "height", 8, 1024, 64, false);
  auto threads = get_int(*flags, "threads", 1, 256, std::min(cores, 256), false);
  for (const absl::Status& st :
       {seed.status(), episodes.status(), frames.status(), out.status(), width.status(), height.status(), threads.status()}) {
    if (!st.ok()) return bad_input(std::string(st.message()));
  }
  const double episode_bytes = static_cast<double>(*frames) * *width * *height * 3;
  if (episode_bytes > 2.0 * (1ull << 30)) {
    return bad_input(absl::StrCat("one episode would take ", episode_bytes / (1ull << 30),
                                  " GiB of frames; use fewer frames or smaller images (limit 2 GiB)"));
  }
  wm::sim::RenderConfig rc;
  rc.width = *width;
  rc.height = *height;
  if (auto st = rc.validate(); !st.ok()) return bad_input(std::string(st.message()));
  const int n = *episodes;
  // the .npy data alone; headers and meta.json come on top
  const double data_bytes =
      static_cast<double>(n) * *frames *
      (static_cast<double>(*width) * *height * 3 + 4.0 * (wm::sim::kActionRowWidth + wm::sim::kPoseRowWidth));
  if (auto st = check_room(*out, data_bytes, "the dataset"); !st.ok()) return bad_input(std::string(st.message()));
  if (auto st = make_dir(*out); !st.ok()) return failure(st);
  const std::filesystem::path dir(*out);
  // dataset.json marks a complete dataset: one from an earlier run must not
  // outlive a failure of this one
  if (auto st = remove_stale((dir / "dataset.json").string()); !st.ok()) return failure(st);

  // each worker holds one whole episode in memory
  const int workers = wm::sim::episode_workers(*threads, n, wm::sim::episode_bytes(*frames, *width, *height),
                                               wm::sim::kEpisodeMemoryBudget);
  std::vector<absl::Status> results(n);
  std::atomic<int> next{0};
  std::atomic<bool> failed{false};
  const auto t0 = std::chrono::steady_clock::now();
  // each episode depends only on its own seed, so any thread may take any episode
  auto work = [&]() {
    auto raycaster = wm::sim::Raycaster::create(rc);
    for (int e = next.fetch_add(1); e < n && !failed.load(); e = next.fetch_add(1)) {
      if (!raycaster.ok()) {
        results[e] = raycaster.status();
        failed = true;
        break;
      }
      auto ep = wm::sim::run_policy_episode(wm::sim::episode_seed(*seed, e), *frames, *raycaster);
      absl::Status st = ep.ok() ? write_episode(dir / absl::StrFormat("episode_%05d", e), *ep, e, rc.width, rc.height)
                                : ep.status();
      if (!st.ok()) failed = true;
      results[e] = std::move(st);
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < workers; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  for (int e = 0; e < n; ++e) {
    if (!results[e].ok()) return failure(absl::Status(results[e].code(), absl::StrCat("episode ", e, ": ", results[e].message())));
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  std::vector<uint64_t> seeds(n);
  for (int e = 0; e < n; ++e) seeds[e] = wm::sim::episode_seed(*seed, e);
  nlohmann::json desc = {
      {"format", "wmserve-sim-dataset"},
      {"version", 1},
      {"seed", *seed},
      {"episodes", n},
      {"frames_per_episode", *frames},
      {"width", rc.width},
      {"height", rc.height},
      {"channels", 3},
      {"fov_deg", rc.fov_deg},
      {"episode_dir", "episode_%05d"},
      {"episode_seeds", seeds},
      {"files",
       {{"frames.npy", {{"dtype", "uint8"}, {"shape", {*frames, rc.height, rc.width, 3}}, {"layout", "[frame, row, column, rgb]"}}},
        {"actions.npy",
         {{"dtype", "float32"},
          {"shape", {*frames, wm::sim::kActionRowWidth}},
          {"columns", {"W", "A", "S", "D", "yaw", "pitch"}},
          {"keys", "1.0 held, 0.0 not held"},
          {"mouse", "raw degrees this frame (not divided by mouse_scale); yaw > 0 turns right, pitch > 0 looks up"}}},
        {"poses.npy",
         {{"dtype", "float32"},
          {"shape", {*frames, wm::sim::kPoseRowWidth}},
          {"columns", {"x", "y", "yaw_deg", "pitch_deg"}}}},
        {"meta.json", "episode index, seed, start and final pose"}}},
      {"alignment",
       "frame 0 is the initial view and its action row is all zeros; frame i (i >= 1) is the view after "
       "applying action i to the state of frame i - 1"},
      {"action_space", action_space_json()},
  };
  if (auto st = write_json((dir / "dataset.json").string(), desc); !st.ok()) return failure(st);
  std::fprintf(stderr, "wmsim: wrote %d episodes x %d frames to %s in %.1f s (%.0f frames/s, %d threads)\n", n, *frames,
               out->c_str(), seconds, seconds > 0 ? static_cast<double>(n) * *frames / seconds : 0.0, workers);
  return 0;
}

int cmd_script(int argc, char** argv) {
  auto flags = parse_flags(argc, argv, 2, {"seed", "frames", "out"});
  if (!flags.ok()) return bad_input(std::string(flags.status().message()));
  auto seed = get_seed(*flags);
  auto frames = get_int(*flags, "frames", 0, 1000000, 0, true);
  auto out = get_string(*flags, "out");
  for (const absl::Status& st : {seed.status(), frames.status(), out.status()}) {
    if (!st.ok()) return bad_input(std::string(st.message()));
  }
  auto actions = wm::sim::policy_actions(*seed, *frames);
  if (!actions.ok()) return failure(actions.status());
  const std::string text = absl::StrCat("# wmsim exploration policy, seed ", *seed, ", ", *frames,
                                        " actions (render with wmsim render --seed ", *seed, ")\n",
                                        wm::format_action_script(*actions, wm::default_action_space()));
  if (*out == "-") {
    std::fwrite(text.data(), 1, text.size(), stdout);
    if (auto st = wm::flush_stdout(); !st.ok()) return failure(st);
    return 0;
  }
  if (auto st = wm::write_file(*out, text.data(), text.size()); !st.ok()) return failure(st);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fputs(kUsage, stderr);
    return kExitBadInput;
  }
  const std::string cmd = argv[1];
  if (cmd == "--help" || cmd == "-h" || cmd == "help") {
    std::fputs(kUsage, stdout);
    return 0;
  }
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
  }
  if (cmd == "render") return cmd_render(argc, argv);
  if (cmd == "dataset") return cmd_dataset(argc, argv);
  if (cmd == "script") return cmd_script(argc, argv);
  return bad_input(absl::StrCat("unknown command '", cmd, "' (expected render, dataset or script)"));
}
