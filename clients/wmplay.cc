// wmplay: plays wmserve sessions.
//   wmplay --web 127.0.0.1:8080 [--server host:port] [--fps F]     play in a browser
//   wmplay --headless --script actions.txt --out DIR [--server host:port] [--seed S] [--format F] [--fps F]
// --web serves a page that shows the frames and sends the keyboard and mouse
// (clients/web_player.h). --headless plays a script and writes every frame as
// DIR/frame_%05d.jpg (by frame index) and DIR/summary.json: frames, dropped
// frames (index gaps), freezes, action-to-frame latency percentiles on this
// client's clock, and the server's timings.
#include <algorithm>
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
#include "clients/play_client.h"
#include "clients/stats.h"
#include "clients/connection_flags.h"
#include "clients/web_player.h"
#include "common/image_io.h"

ABSL_FLAG(std::string, server, "localhost:50051", "wmserve address host:port");
ABSL_FLAG(bool, headless, false, "play a script without a window (--script, --out)");
ABSL_FLAG(std::string, web, "",
          "host:port: serve a page to play in a browser (port 0: any free port, see --port_file)");
ABSL_FLAG(std::string, port_file, "", "--web: write {\"port\": P} here once listening");
ABSL_FLAG(int, max_players, 4, "--web: sessions (browser pages) at once");
ABSL_FLAG(std::string, script, "", "action script (engine/action.h format), one action per frame");
ABSL_FLAG(std::string, out, "", "output directory for frames and summary.json");
ABSL_FLAG(std::string, model, "", "model name (default: the server's)");
ABSL_FLAG(uint64_t, seed, 1, "session seed");
ABSL_FLAG(std::string, resume_token, "",
          "re-attach to the parked session of this token (Started.resume_token, printed by wmplay); the other "
          "session flags are then ignored by the server");
ABSL_FLAG(std::string, format, "", "KV-cache format (default: the server's)");
ABSL_FLAG(double, fps, 0, "0: per-action pacing, one action in flight; > 0: fixed-rate pacing at this rate, "
                           "actions sent at the same rate");
ABSL_FLAG(int, window, 1, "per-action pacing: actions in flight at most");
ABSL_FLAG(int, quality, 0, "JPEG quality (0: the server's default)");
ABSL_FLAG(std::string, prompt, "", "comma-separated JPEG start frames");
ABSL_FLAG(bool, audit, false, "ask the server to measure this session's token-selection drift");
ABSL_FLAG(bool, batch_invariant, false,
          "ask for this session's frames exactly as it gets them alone (on a CPU server: as wmgen makes them), "
          "whatever else the server runs");
ABSL_FLAG(double, timeout_s, 300, "give up after this long");

namespace v1 = ::wmserve::v1;

