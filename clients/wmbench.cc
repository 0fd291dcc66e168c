// wmbench: N concurrent sessions against a wmserve; throughput, latency
// percentiles (client clock), errors and the server's KV bytes.
//   wmbench --sessions N --frames M [--pacing per_action|realtime --fps F] [--json]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <system_error>
#include <thread>

#include <nlohmann/json.hpp>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_format.h"
#include "clients/play_client.h"
#include "clients/connection_flags.h"
#include "common/cli.h"
#include "clients/stats.h"

ABSL_FLAG(std::string, server, "localhost:50051", "wmserve address host:port");
ABSL_FLAG(int, sessions, 4, "concurrent sessions");
ABSL_FLAG(int, frames, 50, "actions per session (one frame each with per-action pacing; realtime: the "
                           "session lasts frames / fps seconds)");
ABSL_FLAG(std::string, pacing, "per_action", "per_action (lockstep, one action in flight) or realtime");
ABSL_FLAG(double, fps, 10, "realtime: frames per second per session");
ABSL_FLAG(std::string, format, "", "KV-cache format (default: the server's)");
ABSL_FLAG(uint64_t, seed, 1, "seed of the first session (session i uses seed + i)");
ABSL_FLAG(int, window, 1, "per-action pacing: actions in flight per session");
ABSL_FLAG(bool, json, false, "print one JSON object instead of text");
ABSL_FLAG(int, server_pid, 0, "sample this local process's resident memory (the server's RSS) during the run");
ABSL_FLAG(double, timeout_s, 600, "per session");

namespace v1 = ::wmserve::v1;

namespace {

constexpr int kMaxSessions = 1000;
constexpr int kMaxFrames = 1000000;
constexpr int64_t kMaxTotalFrames = 10000000;  // all sessions: ~2 GB of records

int64_t rss_bytes(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) {
      std::istringstream ss(line.substr(6));
      int64_t kb = 0;
      ss >> kb;
      return kb * 1024;
    }
  }
  return 0;
}