namespace {

int fail(const std::string& msg) {
  std::fprintf(stderr, "wmplay: %s\n", msg.c_str());
  return 1;
}

wm::ActionSpace to_space(const v1::ActionSpace& s) {
  wm::ActionSpace a;
  a.keys.assign(s.keys().begin(), s.keys().end());
  a.mouse.assign(s.mouse_axes().begin(), s.mouse_axes().end());
  a.mouse_limit = s.mouse_limit();
  a.mouse_scale = s.mouse_scale() > 0 ? s.mouse_scale() : 1.0f;
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "plays wmserve sessions, in a browser or from a script:\n"
      "  wmplay --web 127.0.0.1:8080 [--server host:port] [--fps F]\n"
      "  wmplay --headless --script actions.txt --out DIR [--server host:port] [--seed S] [--format F] [--fps F]");
  if (auto bad = wm::parse_flags_only(argc, argv)) return fail(*bad);
  if (auto st = wm::client::check_server_address(absl::GetFlag(FLAGS_server)); !st.ok())
    return fail(std::string(st.message()));
  wm::client::ChannelOptions channel_options;
  if (auto st = wm::client::apply_connection_flags(&channel_options); !st.ok()) return fail(std::string(st.message()));
  if (!(absl::GetFlag(FLAGS_fps) == 0 || wm::client::fps_in_range(absl::GetFlag(FLAGS_fps))))
    return fail("--fps must be 0 (per-action pacing; 20 with --web) or 0.001..1000 (the server's --max_fps may allow less)");
  if (!absl::GetFlag(FLAGS_web).empty()) {
    if (absl::GetFlag(FLAGS_headless)) return fail("--web and --headless are two ways to play: pick one");
    wm::client::WebPlayerOptions w;
    w.server = absl::GetFlag(FLAGS_server);
    w.channel = channel_options;
    w.listen = absl::GetFlag(FLAGS_web);
    w.port_file = absl::GetFlag(FLAGS_port_file);
    w.fps = absl::GetFlag(FLAGS_fps) > 0 ? absl::GetFlag(FLAGS_fps) : 20;
    w.model = absl::GetFlag(FLAGS_model);
    w.format = absl::GetFlag(FLAGS_format);
    w.quality = absl::GetFlag(FLAGS_quality);
    w.max_players = absl::GetFlag(FLAGS_max_players);
    return wm::client::run_web_player(w);
  }
  if (!absl::GetFlag(FLAGS_headless))
    return fail("pick a way to play: --web HOST:PORT (a browser) or --headless --script FILE --out DIR");
  const std::string out = absl::GetFlag(FLAGS_out);
  if (absl::GetFlag(FLAGS_script).empty() || out.empty()) return fail("--script and --out are required");
  if (absl::GetFlag(FLAGS_window) < 1) return fail("--window must be at least 1");
  if (!wm::client::timeout_in_range(absl::GetFlag(FLAGS_timeout_s)))
    return fail("--timeout_s must be in (0, 604800]");
  // bounded before anything is read: no wmserve takes more than 256 prompt
  // frames (its --max_prompt_frames, 16 by default), and the whole Start is
  // held in memory (a server takes 4 MiB by default, --max_request_bytes)
  constexpr size_t kMaxPrompts = 256;
  constexpr size_t kMaxPromptBytes = size_t{64} << 20;
  const std::vector<std::string> prompts = absl::StrSplit(absl::GetFlag(FLAGS_prompt), ',', absl::SkipEmpty());
  if (prompts.size() > kMaxPrompts)
    return fail(absl::StrCat("--prompt must name at most ", kMaxPrompts, " files (a server takes at most that many "
                             "prompt frames, 16 by default), not ", prompts.size()));

  // --timeout_s bounds the whole run: the first call and the session share it
  const auto run_deadline =
      std::chrono::steady_clock::now() +
      std::chrono::microseconds(static_cast<int64_t>(absl::GetFlag(FLAGS_timeout_s) * 1e6));
  auto channel = wm::client::make_channel(absl::GetFlag(FLAGS_server), channel_options);
  auto stub = v1::WorldModel::NewStub(channel);
  v1::ListModelsResponse models;
  {
    grpc::ClientContext ctx;
    // at most 10 s: a port that takes the connection and never answers holds
    // the call to its deadline
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::min<std::chrono::steady_clock::duration>(std::chrono::seconds(10),
                                                                   run_deadline - std::chrono::steady_clock::now()));
    grpc::Status st = stub->ListModels(&ctx, {}, &models);
    if (!st.ok())
      return fail(wm::client::describe_call_failure(absl::GetFlag(FLAGS_server), st));
  }
  const v1::ModelInfo* model = nullptr;
  for (const auto& m : models.models())
    if (absl::GetFlag(FLAGS_model).empty() || m.name() == absl::GetFlag(FLAGS_model)) model = &m;
  if (model == nullptr) return fail("the server does not serve model '" + absl::GetFlag(FLAGS_model) + "'");
  auto actions = wm::load_action_script(absl::GetFlag(FLAGS_script), to_space(model->action_space()));
  if (!actions.ok()) return fail(std::string(actions.status().message()));
  if (actions->empty()) return fail(absl::GetFlag(FLAGS_script) + ": the script has no actions");
  // an Action carries the first two mouse axes (docs/API.md): a movement on
  // a later one would be dropped, and the frames would differ from wmgen's
  const auto& axes = model->action_space().mouse_axes();
  for (size_t i = 0; i < actions->size(); ++i)
    for (int k = 2; k < std::min<int>(axes.size(), wm::kMaxMouseAxes); ++k)
      if ((*actions)[i].mouse[static_cast<size_t>(k)] != 0.0f)
        return fail(absl::StrCat(absl::GetFlag(FLAGS_script), ": action ", i + 1, " moves mouse axis '", axes[k],
                                 "', which a Play stream cannot carry (only the first two axes)"));

  wm::client::PlayConfig pc;
  pc.start.set_model(absl::GetFlag(FLAGS_model));
  pc.start.set_seed(absl::GetFlag(FLAGS_seed));
  pc.start.set_cache_format(absl::GetFlag(FLAGS_format));
  pc.start.set_jpeg_quality(absl::GetFlag(FLAGS_quality));
  pc.start.set_audit(absl::GetFlag(FLAGS_audit));
  pc.start.set_batch_invariant(absl::GetFlag(FLAGS_batch_invariant));
  pc.start.set_resume_token(absl::GetFlag(FLAGS_resume_token));
  const double fps = absl::GetFlag(FLAGS_fps);
  if (fps > 0) {
    pc.start.set_pacing(v1::PACING_FIXED_RATE);
    pc.start.set_fps(fps);
    pc.send_fps = fps;
  } else {
    pc.start.set_pacing(v1::PACING_PER_ACTION);
    pc.window = absl::GetFlag(FLAGS_window);
  }
  size_t prompt_bytes = 0;
  for (const std::string& p : prompts) {
    auto bytes = wm::read_file(p, kMaxPromptBytes - prompt_bytes);
    if (!bytes.ok())
      return fail(prompt_bytes == 0 ? std::string(bytes.status().message())
                                    : absl::StrCat(bytes.status().message(), " (the --prompt files together may be ",
                                                   kMaxPromptBytes >> 20, " MiB at most)"));
    prompt_bytes += bytes->size();
    pc.start.add_prompt_jpeg(*bytes);
  }
  pc.actions = std::move(*actions);
  // what the first call and reading the prompts left of --timeout_s
  pc.timeout_s = std::chrono::duration<double>(run_deadline - std::chrono::steady_clock::now()).count();
  if (pc.timeout_s <= 0)
    return fail(absl::StrFormat("--timeout_s=%g ran out before the session started",
                                absl::GetFlag(FLAGS_timeout_s)));

  std::error_code ec;
  std::filesystem::create_directories(out, ec);
  if (ec) return fail("cannot create " + out + ": " + ec.message());

  const wm::client::PlayResult r = wm::client::play(channel, pc);
  if (r.frames.empty() && !r.status.ok())
    return fail(absl::StrFormat("%s: %s", wm::client::status_code_name(r.status.error_code()), r.status.error_message()));
  // the previous run's output goes only now, frames and summary together: a
  // run that fails before its first frame (a format the server refuses, say)
  // leaves DIR as the last run wrote it, and frames never sit beside a
  // summary that does not count them
  for (const auto& e : std::filesystem::directory_iterator(out, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("frame_", 0) == 0 || name == "summary.json") std::filesystem::remove(e.path(), ec);
  }

  std::vector<int64_t> indices;
  std::vector<double> queue_us, model_us, encode_us;
  int64_t deadline_missed = 0;
  for (const auto& f : r.frames) {
    const std::string path = absl::StrFormat("%s/frame_%05d.jpg", out, f.index);
    if (auto st = wm::write_file(path, f.jpeg.data(), f.jpeg.size()); !st.ok()) return fail(std::string(st.message()));
    indices.push_back(f.index);
    queue_us.push_back(static_cast<double>(f.timings.queue_us()));
    model_us.push_back(static_cast<double>(f.timings.model_us()));
    encode_us.push_back(static_cast<double>(f.timings.encode_us()));
    deadline_missed += f.deadline_missed ? 1 : 0;
  }
  const auto intervals = r.intervals_s();
  const auto freezes = wm::client::count_freezes(intervals);
  const auto ms = [](double s) { return s * 1e3; };
  nlohmann::json j;
  j["server"] = absl::GetFlag(FLAGS_server);
  j["status"] = wm::client::status_code_name(r.status.error_code());
  j["status_message"] = r.status.error_message();
  j["session_id"] = r.started.session_id();
  j["resume_token"] = r.started.resume_token();
  j["resumed"] = r.started.resumed();
  j["model"] = r.started.model().name();
  j["cache_format"] = r.started.cache_format();
  j["seed"] = absl::GetFlag(FLAGS_seed);
  j["pacing"] = fps > 0 ? "fixed_rate" : "per_action";
  j["fps_requested"] = fps;
  j["width"] = r.started.width();
  j["height"] = r.started.height();
  j["prompt_frames"] = r.started.prompt_frames();
  j["actions_sent"] = r.actions_sent;
  j["frames"] = r.frames.size();
  j["dropped_frames"] = wm::client::count_index_gaps(indices);
  j["server_frames_dropped"] = r.frames.empty() ? 0 : r.frames.back().frames_dropped;
  j["freezes"] = freezes.count;
  j["freeze_seconds"] = freezes.total_seconds;
  j["deadline_missed_frames"] = deadline_missed;
  j["wall_seconds"] = r.wall_s;
  j["frames_per_second"] = r.wall_s > 0 ? static_cast<double>(r.frames.size()) / r.wall_s : 0;
  j["action_to_frame_ms"] = {{"p50", ms(wm::client::percentile(r.action_to_frame_s, 0.50))},
                             {"p95", ms(wm::client::percentile(r.action_to_frame_s, 0.95))},
                             {"p99", ms(wm::client::percentile(r.action_to_frame_s, 0.99))},
                             {"mean", ms(wm::client::mean(r.action_to_frame_s))},
                             {"count", r.action_to_frame_s.size()}};
  j["inter_frame_ms"] = {{"mean", ms(wm::client::mean(intervals))},
                         {"p99", ms(wm::client::percentile(intervals, 0.99))}};
  j["server_timings_us"] = {{"queue_mean", wm::client::mean(queue_us)},
                            {"model_mean", wm::client::mean(model_us)},
                            {"model_p99", wm::client::percentile(model_us, 0.99)},
                            {"encode_mean", wm::client::mean(encode_us)}};
  j["kv_cache_bytes"] = r.frames.empty() ? 0 : r.frames.back().kv_cache_bytes;
  j["kv_reserved_bytes"] = r.started.kv_reserved_bytes();
  nlohmann::json events = nlohmann::json::array();
  for (const auto& e : r.events)
    events.push_back({{"code", e.code()}, {"message", e.message()}, {"action_seq", e.action_seq()}});
  j["events"] = events;
  const std::string text = j.dump(2) + "\n";
  if (auto st = wm::write_file(out + "/summary.json", text.data(), text.size()); !st.ok())
    return fail(std::string(st.message()));

  std::printf("wmplay: %zu frames of %dx%d from %s (session %s, %s) -> %s/frame_*.jpg\n", r.frames.size(),
              r.started.width(), r.started.height(), absl::GetFlag(FLAGS_server).c_str(),
              r.started.session_id().c_str(), r.started.cache_format().c_str(), out.c_str());
  std::printf("wmplay: action-to-frame p50 %.1f ms, p95 %.1f ms, p99 %.1f ms; %.1f frames/s; dropped %lld, "
              "freezes %lld; server model %.1f ms, encode %.2f ms per frame\n",
              ms(wm::client::percentile(r.action_to_frame_s, 0.5)),
              ms(wm::client::percentile(r.action_to_frame_s, 0.95)),
              ms(wm::client::percentile(r.action_to_frame_s, 0.99)), j["frames_per_second"].get<double>(),
              static_cast<long long>(wm::client::count_index_gaps(indices)), static_cast<long long>(freezes.count),
              wm::client::mean(model_us) / 1e3, wm::client::mean(encode_us) / 1e3);
  std::printf("wmplay: summary in %s/summary.json\n", out.c_str());
  if (!r.status.ok()) {
    std::fprintf(stderr, "wmplay: the stream ended with %s: %s\n", wm::client::status_code_name(r.status.error_code()),
                 r.status.error_message().c_str());
    return 1;
  }
  return 0;
}