// a random walk over the action space, deterministic per session
std::vector<wm::Action> random_actions(int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<wm::Action> out;
  for (int i = 0; i < n; ++i) {
    wm::Action a;
    a.keys = static_cast<uint32_t>(rng() % 16);
    a.mouse[0] = static_cast<float>(static_cast<int>(rng() % 21) - 10);
    a.mouse[1] = static_cast<float>(static_cast<int>(rng() % 5) - 2);
    out.push_back(a);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "load test for wmserve: N concurrent sessions\n"
      "  wmbench --sessions N --frames M [--pacing per_action|realtime --fps F] [--json]");
  if (auto bad = wm::parse_flags_only(argc, argv)) {
    std::fprintf(stderr, "wmbench: %s\n", bad->c_str());
    return 2;
  }
  const int n = absl::GetFlag(FLAGS_sessions);
  const int frames = absl::GetFlag(FLAGS_frames);
  const std::string pacing = absl::GetFlag(FLAGS_pacing);
  const double fps = absl::GetFlag(FLAGS_fps);
  // a session is a thread and a connection here
  if (n < 1 || n > kMaxSessions) {
    std::fprintf(stderr, "wmbench: --sessions must be 1..%d\n", kMaxSessions);
    return 2;
  }
  // every session keeps its actions and a record per frame (~200 bytes each)
  if (frames < 1 || frames > kMaxFrames) {
    std::fprintf(stderr, "wmbench: --frames must be 1..%d\n", kMaxFrames);
    return 2;
  }
  if (static_cast<int64_t>(n) * frames > kMaxTotalFrames) {
    std::fprintf(stderr, "wmbench: --sessions x --frames = %lld is above %lld (the per-frame records must fit in memory)\n",
                 static_cast<long long>(n) * frames, static_cast<long long>(kMaxTotalFrames));
    return 2;
  }
  if (absl::GetFlag(FLAGS_window) < 1) {
    std::fprintf(stderr, "wmbench: --window must be at least 1\n");
    return 2;
  }
  if (pacing != "per_action" && pacing != "realtime") {
    std::fprintf(stderr, "wmbench: --pacing is per_action or realtime\n");
    return 2;
  }
  if (pacing == "realtime" && !wm::client::fps_in_range(fps)) {
    std::fprintf(stderr, "wmbench: --fps must be 0.001..1000 with --pacing realtime (the server's --max_fps may allow less)\n");
    return 2;
  }
  if (!wm::client::timeout_in_range(absl::GetFlag(FLAGS_timeout_s))) {
    std::fprintf(stderr, "wmbench: --timeout_s must be in (0, 604800]\n");
    return 2;
  }
  const std::string target = absl::GetFlag(FLAGS_server);
  if (auto st = wm::client::check_server_address(target); !st.ok()) {
    std::fprintf(stderr, "wmbench: %s\n", std::string(st.message()).c_str());
    return 2;
  }
  const int pid = absl::GetFlag(FLAGS_server_pid);
  if (pid < 0 || (pid > 0 && rss_bytes(pid) <= 0)) {
    std::fprintf(stderr, "wmbench: --server_pid %d: no such process whose memory can be read here\n", pid);
    return 2;
  }

  wm::client::ChannelOptions channel_options;
  if (auto st = wm::client::apply_connection_flags(&channel_options); !st.ok()) {
    std::fprintf(stderr, "wmbench: %s\n", std::string(st.message()).c_str());
    return 2;
  }
  // the server's view, polled during the run
  auto info_channel = wm::client::make_channel(target, channel_options);
  auto stub = v1::WorldModel::NewStub(info_channel);
  // at most 5 s a call, and never longer than a session may take: a port that
  // takes the connection and never answers holds each call to its deadline
  const auto info_timeout = std::min<std::chrono::microseconds>(
      std::chrono::seconds(5), std::chrono::microseconds(static_cast<int64_t>(absl::GetFlag(FLAGS_timeout_s) * 1e6)));
  auto server_info = [&](v1::ServerInfo* info) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + info_timeout);
    return stub->GetServerInfo(&ctx, {}, info);
  };
  v1::ServerInfo before;
  if (grpc::Status st = server_info(&before); !st.ok()) {
    std::fprintf(stderr, "wmbench: %s\n", wm::client::describe_call_failure(target, st).c_str());
    return 1;
  }
  const int64_t rss_before = pid > 0 ? rss_bytes(pid) : 0;
  std::atomic<bool> running{true};
  std::atomic<int64_t> kv_used_peak{0}, kv_reserved_peak{0}, rss_peak{rss_before};
  std::thread poller([&] {
    while (running) {
      v1::ServerInfo info;
      if (server_info(&info).ok()) {
        kv_used_peak = std::max<int64_t>(kv_used_peak, info.kv_used_bytes());
        kv_reserved_peak = std::max<int64_t>(kv_reserved_peak, info.kv_reserved_bytes());
      }
      if (pid > 0) rss_peak = std::max(rss_peak.load(), rss_bytes(pid));
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });

  std::vector<wm::client::PlayResult> results(static_cast<size_t>(n));
  std::vector<std::thread> players;
  const int64_t t0 = wm::client::now_us();
  players.reserve(static_cast<size_t>(n));
  int started = 0;
  // a player's thread may not start (the machine's thread limit): the
  // players that did run on, and the rest count as errors
  for (int i = 0; i < n; ++i) {
    auto play_one = [&, i] {
      wm::client::ChannelOptions co = channel_options;
      co.own_connection = true;  // one connection per player, as real players have
      auto channel = wm::client::make_channel(target, co);
      wm::client::PlayConfig pc;
      pc.start.set_seed(absl::GetFlag(FLAGS_seed) + static_cast<uint64_t>(i));
      pc.start.set_cache_format(absl::GetFlag(FLAGS_format));
      if (pacing == "realtime") {
        pc.start.set_pacing(v1::PACING_FIXED_RATE);
        pc.start.set_fps(fps);
        pc.send_fps = fps;
        // players act at any phase of the server's ticks: spread them evenly
        pc.start_delay_s = (static_cast<double>(i) + 0.5) / static_cast<double>(n) / fps;
      } else {
        pc.start.set_pacing(v1::PACING_PER_ACTION);
        pc.window = absl::GetFlag(FLAGS_window);
      }
      pc.actions = random_actions(frames, 1000 + static_cast<uint64_t>(i));
      pc.keep_jpeg = false;
      pc.timeout_s = absl::GetFlag(FLAGS_timeout_s);
      results[static_cast<size_t>(i)] = wm::client::play(channel, pc);
    };
    try {
      players.emplace_back(play_one);
      ++started;
    } catch (const std::system_error& e) {
      std::fprintf(stderr, "wmbench: started %d of %d players: %s\n", started, n, e.what());
      for (int j = i; j < n; ++j)
        results[static_cast<size_t>(j)].status =
            grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "wmbench could not start this player's thread");
      break;
    }
  }
  for (auto& t : players) t.join();
  const double wall = static_cast<double>(wm::client::now_us() - t0) / 1e6;
  running = false;
  poller.join();

  std::vector<double> lat, intervals, model_us, queue_us, session_fps;
  int64_t total_frames = 0, dropped = 0, freezes = 0, late = 0, kv_last_sum = 0, errors = 0;
  nlohmann::json error_list = nlohmann::json::array();
  for (const auto& r : results) {
    if (!r.status.ok()) {
      ++errors;
      error_list.push_back(absl::StrFormat("%s: %s", wm::client::status_code_name(r.status.error_code()),
                                           r.status.error_message()));
    }
    total_frames += static_cast<int64_t>(r.frames.size());
    lat.insert(lat.end(), r.action_to_frame_s.begin(), r.action_to_frame_s.end());
    const auto iv = r.intervals_s();
    intervals.insert(intervals.end(), iv.begin(), iv.end());
    // the rate this player saw, first frame to last (a session with < 2 frames saw none)
    double span = 0;
    for (double v : iv) span += v;
    session_fps.push_back(span > 0 ? static_cast<double>(iv.size()) / span : 0.0);
    freezes += wm::client::count_freezes(iv).count;
    std::vector<int64_t> idx;
    for (const auto& f : r.frames) {
      idx.push_back(f.index);
      model_us.push_back(static_cast<double>(f.timings.model_us()));
      queue_us.push_back(static_cast<double>(f.timings.queue_us()));
      late += f.deadline_missed ? 1 : 0;
    }
    dropped += wm::client::count_index_gaps(idx);
    if (!r.frames.empty()) kv_last_sum += r.frames.back().kv_cache_bytes;
  }
  const auto ms = [](double s) { return s * 1e3; };
  nlohmann::json j;
  j["server"] = target;
  j["sessions"] = n;
  j["frames_per_session"] = frames;
  j["pacing"] = pacing;
  if (pacing == "realtime") j["fps"] = fps;
  j["cache_format"] = absl::GetFlag(FLAGS_format).empty() ? before.default_cache_format() : absl::GetFlag(FLAGS_format);
  j["wall_seconds"] = wall;
  j["frames"] = total_frames;
  j["frames_per_second"] = wall > 0 ? static_cast<double>(total_frames) / wall : 0;
  j["action_to_frame_ms"] = {{"p50", ms(wm::client::percentile(lat, 0.5))},
                             {"p95", ms(wm::client::percentile(lat, 0.95))},
                             {"p99", ms(wm::client::percentile(lat, 0.99))},
                             {"mean", ms(wm::client::mean(lat))}};
  j["session_fps"] = {{"min", session_fps.empty() ? 0.0 : *std::min_element(session_fps.begin(), session_fps.end())},
                      {"mean", wm::client::mean(session_fps)}};
  j["inter_frame_ms"] = {{"mean", ms(wm::client::mean(intervals))}, {"p99", ms(wm::client::percentile(intervals, 0.99))}};
  j["server_model_ms_mean"] = wm::client::mean(model_us) / 1e3;
  j["server_queue_ms_mean"] = wm::client::mean(queue_us) / 1e3;
  j["dropped_frames"] = dropped;
  j["freezes"] = freezes;
  j["deadline_missed_frames"] = late;
  j["errors"] = errors;
  j["error_messages"] = error_list;
  j["kv_cache_bytes_per_session"] = n > 0 ? kv_last_sum / n : 0;
  j["server_kv_used_bytes_peak"] = kv_used_peak.load();
  j["server_kv_reserved_bytes_peak"] = kv_reserved_peak.load();
  j["server_kv_capacity_bytes"] = before.kv_capacity_bytes();
  if (pid > 0) {
    j["server_rss_bytes_before"] = rss_before;
    j["server_rss_bytes_peak"] = rss_peak.load();
    j["server_rss_bytes_per_session"] = (rss_peak.load() - rss_before) / n;
  }
  if (absl::GetFlag(FLAGS_json)) {
    std::printf("%s\n", j.dump(2).c_str());
  } else {
    std::printf("wmbench: %d sessions x %d actions (%s%s) against %s\n", n, frames, pacing.c_str(),
                pacing == "realtime" ? absl::StrFormat(" at %.1f fps", fps).c_str() : "", target.c_str());
    std::printf("  throughput     %.1f frames/s (%lld frames in %.2f s)\n", j["frames_per_second"].get<double>(),
                static_cast<long long>(total_frames), wall);
    std::printf("  per session    min %.1f frames/s, mean %.1f\n", j["session_fps"]["min"].get<double>(),
                j["session_fps"]["mean"].get<double>());
    std::printf("  action->frame  p50 %.1f ms  p95 %.1f ms  p99 %.1f ms\n", ms(wm::client::percentile(lat, 0.5)),
                ms(wm::client::percentile(lat, 0.95)), ms(wm::client::percentile(lat, 0.99)));
    std::printf("  inter-frame    mean %.1f ms  p99 %.1f ms; freezes %lld, dropped %lld, late %lld\n",
                ms(wm::client::mean(intervals)), ms(wm::client::percentile(intervals, 0.99)),
                static_cast<long long>(freezes), static_cast<long long>(dropped), static_cast<long long>(late));
    std::printf("  server step    %.1f ms mean; queue %.1f ms mean\n", wm::client::mean(model_us) / 1e3,
                wm::client::mean(queue_us) / 1e3);
    std::printf("  KV cache       %lld bytes/session at the end; server peak used %lld, reserved %lld of %lld\n",
                static_cast<long long>(n > 0 ? kv_last_sum / n : 0), static_cast<long long>(kv_used_peak.load()),
                static_cast<long long>(kv_reserved_peak.load()), static_cast<long long>(before.kv_capacity_bytes()));
    if (pid > 0)
      std::printf("  server RSS     %.1f MiB before, %.1f MiB peak (%.2f MiB/session)\n", rss_before / 1048576.0,
                  rss_peak.load() / 1048576.0, (rss_peak.load() - rss_before) / 1048576.0 / n);
    std::printf("  errors         %lld\n", static_cast<long long>(errors));
    for (const auto& e : error_list) std::printf("    %s\n", e.get<std::string>().c_str());
  }
  return errors == 0 ? 0 : 1;
}
