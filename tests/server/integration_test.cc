// Integration: the real wmserve binary on a loopback port with a tiny
// random checkpoint, driven by the real client library (clients/).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <future>
#include <optional>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "clients/play_client.h"
#include "clients/stats.h"
#include "common/image_io.h"
#include "engine/model_config.h"
#include "engine/weights.h"
#include "grpcpp/generic/generic_stub.h"
#include "tests/server/server_process.h"

namespace wm {
namespace {

namespace v1 = ::wmserve::v1;
using client::PlayConfig;
using client::PlayResult;
using testing::ServerProcess;

constexpr char kScript[] =
    "W 0 0 *4\n"
    "- 10 0 *3\n"
    "WA -5 2 *3\n"
    "S 0 0 *2\n"
    "D 20 -3 *4\n";

std::vector<Action> script_actions() { return *parse_action_script(kScript, default_action_space()); }

const std::string& tiny_model() {
  static const std::string dir = testing::make_tiny_model("tiny");
  return dir;
}

// the next Frame of a stream, skipping events; false at its end
bool next_frame(client::PlayStream& s, v1::Frame* frame);

// wmserve with these flags stops at once (exit 1), saying `says`
void expect_server_refuses(const std::vector<std::string>& flags, const std::string& says) {
  std::vector<std::string> argv = {WMSERVE_BIN, "--model=" + tiny_model(), "--host=127.0.0.1", "--port=0",
                                   "--metrics_port=-1"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  std::string log;
  EXPECT_EQ(testing::run_program(argv, &log), 1) << flags.back() << ":\n" << log;
  EXPECT_TRUE(absl::StrContains(log, says)) << flags.back() << ":\n" << log;
}

std::shared_ptr<grpc::Channel> channel(const ServerProcess& s) { return client::make_channel(s.target()); }

PlayConfig per_action(uint64_t seed, std::vector<Action> actions) {
  PlayConfig pc;
  pc.start.set_seed(seed);
  pc.start.set_pacing(v1::PACING_PER_ACTION);
  pc.actions = std::move(actions);
  pc.timeout_s = 60;
  return pc;
}

// the offline rollout: wmgen's frames for (model, seed, script[, prompt])
std::vector<std::string> wmgen_frames(const std::string& model, uint64_t seed, const std::string& prompt = "",
                                      int quality = 90, const std::string& script_text = kScript) {
  const std::string dir = testing::fresh_dir(absl::StrFormat("wmgen_%d", seed));
  const std::string script = dir + "/script.txt";
  EXPECT_TRUE(write_file(script, script_text.data(), script_text.size()).ok());
  std::vector<std::string> argv = {WMGEN_BIN,           "--model=" + model, "--seed=" + std::to_string(seed),
                                   "--script=" + script, "--out=" + dir,     "--quality=" + std::to_string(quality),
                                   "--threads=1"};
  if (!prompt.empty()) argv.push_back("--prompt=" + prompt);
  std::string log;
  EXPECT_EQ(testing::run_program(argv, &log), 0) << log;
  std::vector<std::string> frames;
  for (int i = 0;; ++i) {
    auto bytes = read_file(absl::StrFormat("%s/frame_%05d.jpg", dir, i));
    if (!bytes.ok()) break;
    frames.push_back(*bytes);
  }
  return frames;
}

// mean absolute difference of two JPEGs' decoded pixels (256 if either is broken)
double mean_pixel_diff(const std::string& a, const std::string& b, int* max_diff = nullptr) {
  auto x = jpeg_decode(a.data(), a.size()), y = jpeg_decode(b.data(), b.size());
  if (!x.ok() || !y.ok() || x->pixels.size() != y->pixels.size()) return 256;
  int64_t sum = 0;
  int most = 0;
  for (size_t i = 0; i < x->pixels.size(); ++i) {
    const int d = std::abs(x->pixels[i] - y->pixels[i]);
    sum += d;
    most = std::max(most, d);
  }
  if (max_diff != nullptr) *max_diff = most;
  return static_cast<double>(sum) / static_cast<double>(x->pixels.size());
}

// PSNR (dB, 8-bit) of two JPEGs' decoded pixels; 0 if either is broken
double jpeg_psnr(const std::string& a, const std::string& b) {
  auto x = jpeg_decode(a.data(), a.size()), y = jpeg_decode(b.data(), b.size());
  if (!x.ok() || !y.ok() || x->pixels.size() != y->pixels.size() || x->pixels.empty()) return 0;
  double se = 0;
  for (size_t i = 0; i < x->pixels.size(); ++i) {
    const double d = static_cast<double>(x->pixels[i]) - y->pixels[i];
    se += d * d;
  }
  const double mse = se / static_cast<double>(x->pixels.size());
  return mse == 0 ? 99.0 : 10.0 * std::log10(255.0 * 255.0 / mse);
}

grpc::Status play_status(const ServerProcess& s, const std::vector<v1::PlayRequest>& requests,
                         std::vector<v1::PlayResponse>* responses = nullptr) {
  client::PlayStream stream(channel(s), std::chrono::system_clock::now() + std::chrono::seconds(20));
  for (const auto& r : requests) stream.send(r);
  stream.writes_done();
  v1::PlayResponse resp;
  while (stream.read(&resp))
    if (responses != nullptr) responses->push_back(resp);
  return stream.finish();
}

// a bidi stream of `method` with raw messages (any bytes), half-closed after
// the last; returns its status and the bytes of every message the server
// sent. hold_last: the last message waits until that many have come
grpc::Status raw_stream_status(const ServerProcess& s, const std::string& method,
                               const std::vector<std::string>& messages, std::vector<std::string>* responses,
                               size_t hold_last = 0) {
  auto ch = channel(s);
  grpc::GenericStub generic(ch);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  grpc::CompletionQueue cq;
  auto call = generic.PrepareCall(&ctx, method, &cq);
  auto next = [&](intptr_t want) {
    void* tag = nullptr;
    bool ok = false;
    EXPECT_TRUE(cq.Next(&tag, &ok));
    EXPECT_EQ(reinterpret_cast<intptr_t>(tag), want);
    return ok;
  };
  auto read = [&] {
    grpc::ByteBuffer in;
    call->Read(&in, reinterpret_cast<void*>(4));
    if (!next(4)) return false;
    std::vector<grpc::Slice> slices;
    EXPECT_TRUE(in.Dump(&slices).ok());
    std::string bytes;
    for (const auto& sl : slices) bytes.append(reinterpret_cast<const char*>(sl.begin()), sl.size());
    responses->push_back(std::move(bytes));
    return true;
  };
  call->StartCall(reinterpret_cast<void*>(1));
  bool open = next(1);
  for (size_t i = 0; i < messages.size(); ++i) {
    if (i + 1 == messages.size())
      while (open && responses->size() < hold_last) open = read();
    if (!open) break;
    grpc::Slice slice(messages[i]);
    grpc::ByteBuffer out(&slice, 1);
    call->Write(out, reinterpret_cast<void*>(2));
    open = next(2);
  }
  if (open) {
    call->WritesDone(reinterpret_cast<void*>(3));
    next(3);
  }
  while (read()) {
  }
  grpc::Status st;
  call->Finish(&st, reinterpret_cast<void*>(5));
  next(5);
  cq.Shutdown();
  void* tag;
  bool ok;
  while (cq.Next(&tag, &ok)) {
  }
  return st;
}

// a Play stream of raw messages; *responses (if given) gets what the server sent
grpc::Status raw_play_status(const ServerProcess& s, const std::vector<std::string>& messages,
                             std::vector<v1::PlayResponse>* responses, size_t hold_last = 0) {
  std::vector<std::string> got;
  const grpc::Status st = raw_stream_status(s, "/wmserve.v1.WorldModel/Play", messages, &got, hold_last);
  for (const std::string& bytes : got) {
    v1::PlayResponse r;
    EXPECT_TRUE(r.ParseFromString(bytes));
    if (responses != nullptr) responses->push_back(std::move(r));
  }
  return st;
}

// a unary call of `method` with raw request bytes
grpc::Status raw_unary_status(const ServerProcess& s, const std::string& method, const std::string& request,
                              grpc_compression_algorithm compression = GRPC_COMPRESS_NONE) {
  auto ch = channel(s);
  grpc::GenericStub generic(ch);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  ctx.set_compression_algorithm(compression);
  grpc::CompletionQueue cq;
  grpc::Slice slice(request);
  const grpc::ByteBuffer out(&slice, 1);
  auto call = generic.PrepareUnaryCall(&ctx, method, out, &cq);
  call->StartCall();
  grpc::ByteBuffer in;
  grpc::Status st;
  call->Finish(&in, &st, reinterpret_cast<void*>(1));
  void* tag = nullptr;
  bool ok = false;
  EXPECT_TRUE(cq.Next(&tag, &ok));
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
  return st;
}

v1::PlayRequest start_req(std::function<void(v1::Start*)> edit = nullptr) {
  v1::PlayRequest r;
  r.mutable_start()->set_seed(1);
  if (edit) edit(r.mutable_start());
  return r;
}

v1::PlayRequest action_req(uint64_t seq, uint32_t keys = 1, float dx = 0, float dy = 0) {
  v1::PlayRequest r;
  *r.mutable_action() = client::to_proto(Action{keys, {dx, dy}, 0}, seq, client::now_us());
  return r;
}

// the session log's lines once it holds at least `want` (its own thread
// writes them, and a half-closed session's end once its stream is over),
// or what it holds after about 5 s
std::vector<nlohmann::json> session_log_lines(const std::string& path, size_t want) {
  std::vector<nlohmann::json> lines;
  for (int i = 0; i < 250; ++i) {
    lines.clear();
    std::istringstream text(read_file(path).value_or(""));
    for (std::string line; std::getline(text, line);) lines.push_back(nlohmann::json::parse(line));
    if (lines.size() >= want) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return lines;
}

std::map<std::string, double> scrape(const ServerProcess& s) {
  int code = 0;
  const std::string body = testing::http_get(s.metrics_port(), "/metrics", &code);
  EXPECT_EQ(code, 200);
  return testing::parse_prometheus(body);
}

// the metric once it reads `want` (the engine thread republishes gauges after
// the fact), or its last value after about 4 s (-1: absent)
double wait_for_metric(const ServerProcess& s, const std::string& name, double want) {
  double v = -1;
  for (int i = 0; i < 200; ++i) {
    const auto m = scrape(s);
    v = m.count(name) != 0 ? m.at(name) : -1;
    if (v == want) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return v;
}

TEST(ServerIntegration, ServesModelsInfoHealthAndReflection) {
  auto server = ServerProcess::start(tiny_model(), {"--kv_budget_bytes=1000000"});
  ASSERT_NE(server, nullptr);
  auto ch = channel(*server);
  auto stub = v1::WorldModel::NewStub(ch);
  v1::ListModelsResponse models;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub->ListModels(&ctx, {}, &models).ok());
  }
  ASSERT_EQ(models.models_size(), 1);
  const v1::ModelInfo& m = models.models(0);
  EXPECT_EQ(m.name(), "tiny-test");
  EXPECT_EQ(m.width(), 32);
  EXPECT_EQ(m.frames_per_block(), 1);
  EXPECT_EQ(m.default_cache_format(), "fp16");
  EXPECT_EQ(m.action_space().keys_size(), 4);
  EXPECT_GT(m.parameters(), 0);
  v1::ServerInfo info;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub->GetServerInfo(&ctx, {}, &info).ok());
  }
  EXPECT_EQ(info.kv_capacity_bytes(), 1000000);
  EXPECT_EQ(info.kv_free_bytes(), 1000000);
  // the connection limits' defaults
  EXPECT_EQ(info.max_connections_per_client(), 64);
  EXPECT_EQ(info.client_connection_rate(), 16);
  EXPECT_EQ(info.client_connection_burst(), 64);
  EXPECT_EQ(info.max_calls_per_connection(), 200);
  EXPECT_EQ(info.sessions_active(), 0);
  EXPECT_TRUE(info.admitting());
  EXPECT_FALSE(info.draining());
  EXPECT_FALSE(info.version().empty());

  EXPECT_TRUE(client::health_check(ch, "").serving());
  EXPECT_TRUE(client::health_check(ch, "wmserve.v1.admit").serving());
  EXPECT_EQ(client::health_check(ch, "no.such.service").status.error_code(), grpc::StatusCode::NOT_FOUND);

  // reflection: list the services with a hand-made ServerReflectionRequest{list_services: ""}
  std::vector<std::string> got;
  const grpc::Status st = raw_stream_status(*server, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
                                            {std::string("\x3a\x00", 2)}, &got);
  EXPECT_TRUE(st.ok()) << st.error_message();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_TRUE(absl::StrContains(got[0], "wmserve.v1.WorldModel")) << got[0];
  EXPECT_TRUE(absl::StrContains(got[0], "grpc.health.v1.Health")) << got[0];
}

TEST(ServerIntegration, OneSessionIsByteIdenticalToTheOfflineRollout) {
  auto server = ServerProcess::start(tiny_model());
  ASSERT_NE(server, nullptr);
  const auto expected = wmgen_frames(tiny_model(), 5);
  ASSERT_EQ(expected.size(), script_actions().size());
  PlayConfig pc = per_action(5, script_actions());
  pc.start.set_jpeg_quality(90);
  const PlayResult r = client::play(channel(*server), pc);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  ASSERT_EQ(r.frames.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(r.frames[i].index, static_cast<int64_t>(i));
    EXPECT_EQ(r.frames[i].last_action_seq, i + 1);
    EXPECT_EQ(r.frames[i].jpeg, expected[i]) << "frame " << i;
  }
  EXPECT_EQ(r.action_to_frame_s.size(), expected.size());
  EXPECT_EQ(r.started.prompt_frames(), 0);
}

// four sessions at once, sharing steps: their frames against wmgen's
enum class Invariance { kNone, kServer, kStart };
void expect_concurrent_sessions_match_offline(Invariance invariance) {
  const bool batch_invariant = invariance != Invariance::kNone;
  // a ready session waits up to 20 ms for others (2 by default): on a loaded
  // machine the tiny model's 1 ms steps could otherwise all run alone
  std::vector<std::string> args = {"--max_batch_wait_ms=20"};
  if (invariance == Invariance::kServer) args.push_back("--batch_invariant");
  auto server = ServerProcess::start(tiny_model(), args);
  ASSERT_NE(server, nullptr);
  constexpr int kSessions = 4;
  std::vector<std::future<PlayResult>> results;
  for (int i = 0; i < kSessions; ++i) {
    results.push_back(std::async(std::launch::async, [&, i] {
      PlayConfig pc = per_action(10 + static_cast<uint64_t>(i), script_actions());
      pc.start.set_jpeg_quality(90);
      pc.start.set_batch_invariant(invariance == Invariance::kStart);
      pc.window = 2;  // keep the engine busy so that sessions share steps
      return client::play(client::make_channel(server->target(), {.own_connection = true}), pc);
    }));
  }
  std::vector<PlayResult> played;
  for (auto& f : results) played.push_back(f.get());
  int batched_frames = 0, identical = 0, total = 0;
  for (int i = 0; i < kSessions; ++i) {
    SCOPED_TRACE(::testing::Message() << "session " << i);
    const PlayResult& r = played[static_cast<size_t>(i)];
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(r.started.batch_invariant(), batch_invariant);
    const auto expected = wmgen_frames(tiny_model(), 10 + static_cast<uint64_t>(i), "", 90);
    // two actions in flight: a frame may be replaced by the next one when a
    // write is slow (counted by the server); every frame that arrives is right
    ASSERT_FALSE(r.frames.empty());
    EXPECT_EQ(r.frames.back().index, static_cast<int64_t>(expected.size()) - 1);
    EXPECT_EQ(r.frames.size() + r.frames.back().frames_dropped, expected.size());
    for (const auto& f : r.frames) {
      ASSERT_LT(f.index, static_cast<int64_t>(expected.size()));
      EXPECT_EQ(f.last_action_seq, static_cast<uint64_t>(f.index) + 1);
      EXPECT_LE(mean_pixel_diff(f.jpeg, expected[static_cast<size_t>(f.index)]), 0.5) << "frame " << f.index;
      identical += f.jpeg == expected[static_cast<size_t>(f.index)] ? 1 : 0;
      ++total;
      batched_frames += f.timings.batch_size() > 1 ? 1 : 0;
    }
  }
  EXPECT_GT(batched_frames, 0) << "no step ever batched two sessions";
  if (batch_invariant) {
    EXPECT_EQ(identical, total) << "--batch_invariant: every frame byte for byte";
  } else {
    // most frames are byte-identical; the rest differ by rounding only
    EXPECT_GE(identical * 4, total * 3) << identical << " of " << total << " frames identical";
  }
}

TEST(ServerIntegration, FourConcurrentSessionsMatchTheirOfflineRollouts) {
  expect_concurrent_sessions_match_offline(Invariance::kNone);
}

TEST(ServerIntegration, BatchInvariantServerMatchesTheOfflineRolloutsByteForByte) {
  expect_concurrent_sessions_match_offline(Invariance::kServer);
}

TEST(ServerIntegration, BatchInvariantSessionsMatchTheirOfflineRolloutsByteForByte) {
  expect_concurrent_sessions_match_offline(Invariance::kStart);
}

// With one session a step, a session that keeps many actions queued takes
// turns with one that has a single action in flight, instead of being served
// first while its backlog lasts (its oldest action is always the oldest).
// The default model steps in tens of milliseconds here, long beside a
// frame's way to the client and back, so the first session's queue never
// runs dry while the second plays.
TEST(ServerIntegration, ASessionWithABacklogTakesTurnsWithTheOthers) {
  auto server = ServerProcess::start(std::string(WM_SOURCE_DIR) + "/models/default", {"--max_batch=1"});
  ASSERT_NE(server, nullptr);
  std::vector<Action> actions = script_actions();
  while (actions.size() < 24) actions.push_back(actions[actions.size() % 8]);
  actions.resize(24);
  std::promise<void> first_frame;
  std::atomic<bool> told{false};
  PlayConfig deep = per_action(1, actions);
  deep.window = 24;  // every action sent at once
  deep.keep_jpeg = false;
  deep.on_frame = [&](const v1::Frame&) {
    if (!told.exchange(true)) first_frame.set_value();
  };
  auto deep_result = std::async(std::launch::async, [&] {
    return client::play(client::make_channel(server->target(), {.own_connection = true}), deep);
  });
  ASSERT_EQ(first_frame.get_future().wait_for(std::chrono::seconds(60)), std::future_status::ready);
  PlayConfig light = per_action(2, std::vector<Action>(actions.begin(), actions.begin() + 3));
  light.keep_jpeg = false;
  const PlayResult l = client::play(client::make_channel(server->target(), {.own_connection = true}), light);
  const PlayResult d = deep_result.get();
  ASSERT_TRUE(l.status.ok()) << l.status.error_message();
  ASSERT_TRUE(d.status.ok()) << d.status.error_message();
  ASSERT_EQ(l.frames.size(), 3u);
  ASSERT_FALSE(d.frames.empty());
  EXPECT_EQ(d.frames.back().last_action_seq, 24u);
  // the deep session's actions served before the light one had all of its
  // three frames: about two steps for each of them (the step under way when
  // its action came, then its own), not the deep session's whole backlog
  uint64_t before = 0;
  for (const auto& f : d.frames)
    if (f.received_us < l.frames.back().received_us) before = std::max(before, f.last_action_seq);
  EXPECT_LT(before, 16u) << "the light session waited for " << before << " of the deep one's 24 actions";
  for (const auto& f : l.frames) EXPECT_EQ(f.timings.batch_size(), 1);
  // every step served one session: 27 waits observed
  int code = 0;
  const auto m = testing::parse_prometheus(testing::http_get(server->metrics_port(), "/metrics", &code));
  ASSERT_EQ(code, 200);
  EXPECT_EQ(m.at("wm_step_wait_seconds_count"), 27);
  EXPECT_EQ(m.at("wm_step_duration_seconds_count"), 27);
}

TEST(ServerIntegration, BlocksOfFramesTakeQueuedActionsAndRepeatTheLast) {
  // a model that generates 3 frames per step
  const std::string model = testing::make_tiny_model("tiny_fpb3", 4, /*frames_per_block=*/3);
  auto server = ServerProcess::start(model);
  ASSERT_NE(server, nullptr);
  const auto actions = script_actions();
  // one action in flight: every block takes one action and repeats it, so
  // the offline rollout of the script with each action three times matches
  std::string tripled;
  for (const auto& a : actions) tripled += format_action_script({a, a, a}, default_action_space());
  const auto expected = wmgen_frames(model, 4, "", 90, tripled);
  ASSERT_EQ(expected.size(), 3 * actions.size());
  PlayResult r = client::play(channel(*server), per_action(4, actions));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.started.model().frames_per_block(), 3);
  ASSERT_EQ(r.frames.size(), expected.size());
  for (size_t k = 0; k < expected.size(); ++k) {
    EXPECT_EQ(r.frames[k].index, static_cast<int64_t>(k));
    EXPECT_EQ(r.frames[k].last_action_seq, k / 3 + 1);
    EXPECT_EQ(r.frames[k].jpeg, expected[k]) << "frame " << k;
  }
  EXPECT_EQ(r.action_to_frame_s.size(), actions.size());
  // fixed-rate pacing: 3 frames per tick
  PlayConfig pc;
  pc.start.set_pacing(v1::PACING_FIXED_RATE);
  pc.start.set_fps(10);
  pc.actions = std::vector<Action>(5, Action{1, {0, 0}, 0});
  pc.send_fps = 10;
  pc.linger_s = 0.3;
  r = client::play(channel(*server), pc);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  ASSERT_GE(r.frames.size(), 9u);
  EXPECT_EQ(r.frames.size() % 3, 0u);
  for (size_t k = 0; k < r.frames.size(); ++k) EXPECT_EQ(r.frames[k].index, static_cast<int64_t>(k));
}

TEST(ServerIntegration, PromptsFromTheStartOrTheModelDirectory) {
  // a model that ships two prompt images
  const std::string model = testing::make_tiny_model("tiny_prompts", 3);
  std::filesystem::create_directories(model + "/prompts");
  std::vector<std::string> prompts;
  for (int p = 0; p < 2; ++p) {
    std::vector<uint8_t> px(32 * 32 * 3);
    for (size_t i = 0; i < px.size(); ++i) px[i] = static_cast<uint8_t>((i * (p + 3)) % 251);
    prompts.push_back(*jpeg_encode(px.data(), 32, 32, 95));
    const std::string path = model + "/prompts/p" + std::to_string(p) + ".jpg";
    ASSERT_TRUE(write_file(path, prompts.back().data(), prompts.back().size()).ok());
  }
  auto server = ServerProcess::start(model);
  ASSERT_NE(server, nullptr);
  // seed 3 -> prompt 3 % 2 = 1
  const auto expected = wmgen_frames(model, 3, model + "/prompts/p1.jpg");
  PlayResult r = client::play(channel(*server), per_action(3, script_actions()));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.started.prompt_frames(), 1);
  ASSERT_EQ(r.frames.size(), expected.size());
  for (size_t k = 0; k < expected.size(); ++k) EXPECT_EQ(r.frames[k].jpeg, expected[k]) << "frame " << k;
  // a prompt in the Start wins over the model's
  PlayConfig pc = per_action(3, script_actions());
  pc.start.add_prompt_jpeg(prompts[0]);
  const auto expected0 = wmgen_frames(model, 3, model + "/prompts/p0.jpg");
  r = client::play(channel(*server), pc);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  ASSERT_EQ(r.frames.size(), expected0.size());
  EXPECT_EQ(r.frames[0].jpeg, expected0[0]);
  EXPECT_NE(r.frames[0].jpeg, expected[0]);
}

// a latent model takes no image frames: prompt images beside one would fail
// every Start that brings none, so the server does not start with them
TEST(ServerIntegration, ALatentModelsPromptImagesStopTheServer) {
  const std::string model = testing::fresh_dir("tiny_latent_prompts");
  auto config = load_model_config(std::string(WM_SOURCE_DIR) + "/configs/tiny-test.json");
  ASSERT_TRUE(config.ok()) << config.status();
  config->decoder = "latent_preview";
  ASSERT_TRUE(save_checkpoint(*config, random_host_weights(*config, 1), model).ok());
  std::filesystem::create_directories(model + "/prompts");
  const std::vector<uint8_t> px(32 * 32 * 3, 128);
  const std::string jpeg = *jpeg_encode(px.data(), 32, 32, 95);
  ASSERT_TRUE(write_file(model + "/prompts/p0.jpg", jpeg.data(), jpeg.size()).ok());
  // (under timeout: a server that starts anyway is a failure, not a hang)
  std::string log;
  EXPECT_EQ(testing::run_program({"/usr/bin/timeout", "60", WMSERVE_BIN, "--model=" + model, "--host=127.0.0.1", "--port=0",
                                  "--metrics_port=-1"}, &log),
            1)
      << log;
  EXPECT_TRUE(absl::StrContains(log, "prompts/p0.jpg: model 'tiny-test' (decoder latent_preview) is a latent model "
                                     "and takes no prompt images"))
      << log;
  // without them it serves
  std::filesystem::remove_all(model + "/prompts");
  auto server = ServerProcess::start(model);
  ASSERT_NE(server, nullptr);
  PlayResult r = client::play(channel(*server), per_action(1, script_actions()));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.frames.size(), script_actions().size());
}

TEST(ServerIntegration, EveryBadInputGetsItsStatusAndHarmsNothing) {
  auto server = ServerProcess::start(tiny_model(), {"--max_request_bytes=1048576"});
  ASSERT_NE(server, nullptr);
  // a clean session runs next to all of this and must not notice
  auto clean = std::async(std::launch::async, [&] {
    PlayConfig pc = per_action(21, script_actions());
    return client::play(client::make_channel(server->target(), {.own_connection = true}), pc);
  });

  struct Case {
    const char* what;
    std::vector<v1::PlayRequest> requests;
    grpc::StatusCode code;
    const char* says;
  };
  std::string huge(1100 * 1024, 'x');
  const Case cases[] = {
      {"action before start", {action_req(1)}, grpc::StatusCode::FAILED_PRECONDITION, "must be a Start"},
      {"empty request", {v1::PlayRequest()}, grpc::StatusCode::INVALID_ARGUMENT, "empty PlayRequest"},
      {"unknown model", {start_req([](v1::Start* s) { s->set_model("nope"); })}, grpc::StatusCode::NOT_FOUND,
       "unknown model 'nope'"},
      {"unknown cache format", {start_req([](v1::Start* s) { s->set_cache_format("fp3"); })},
       grpc::StatusCode::NOT_FOUND, "unknown cache format 'fp3'"},
      {"bogus resume token", {start_req([](v1::Start* s) { s->set_resume_token("t"); })},
       grpc::StatusCode::NOT_FOUND, "unknown or expired resume token"},
      {"bad quality", {start_req([](v1::Start* s) { s->set_jpeg_quality(500); })},
       grpc::StatusCode::INVALID_ARGUMENT, "jpeg_quality"},
      {"bad fps",
       {start_req([](v1::Start* s) {
         s->set_pacing(v1::PACING_FIXED_RATE);
         s->set_fps(-1);
       })},
       grpc::StatusCode::INVALID_ARGUMENT, "fps"},
      {"prompt not a jpeg", {start_req([](v1::Start* s) { s->add_prompt_jpeg("garbage"); })},
       grpc::StatusCode::INVALID_ARGUMENT, "prompt_jpeg[0]"},
      {"oversize message", {start_req([&](v1::Start* s) { s->add_prompt_jpeg(huge); })},
       grpc::StatusCode::RESOURCE_EXHAUSTED, ""},
      {"second start", {start_req(), action_req(1), start_req()}, grpc::StatusCode::FAILED_PRECONDITION,
       "already has a session"},
      {"stream ends before start", {}, grpc::StatusCode::FAILED_PRECONDITION, "before a Start"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    const grpc::Status st = play_status(*server, c.requests);
    EXPECT_EQ(st.error_code(), c.code) << st.error_message();
    EXPECT_TRUE(absl::StrContains(st.error_message(), c.says)) << st.error_message();
  }

  // bytes that are not a PlayRequest (a length-delimited field cut short):
  // first, the stream ends with INVALID_ARGUMENT; later, they are dropped
  // with an in-band event and the session goes on
  const std::string garbage("\x0a\x7f\x01", 3);
  {
    const grpc::Status st = raw_play_status(*server, {garbage}, nullptr);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
    EXPECT_TRUE(absl::StrContains(st.error_message(), "does not parse as wmserve.v1.PlayRequest"))
        << st.error_message();
    std::vector<v1::PlayResponse> got;
    const grpc::Status mid = raw_play_status(
        *server, {start_req().SerializeAsString(), garbage, action_req(1).SerializeAsString()}, &got);
    EXPECT_TRUE(mid.ok()) << mid.error_message();
    // Started first, though the garbage's event was made before the session opened
    ASSERT_FALSE(got.empty());
    EXPECT_TRUE(got[0].has_started());
    int frames_seen = 0, warnings = 0;
    for (const auto& r : got) {
      if (r.has_frame()) ++frames_seen;
      if (r.has_event() && r.event().code() == "INVALID_ACTION" &&
          absl::StrContains(r.event().message(), "does not parse"))
        ++warnings;
    }
    EXPECT_EQ(warnings, 1);
    EXPECT_EQ(frames_seen, 1);
    for (const char* method : {"/wmserve.v1.WorldModel/ListModels", "/wmserve.v1.WorldModel/GetServerInfo"}) {
      SCOPED_TRACE(method);
      const grpc::Status u = raw_unary_status(*server, method, garbage);
      EXPECT_EQ(u.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << u.error_message();
      EXPECT_TRUE(absl::StrContains(u.error_message(), "does not parse")) << u.error_message();
    }
    EXPECT_TRUE(raw_unary_status(*server, "/wmserve.v1.WorldModel/GetServerInfo", "").ok());
    // a unary call with no request message at all is told so (an empty
    // message, 0 bytes, is a valid request)
    for (const char* method : {"/wmserve.v1.WorldModel/ListModels", "/wmserve.v1.WorldModel/GetServerInfo"}) {
      SCOPED_TRACE(method);
      std::vector<std::string> responses;
      const grpc::Status none = raw_stream_status(*server, method, {}, &responses);
      EXPECT_EQ(none.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << none.error_message();
      EXPECT_TRUE(absl::StrContains(none.error_message(), "the call ended without a request message"))
          << none.error_message();
      const grpc::Status empty = raw_stream_status(*server, method, {""}, &responses);
      EXPECT_TRUE(empty.ok()) << empty.error_message();
    }
    // a compressed request is refused, not inflated (a small gzip could hold a GB)
    std::string padded("\x7a\x80\x08", 3);  // an unknown field 15 of 1024 bytes
    padded.append(1024, '\0');
    EXPECT_TRUE(raw_unary_status(*server, "/wmserve.v1.WorldModel/GetServerInfo", padded).ok());
    for (grpc_compression_algorithm a : {GRPC_COMPRESS_GZIP, GRPC_COMPRESS_DEFLATE}) {
      const grpc::Status z = raw_unary_status(*server, "/wmserve.v1.WorldModel/GetServerInfo", padded, a);
      EXPECT_EQ(z.error_code(), grpc::StatusCode::UNIMPLEMENTED) << z.error_message();
    }
  }

  // invalid actions are dropped with an in-band event; the session goes on
  // and its frames are those of the same session without them
  std::vector<v1::PlayRequest> reqs = {start_req([](v1::Start* s) { s->set_seed(5); }), action_req(1, 1)};
  reqs.push_back(action_req(2, 1u << 7));                       // a key the model does not have
  reqs.push_back(action_req(3, 1, std::nanf(""), 0));           // not a number
  reqs.push_back(action_req(4, 1, 0, 1000));                    // out of range
  reqs.push_back(action_req(1, 1));                             // seq not increasing
  reqs.push_back(v1::PlayRequest());                            // empty
  reqs.push_back(action_req(5, 0, 10, 0));
  std::vector<v1::PlayResponse> responses;
  const grpc::Status st = play_status(*server, reqs, &responses);
  EXPECT_TRUE(st.ok()) << st.error_message();
  // the events of actions sent right after the Start come after Started
  ASSERT_FALSE(responses.empty());
  EXPECT_TRUE(responses[0].has_started());
  std::vector<uint64_t> invalid_seqs;
  std::map<int64_t, std::string> frames;
  uint64_t dropped = 0;
  for (const auto& r : responses) {
    if (r.has_event()) {
      EXPECT_EQ(r.event().code(), "INVALID_ACTION") << r.event().message();
      EXPECT_EQ(r.event().level(), v1::Event::WARNING);
      invalid_seqs.push_back(r.event().action_seq());
    }
    if (r.has_frame()) {
      frames[r.frame().index()] = r.frame().jpeg();
      dropped = r.frame().frames_dropped();
    }
  }
  EXPECT_EQ(invalid_seqs, (std::vector<uint64_t>{2, 3, 4, 1, 0}));
  // two frames (this reader only reads after sending everything, so the
  // first may have been replaced by the second: then it is counted)
  ASSERT_FALSE(frames.empty());
  EXPECT_EQ(frames.rbegin()->first, 1);
  EXPECT_EQ(frames.size() + dropped, 2u);
  std::vector<v1::PlayResponse> ref;
  ASSERT_TRUE(play_status(*server, {start_req([](v1::Start* s) { s->set_seed(5); }), action_req(1, 1),
                                    action_req(2, 0, 10, 0)},
                          &ref)
                  .ok());
  std::map<int64_t, std::string> ref_frames;
  for (const auto& r : ref)
    if (r.has_frame()) ref_frames[r.frame().index()] = r.frame().jpeg();
  for (const auto& [index, jpeg] : frames) {
    if (ref_frames.count(index) != 0) {
      EXPECT_EQ(jpeg, ref_frames[index]) << "frame " << index;
    }
  }
  EXPECT_EQ(frames.at(1), ref_frames.at(1));

  const PlayResult c = clean.get();
  EXPECT_TRUE(c.status.ok()) << c.status.error_message();
  EXPECT_EQ(c.frames.size(), script_actions().size());
  EXPECT_EQ(client::count_index_gaps([&] {
              std::vector<int64_t> v;
              for (const auto& f : c.frames) v.push_back(f.index);
              return v;
            }()),
            0);
  const auto m = scrape(*server);
  EXPECT_EQ(m.at("wm_actions_invalid_total{reason=\"out_of_range\"}"), 3);
  EXPECT_EQ(m.at("wm_actions_invalid_total{reason=\"bad_seq\"}"), 1);
  EXPECT_EQ(m.at("wm_actions_invalid_total{reason=\"before_start\"}"), 1);
  EXPECT_EQ(m.at("wm_actions_invalid_total{reason=\"unparseable\"}"), 1);
  EXPECT_EQ(m.at("wm_sessions_rejected_total{reason=\"unknown_model\"}"), 1);
  EXPECT_EQ(m.at("wm_sessions_rejected_total{reason=\"unknown_format\"}"), 1);
  EXPECT_EQ(m.at("wm_sessions_rejected_total{reason=\"resume_not_found\"}"), 1);
  EXPECT_EQ(m.at("wm_sessions_rejected_total{reason=\"invalid_start\"}"), 3);
  // a session counts as active until its stream's final status is sent, which
  // the client can see a moment before the gauge drops
  EXPECT_EQ(wait_for_metric(*server, "wm_sessions_active", 0), 0);
}

TEST(ServerIntegration, StreamsThatNeverStartAreEndedAfterTheStartTimeout) {
  auto server = ServerProcess::start(tiny_model(), {"--start_timeout_s=1"});
  ASSERT_NE(server, nullptr);
  // two silent streams: open, never a message, never a half-close
  std::vector<std::unique_ptr<client::PlayStream>> silent;
  for (int i = 0; i < 2; ++i)
    silent.push_back(std::make_unique<client::PlayStream>(
        channel(*server), std::chrono::system_clock::now() + std::chrono::seconds(30)));
  // a session that plays longer than the timeout is not touched by it
  PlayConfig pc;
  pc.start.set_pacing(v1::PACING_FIXED_RATE);
  pc.start.set_fps(5);
  pc.actions = std::vector<Action>(8, Action{1, {0, 0}, 0});
  pc.send_fps = 5;
  const PlayResult r = client::play(channel(*server), pc);
  EXPECT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_GE(r.frames.size(), 8u);
  for (auto& st : silent) {
    v1::PlayResponse resp;
    EXPECT_FALSE(st->read(&resp));
    const grpc::Status s = st->finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << s.error_message();
    // the server's words, not the client's own 30 s deadline
    EXPECT_TRUE(absl::StrContains(s.error_message(), "no Start message within 1 s")) << s.error_message();
  }
  EXPECT_EQ(scrape(*server).at("wm_sessions_rejected_total{reason=\"start_timeout\"}"), 2);
  EXPECT_EQ(wait_for_metric(*server, "wm_sessions_active", 0), 0);
}

// --kv_options: the knobs change what each format reserves (and admission
// with it), the server says which it set, a session plays with them, and a
// knob a format cannot use on this model stops the server naming it
TEST(ServerIntegration, KvOptionsSetTheFormatsKnobs) {
  auto format_info = [](const ServerProcess& s, std::string* options) {
    v1::ListModelsResponse models;
    grpc::ClientContext ctx;
    EXPECT_TRUE(v1::WorldModel::NewStub(channel(s))->ListModels(&ctx, {}, &models).ok());
    std::map<std::string, int64_t> bytes;
    if (models.models_size() != 1) return bytes;
    for (const auto& f : models.models(0).cache_format_info()) bytes[f.name()] = f.session_bytes();
    *options = models.models(0).kv_options();
    return bytes;
  };
  auto plain = ServerProcess::start(tiny_model());
  ASSERT_NE(plain, nullptr);
  std::string options = "?";
  const auto defaults = format_info(*plain, &options);
  EXPECT_EQ(options, "");
  auto tuned = ServerProcess::start(tiny_model(), {"--kv_options=psac_bits=4,kivi_residual=64"});
  ASSERT_NE(tuned, nullptr);
  const auto bytes = format_info(*tuned, &options);
  EXPECT_EQ(options, "psac_bits=4,kivi_residual=64");
  // int4 PSAC coefficients: quantwm2 holds less, qvg2 (no PSAC) the same; a
  // longer KIVI residual keeps more tokens fp16
  EXPECT_LT(bytes.at("quantwm2"), defaults.at("quantwm2"));
  EXPECT_EQ(bytes.at("qvg2"), defaults.at("qvg2"));
  EXPECT_GT(bytes.at("kivi2"), defaults.at("kivi2"));
  EXPECT_EQ(bytes.at("fp16"), defaults.at("fp16"));
  PlayConfig pc = per_action(3, script_actions());
  pc.start.set_cache_format("quantwm2");
  const PlayResult r = client::play(channel(*tuned), pc);
  EXPECT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.started.kv_reserved_bytes(), bytes.at("quantwm2"));
  EXPECT_EQ(r.frames.size(), script_actions().size());

  expect_server_refuses({"--kv_options=block=48"}, "--kv_options: 'block=48': block is one of 16, 32, 64, 128");
  expect_server_refuses({"--kv_options=psac_bits=4,nope=1"}, "'nope=1': unknown option");
  // the tiny model's head_dim is 32 and its window 4 frames
  expect_server_refuses({"--kv_options=kivi_group=64"},
                        "--kv_options kivi_group=64: kivi2: group 64 does not divide head_dim 32");
  expect_server_refuses({"--kv_options=span_frames=5"}, "qvg2: span_frames 5 must be within 0..window (4");
}

TEST(ServerIntegration, AdmissionRefusesWhenTheBudgetOrTheClientCapIsFull) {
  v1::Start start;
  // the per-client cap; this server also tells what each format reserves
  auto capped = ServerProcess::start(tiny_model(), {"--max_sessions_per_client=1"});
  ASSERT_NE(capped, nullptr);
  auto cch = channel(*capped);
  std::map<std::string, int64_t> bytes;
  {
    v1::ListModelsResponse models;
    grpc::ClientContext ctx;
    ASSERT_TRUE(v1::WorldModel::NewStub(cch)->ListModels(&ctx, {}, &models).ok());
    for (const auto& f : models.models(0).cache_format_info()) bytes[f.name()] = f.session_bytes();
  }
  ASSERT_EQ(bytes["fp16"], 40960);  // 2 layers x K,V x 2 heads x 32 x 16 tokens x 5 frames x 2 bytes
  client::PlayStream one(cch), two(cch);
  ASSERT_TRUE(one.start(start).ok());
  const grpc::Status cap = two.start(start);
  EXPECT_EQ(cap.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_TRUE(absl::StrContains(cap.error_message(), "already has 1 sessions")) << cap.error_message();

  // the KV budget: room for two fp16 sessions (fp32 sessions reserve twice as much)
  ASSERT_EQ(bytes["fp32"], 2 * bytes["fp16"]);
  const int64_t budget = 2 * bytes["fp16"] + 100;
  auto server = ServerProcess::start(
      tiny_model(), {"--kv_budget_bytes=" + std::to_string(budget), "--max_sessions_per_client=0"});
  ASSERT_NE(server, nullptr);
  auto ch = channel(*server);
  v1::Start fp32;
  fp32.set_cache_format("fp32");
  client::PlayStream a(ch), big(ch), b(ch), c(ch);
  ASSERT_TRUE(a.start(start).ok());
  EXPECT_EQ(a.started().kv_reserved_bytes(), bytes["fp16"]);
  EXPECT_TRUE(client::health_check(ch, "wmserve.v1.admit").serving());
  // an fp32 session does not fit in what is left, an fp16 one does
  const grpc::Status too_big = big.start(fp32);
  EXPECT_EQ(too_big.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_TRUE(absl::StrContains(too_big.error_message(), "KV cache budget full: a fp32 session needs"))
      << too_big.error_message();
  ASSERT_TRUE(b.start(start).ok());
  const auto full = client::health_check(ch, "wmserve.v1.admit");
  EXPECT_TRUE(full.status.ok());
  EXPECT_EQ(full.serving_status, 2);  // NOT_SERVING: no room for one more default session
  EXPECT_TRUE(client::health_check(ch, "").serving());  // but alive
  const grpc::Status refused = c.start(start);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_TRUE(absl::StrContains(refused.error_message(), "100 of " + std::to_string(budget) + " are free"))
      << refused.error_message();
  {
    v1::ServerInfo info;
    grpc::ClientContext ctx;
    ASSERT_TRUE(v1::WorldModel::NewStub(ch)->GetServerInfo(&ctx, {}, &info).ok());
    EXPECT_EQ(info.kv_reserved_bytes(), 2 * bytes["fp16"]);
    EXPECT_EQ(info.kv_free_bytes(), 100);
    EXPECT_EQ(info.sessions_active(), 2);
    EXPECT_FALSE(info.admitting());
  }
  // closing a session frees its reservation: admitting again
  a.writes_done();
  v1::PlayResponse r;
  while (a.read(&r)) {
  }
  EXPECT_TRUE(a.finish().ok());
  for (int i = 0; i < 100 && !client::health_check(ch, "wmserve.v1.admit").serving(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_TRUE(client::health_check(ch, "wmserve.v1.admit").serving());
  client::PlayStream e(ch);
  EXPECT_TRUE(e.start(start).ok());
  const auto m = scrape(*server);
  EXPECT_EQ(m.at("wm_sessions_rejected_total{reason=\"kv_budget\"}"), 2);
  EXPECT_EQ(m.at("wm_admitting"), 0);
  // the gauges follow the engine thread's view, a moment later
  double reserved = 0;
  for (int i = 0; i < 100 && reserved != 2.0 * bytes["fp16"]; ++i) {
    reserved = scrape(*server).at("wm_kv_cache_bytes_reserved");
    if (reserved != 2.0 * bytes["fp16"]) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(reserved, 2.0 * bytes["fp16"]);
}

// a server whose clients have 5 prompt frames, refilled at 0.01 a second
// (nothing refills within a test), and 3 per Start at most
std::unique_ptr<ServerProcess> rationed_server() {
  return ServerProcess::start(tiny_model(),
                              {"--client_prompt_rate=0.01", "--client_prompt_burst=5", "--max_prompt_frames=3"});
}

// a prompt frame of the tiny model's size
std::string tiny_prompt_jpeg() {
  std::vector<uint8_t> px(32 * 32 * 3, 100);
  return *jpeg_encode(px.data(), 32, 32, 90);
}

// a client that opens sessions with long prompts and drops them, in a loop,
// would keep the engine thread busy with prompt passes: each client address
// gets --client_prompt_burst prompt frames, then --client_prompt_rate a second
TEST(ServerIntegration, PromptFramesAreRationedPerClient) {
  auto server = rationed_server();
  ASSERT_NE(server, nullptr);
  auto ch = channel(*server);
  const std::string jpeg = tiny_prompt_jpeg();
  auto with_prompt = [&](int frames) {
    v1::Start s;
    for (int i = 0; i < frames; ++i) s.add_prompt_jpeg(jpeg);
    return s;
  };
  client::PlayStream a(ch), b(ch), c(ch), d(ch), e(ch);
  ASSERT_TRUE(a.start(with_prompt(3)).ok());
  EXPECT_EQ(a.started().prompt_frames(), 3);
  const grpc::Status refused = b.start(with_prompt(3));
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_TRUE(absl::StrContains(refused.error_message(),
                                "come faster than 0.01 a second (--client_prompt_rate): this Start costs 3 (its "
                                "prompt frames, at least one), 2 are left; retry in 100.0 s"))
      << refused.error_message();
  // a Start without a prompt (this model has no prompt images) costs one, as does a one-frame prompt
  ASSERT_TRUE(c.start(v1::Start()).ok());
  EXPECT_EQ(c.started().prompt_frames(), 0);
  ASSERT_TRUE(d.start(with_prompt(1)).ok());
  EXPECT_EQ(e.start(with_prompt(1)).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(scrape(*server).at("wm_sessions_rejected_total{reason=\"prompt_rate\"}"), 2);
  {
    v1::ServerInfo info;
    grpc::ClientContext ctx;
    ASSERT_TRUE(v1::WorldModel::NewStub(ch)->GetServerInfo(&ctx, {}, &info).ok());
    EXPECT_EQ(info.client_prompt_rate(), 0.01);
    EXPECT_EQ(info.client_prompt_burst(), 5);
    EXPECT_EQ(info.max_prompt_frames(), 3);
  }
  // the refusals harmed nothing: the client's sessions play on
  v1::Action act;
  act.set_seq(1);
  ASSERT_TRUE(a.send_action(act));
  v1::PlayResponse r;
  bool framed = false;
  while (!framed && a.read(&r)) framed = r.has_frame();
  EXPECT_TRUE(framed);
  EXPECT_EQ(r.frame().index(), 3) << "the prompt's three frames come first";
  a.writes_done();
  while (a.read(&r)) {
  }
  EXPECT_TRUE(a.finish().ok());
}

// a Start refused for its prompt still had its JPEGs decoded: it costs the
// ones decoded (up to and with the bad one), so bad prompts cannot make the
// server decode without end; a Start refused before decoding costs nothing
TEST(ServerIntegration, AStartRefusedForItsPromptCostsTheFramesDecoded) {
  auto server = rationed_server();
  ASSERT_NE(server, nullptr);
  auto ch = channel(*server);
  const std::string jpeg = tiny_prompt_jpeg();
  const std::string cut = jpeg.substr(0, jpeg.size() / 2);
  auto start = [&](std::vector<std::string> prompt, const std::string& model = "") {
    v1::Start s;
    s.set_model(model);
    for (const auto& p : prompt) s.add_prompt_jpeg(p);
    client::PlayStream st(ch);
    return st.start(s).error_code();
  };
  EXPECT_EQ(start({jpeg, jpeg, cut}), grpc::StatusCode::INVALID_ARGUMENT);  // 3 decoded: 2 left
  EXPECT_EQ(start({jpeg, jpeg}, "no-such-model"), grpc::StatusCode::NOT_FOUND);  // none decoded
  EXPECT_EQ(start({cut, jpeg}), grpc::StatusCode::INVALID_ARGUMENT);  // 1 decoded: 1 left
  EXPECT_EQ(start({jpeg}), grpc::StatusCode::OK);                     // 0 left
  EXPECT_EQ(start({jpeg}), grpc::StatusCode::RESOURCE_EXHAUSTED);
  const auto m = scrape(*server);
  EXPECT_EQ(m.at("wm_sessions_rejected_total{reason=\"prompt_rate\"}"), 1);
  EXPECT_EQ(m.at("wm_sessions_rejected_total{reason=\"invalid_start\"}"), 2);
}

// a test CA, a certificate for 127.0.0.1 and localhost signed by it, a
// client certificate, an expired one, and a second CA that signed nothing of
// these, made by the openssl tool in a fresh directory
std::string make_test_pki() {
  const std::string dir = testing::fresh_dir("pki");
  const char* script = R"(set -e
cd "$1"
o() { openssl "$@" 2>>openssl.log; }
key() { o req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "$@"; }
key -x509 -days 2 -subj /CN=wmserve-test-ca -keyout ca.key -out ca.pem
key -x509 -days 2 -subj /CN=other-ca -keyout other_ca.key -out other_ca.pem
key -subj /CN=localhost -keyout server.key -out server.csr
printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\n' > san.ext
o x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -extfile san.ext -out server.pem
o x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days -1 -extfile san.ext -out expired.pem
key -subj /CN=player -keyout client.key -out client.csr
o x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -out client.pem
key -subj /CN=stranger -keyout stranger.key -out stranger.csr
o x509 -req -in stranger.csr -CA other_ca.pem -CAkey other_ca.key -CAcreateserial -days 2 -out stranger.pem
cat expired.pem ca.pem > bundle.pem
key -subj /CN=localhost -keyout renewed.key -out renewed.csr
o x509 -req -in renewed.csr -CA other_ca.pem -CAkey other_ca.key -CAcreateserial -days 2 -extfile san.ext -out renewed.pem
)";
  std::string log;
  const int rc = testing::run_program({"/bin/sh", "-c", script, "sh", dir}, &log);
  EXPECT_EQ(rc, 0) << "openssl (tools/install-deps.sh installs it) failed:\n" << log;
  return rc == 0 ? dir : "";
}

std::string file_text(const std::string& path) { return *read_file(path); }

TEST(ServerIntegration, TlsServesOnlyClientsThatTrustItAndMutualTlsOnlyKnownClients) {
  const std::string pki = make_test_pki();
  ASSERT_FALSE(pki.empty());
  auto server = ServerProcess::start(tiny_model(), {"--tls_cert=" + pki + "/server.pem", "--tls_key=" + pki + "/server.key"});
  ASSERT_NE(server, nullptr);
  EXPECT_TRUE(absl::StrContains(server->log(), "(TLS)")) << server->log();
  client::ChannelOptions tls;
  tls.tls = true;
  tls.tls_ca = file_text(pki + "/ca.pem");
  tls.own_connection = true;
  // a whole session over TLS
  PlayResult r = client::play(client::make_channel(server->target(), tls), per_action(1, script_actions()));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.frames.size(), script_actions().size());
  // a plaintext client, a client that trusts another CA, and one that expects another name get no answer
  client::ChannelOptions other = tls;
  other.tls_ca = file_text(pki + "/other_ca.pem");
  client::ChannelOptions wrong_name = tls;
  wrong_name.tls_server_name = "wmserve.example";
  client::ChannelOptions plain;
  plain.own_connection = true;
  for (const auto& co : {plain, other, wrong_name}) {
    const auto h = client::health_check(client::make_channel(server->target(), co), "", std::chrono::seconds(5));
    EXPECT_EQ(h.status.error_code(), grpc::StatusCode::UNAVAILABLE) << h.status.error_message();
  }
  EXPECT_TRUE(client::health_check(client::make_channel(server->target(), tls), "").serving());
  // the clients' flags reach the same server
  std::string log;
  EXPECT_EQ(testing::run_program({WMHEALTH_BIN, "--server=" + server->target(), "--tls_ca=" + pki + "/ca.pem"}, &log), 0)
      << log;
  EXPECT_EQ(testing::run_program({WMHEALTH_BIN, "--server=localhost:" + std::to_string(server->port()),
                                  "--tls_ca=" + pki + "/ca.pem", "--wait_s=0"},
                                 &log),
            0)
      << log;
  EXPECT_EQ(testing::run_program({WMHEALTH_BIN, "--server=" + server->target(), "--wait_s=0"}, &log), 1) << log;
  // a flood of failed handshakes: gRPC logs each, wmserve lets 20 lines a second through
  auto bad_handshake = [&] {
    const int fd = testing::idle_connection(server->port());
    ASSERT_GE(fd, 0);
    const char hello[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    EXPECT_GT(::write(fd, hello, sizeof hello - 1), 0);
    char buf[64];
    while (::read(fd, buf, sizeof buf) > 0) {  // until the server closes
    }
    ::close(fd);
  };
  for (int i = 0; i < 200; ++i) bad_handshake();
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  bad_handshake();  // a new second: this line says how many were dropped
  const std::string after = server->log();
  int handshake_lines = 0;
  for (size_t at = after.find("Handshake failed"); at != std::string::npos; at = after.find("Handshake failed", at + 1))
    ++handshake_lines;
  EXPECT_GE(handshake_lines, 2) << after;
  EXPECT_LE(handshake_lines, 3 * 20) << "at most 20 a second, and the burst took under 3 s";
  EXPECT_TRUE(absl::StrContains(after, "log lines dropped (at most 20 a second)")) << after;

  // mutual TLS: only a client with a certificate the CA signed gets in (the
  // CAs are a bundle with an expired certificate first, as system bundles may be)
  auto mutual = ServerProcess::start(tiny_model(), {"--tls_cert=" + pki + "/server.pem", "--tls_key=" + pki +
                                                    "/server.key", "--tls_client_ca=" + pki + "/bundle.pem"});
  ASSERT_NE(mutual, nullptr);
  EXPECT_TRUE(absl::StrContains(mutual->log(), "(TLS, client certificates required)")) << mutual->log();
  client::ChannelOptions known = tls, stranger = tls;
  known.tls_cert = file_text(pki + "/client.pem");
  known.tls_key = file_text(pki + "/client.key");
  stranger.tls_cert = file_text(pki + "/stranger.pem");
  stranger.tls_key = file_text(pki + "/stranger.key");
  for (const auto& co : {tls, stranger}) {
    const auto h = client::health_check(client::make_channel(mutual->target(), co), "", std::chrono::seconds(5));
    EXPECT_EQ(h.status.error_code(), grpc::StatusCode::UNAVAILABLE) << h.status.error_message();
  }
  r = client::play(client::make_channel(mutual->target(), known), per_action(2, script_actions()));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.frames.size(), script_actions().size());
  EXPECT_EQ(testing::run_program({WMHEALTH_BIN, "--server=" + mutual->target(), "--tls_ca=" + pki + "/ca.pem",
                                  "--tls_cert=" + pki + "/client.pem", "--tls_key=" + pki + "/client.key"},
                                 &log),
            0)
      << log;
}

// a certificate renewed in place is served without a restart (--tls_reload_s)
TEST(ServerIntegration, ARenewedCertificateIsServedWithoutARestart) {
  const std::string pki = make_test_pki();
  ASSERT_FALSE(pki.empty());
  const std::string live = testing::fresh_dir("live");
  std::filesystem::copy_file(pki + "/server.pem", live + "/cert.pem");
  std::filesystem::copy_file(pki + "/server.key", live + "/key.pem");
  auto server = ServerProcess::start(tiny_model(), {"--tls_cert=" + live + "/cert.pem",
                                                    "--tls_key=" + live + "/key.pem", "--tls_reload_s=1"});
  ASSERT_NE(server, nullptr);
  auto trusting = [&](const std::string& ca) {
    client::ChannelOptions co;
    co.tls = true;
    co.tls_ca = file_text(pki + "/" + ca);
    co.own_connection = true;  // a fresh handshake each time
    return client::health_check(client::make_channel(server->target(), co), "", std::chrono::seconds(3));
  };
  EXPECT_TRUE(trusting("ca.pem").serving());
  EXPECT_FALSE(trusting("other_ca.pem").serving());
  // the renewal (another CA's, to tell them apart) is renamed into place, key first
  std::filesystem::copy_file(pki + "/renewed.key", live + "/key.pem.new");
  std::filesystem::copy_file(pki + "/renewed.pem", live + "/cert.pem.new");
  std::filesystem::rename(live + "/key.pem.new", live + "/key.pem");
  std::filesystem::rename(live + "/cert.pem.new", live + "/cert.pem");
  bool renewed = false;
  for (int i = 0; i < 50 && !renewed; ++i) {
    renewed = trusting("other_ca.pem").serving();
    if (!renewed) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  EXPECT_TRUE(renewed) << "the renewed certificate was not served within 10 s\n" << server->log();
  EXPECT_FALSE(trusting("ca.pem").serving());
  expect_server_refuses({"--tls_cert=" + live + "/cert.pem", "--tls_key=" + live + "/key.pem", "--tls_reload_s=-1"},
                        "--tls_reload_s must be 0..86400");
}

TEST(ServerIntegration, BadTlsFilesStopTheServerAndTheClientsWithAMessage) {
  const std::string pki = make_test_pki();
  ASSERT_FALSE(pki.empty());
  const std::string cert = "--tls_cert=" + pki + "/server.pem", key = "--tls_key=" + pki + "/server.key";
  for (const auto& [flags, says] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{cert}, "--tls_cert and --tls_key go together"},
           {{"--tls_client_ca=" + pki + "/ca.pem"}, "--tls_client_ca needs --tls_cert and --tls_key"},
           {{"--tls_cert=" + pki + "/nope.pem", key}, "nope.pem: No such file"},
           {{"--tls_cert=" + pki + "/server.key", key}, "holds no certificate"},
           {{cert, "--tls_key=" + pki + "/server.pem"}, "holds no private key"},
           {{cert, "--tls_key=" + pki + "/client.key"}, "--tls_key is not the private key of --tls_cert"},
           {{"--tls_cert=" + pki + "/expired.pem", key}, "its certificate has expired"},
           {{cert, key, "--tls_client_ca=" + pki + "/san.ext"}, "not a PEM file"}}) {
    expect_server_refuses(flags, says);
  }
  // the clients check theirs before they connect (no server listens on port 9)
  for (const auto& [flags, says] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--tls_ca=" + pki + "/server.key"}, "--tls_ca"},
           {{"--tls_cert=" + pki + "/client.pem"}, "--tls_cert and --tls_key go together"},
           {{"--tls_cert=" + pki + "/client.pem", "--tls_key=" + pki + "/server.key"}, "is not the private key"}}) {
    for (const char* bin : {WMHEALTH_BIN, WMBENCH_BIN}) {
      std::vector<std::string> argv = {bin, "--server=127.0.0.1:9"};
      argv.insert(argv.end(), flags.begin(), flags.end());
      std::string log;
      EXPECT_EQ(testing::run_program(argv, &log), 2) << bin << " " << flags.back() << ":\n" << log;
      EXPECT_TRUE(absl::StrContains(log, says)) << bin << " " << flags.back() << ":\n" << log;
    }
    std::vector<std::string> argv = {WMPLAY_BIN, "--server=127.0.0.1:9", "--headless"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    std::string log;
    EXPECT_EQ(testing::run_program(argv, &log), 1) << flags.back() << ":\n" << log;
    EXPECT_TRUE(absl::StrContains(log, says)) << flags.back() << ":\n" << log;
  }
}

// a connection of its own to `s` whose calls send `token` ("": none)
std::shared_ptr<grpc::Channel> channel_with_token(const ServerProcess& s, const std::string& token) {
  client::ChannelOptions co;
  co.own_connection = true;
  co.auth_token = token;
  return client::make_channel(s.target(), co);
}

// dir/tokens holding `text`, readable by its owner only (as --auth_tokens wants it)
std::string owner_only_tokens(const std::string& dir, const std::string& text) {
  const std::string tokens = dir + "/tokens";
  EXPECT_TRUE(write_file(tokens, text.data(), text.size()).ok());
  std::filesystem::permissions(tokens, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  return tokens;
}

TEST(ServerIntegration, ApiTokensAdmitKnownUsersAndCountTheirSessionsPerUser) {
  const std::string dir = testing::fresh_dir("tokens");
  const std::string tokens = owner_only_tokens(dir, "alice 0123456789abcdef0123\nbob fedcba9876543210fedc\n");
  const std::string session_log = dir + "/sessions.jsonl";
  auto server = ServerProcess::start(
      tiny_model(), {"--auth_tokens=" + tokens, "--max_sessions_per_client=1", "--session_log=" + session_log});
  ASSERT_NE(server, nullptr);
  EXPECT_TRUE(absl::StrContains(server->log(), "API tokens without TLS")) << server->log();
  EXPECT_FALSE(absl::StrContains(server->log(), "can be read by others")) << server->log();
  auto as = [&](const std::string& token) { return channel_with_token(*server, token); };
  auto anonymous = as(""), alice = as("0123456789abcdef0123"), alice2 = as("0123456789abcdef0123"),
       bob = as("fedcba9876543210fedc"), stranger = as("0123456789abcdef0124");
  // without a known token nothing but the health check answers
  for (const auto& ch : {anonymous, stranger}) {
    client::PlayStream p(ch);
    const grpc::Status st = p.start(v1::Start());
    EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED) << st.error_message();
    v1::ServerInfo info;
    grpc::ClientContext ctx;
    EXPECT_EQ(v1::WorldModel::NewStub(ch)->GetServerInfo(&ctx, {}, &info).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    v1::ListModelsResponse models;
    grpc::ClientContext ctx2;
    EXPECT_EQ(v1::WorldModel::NewStub(ch)->ListModels(&ctx2, {}, &models).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_TRUE(client::health_check(ch, "").serving());
  }
  {
    client::PlayStream p(anonymous);
    const grpc::Status st = p.start(v1::Start());
    EXPECT_TRUE(absl::StrContains(st.error_message(), "needs a token")) << st.error_message();
  }
  EXPECT_EQ(scrape(*server).at("wm_sessions_rejected_total{reason=\"unauthenticated\"}"), 3);

  {
    // the clients (wmplay, wmbench) say the server answered, and why it refused
    v1::ListModelsResponse models;
    grpc::ClientContext ctx;
    const grpc::Status st = v1::WorldModel::NewStub(anonymous)->ListModels(&ctx, {}, &models);
    EXPECT_TRUE(absl::StrContains(client::describe_call_failure(server->target(), st),
                                  "wmserve at " + server->target() +
                                      " refused the call (UNAUTHENTICATED): this server needs a token"))
        << client::describe_call_failure(server->target(), st);
    EXPECT_TRUE(absl::StartsWith(
        client::describe_call_failure("127.0.0.1:9", grpc::Status(grpc::StatusCode::UNAVAILABLE, "refused")),
        "cannot reach wmserve at 127.0.0.1:9: refused"));
  }
  // the per-client cap counts per user, not per address: alice and bob share 127.0.0.1
  const auto deadline = std::chrono::system_clock::now() + std::chrono::seconds(30);
  auto a = std::make_unique<client::PlayStream>(alice, deadline);
  ASSERT_TRUE(a->start(v1::Start()).ok());
  client::PlayStream a2(alice2, deadline), b(bob, deadline);
  const grpc::Status capped = a2.start(v1::Start());
  EXPECT_EQ(capped.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_TRUE(absl::StrContains(capped.error_message(), "client user:alice already has 1 sessions"))
      << capped.error_message();
  ASSERT_TRUE(b.start(v1::Start()).ok());

  // only its user resumes a session: to anyone else its token is unknown
  const std::string token = a->started().resume_token(), id = a->started().session_id();
  a->cancel();
  a->finish();
  a.reset();
  EXPECT_EQ(wait_for_metric(*server, "wm_sessions_parked", 1), 1);
  v1::Start resume;
  resume.set_resume_token(token);
  {
    client::PlayStream thief(bob, deadline);
    EXPECT_EQ(thief.start(resume).error_code(), grpc::StatusCode::NOT_FOUND);
  }
  client::PlayStream back(alice2, deadline);
  ASSERT_TRUE(back.start(resume).ok());
  EXPECT_EQ(back.started().session_id(), id);
  back.writes_done();
  b.writes_done();
  v1::PlayResponse r;
  while (back.read(&r)) {
  }
  while (b.read(&r)) {
  }
  EXPECT_TRUE(back.finish().ok());
  EXPECT_TRUE(b.finish().ok());
  EXPECT_EQ(wait_for_metric(*server, "wm_sessions_active", 0), 0);
  // the session log names the user beside the address
  int alice_lines = 0, bob_lines = 0;
  for (const nlohmann::json& j : session_log_lines(session_log, 6)) {
    EXPECT_EQ(j["client"], "ipv4:127.0.0.1");
    alice_lines += j["user"] == "alice";
    bob_lines += j["user"] == "bob";
  }
  EXPECT_EQ(alice_lines, 4);  // start, park, resume, end
  EXPECT_EQ(bob_lines, 2);
}

// with tokens, a Play stream that sends no message hears about its missing
// token, not about the Start it never sent: at the Start timeout, and when it
// half-closes first; a known caller's silent stream still times out
TEST(ServerIntegration, ApiTokensAreCheckedBeforeTheStartTimeoutAndAHalfClose) {
  const std::string tokens = owner_only_tokens(testing::fresh_dir("tokens_silent"), "alice 0123456789abcdef0123\n");
  auto server = ServerProcess::start(tiny_model(), {"--auth_tokens=" + tokens, "--start_timeout_s=1"});
  ASSERT_NE(server, nullptr);
  auto as = [&](const std::string& token) { return channel_with_token(*server, token); };
  const auto deadline = std::chrono::system_clock::now() + std::chrono::seconds(30);
  client::PlayStream anonymous(as(""), deadline), stranger(as("0123456789abcdef0124"), deadline),
      alice(as("0123456789abcdef0123"), deadline), closing(as(""), deadline);
  closing.writes_done();
  v1::PlayResponse resp;
  EXPECT_FALSE(closing.read(&resp));
  const grpc::Status closed = closing.finish();
  EXPECT_EQ(closed.error_code(), grpc::StatusCode::UNAUTHENTICATED) << closed.error_message();
  EXPECT_TRUE(absl::StrContains(closed.error_message(), "needs a token")) << closed.error_message();
  for (client::PlayStream* p : {&anonymous, &stranger}) {
    EXPECT_FALSE(p->read(&resp));
    const grpc::Status st = p->finish();
    EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED) << st.error_message();
  }
  EXPECT_FALSE(alice.read(&resp));
  const grpc::Status slow = alice.finish();
  EXPECT_EQ(slow.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << slow.error_message();
  EXPECT_TRUE(absl::StrContains(slow.error_message(), "no Start message within 1 s")) << slow.error_message();
  const auto m = scrape(*server);
  EXPECT_EQ(m.at("wm_sessions_rejected_total{reason=\"unauthenticated\"}"), 3);
  EXPECT_EQ(m.at("wm_sessions_rejected_total{reason=\"start_timeout\"}"), 1);
}

// SIGHUP: new tokens without a restart; the sessions of a token that is no
// longer there end at once, open or parked, while the others go on; a bad
// file keeps the tokens in use; the session log starts a new file after a
// rotation
TEST(ServerIntegration, SighupReloadsTheTokensRevokesAndReopensTheSessionLog) {
  const std::string dir = testing::fresh_dir("sighup");
  const std::string tokens = dir + "/tokens", log_path = dir + "/sessions.jsonl";
  auto put = [&](const std::string& text) { ASSERT_TRUE(write_file(tokens, text.data(), text.size()).ok()); };
  put("alice 0123456789abcdef0123\ncarol cccccccccccccccccccc\n");
  std::filesystem::permissions(tokens, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  auto server = ServerProcess::start(tiny_model(), {"--auth_tokens=" + tokens, "--session_log=" + log_path});
  ASSERT_NE(server, nullptr);
  auto as = [&](const std::string& token) { return channel_with_token(*server, token); };
  auto alice = as("0123456789abcdef0123"), bob = as("fedcba9876543210fedc"), carol = as("cccccccccccccccccccc");
  auto hup_and_wait = [&](const std::string& says) {
    const size_t before = server->log().size();
    server->signal(SIGHUP);
    for (int i = 0; i < 200 && server->log().find(says, before) == std::string::npos; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    EXPECT_NE(server->log().find(says, before), std::string::npos) << server->log();
  };
  const auto deadline = std::chrono::system_clock::now() + std::chrono::seconds(30);
  client::PlayStream open(alice, deadline), stays(carol, deadline);
  ASSERT_TRUE(open.start(v1::Start()).ok());
  ASSERT_TRUE(stays.start(v1::Start()).ok());
  {
    client::PlayStream p(bob, deadline);
    EXPECT_EQ(p.start(v1::Start()).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  // a second session of alice's, parked
  auto parked = std::make_unique<client::PlayStream>(alice, deadline);
  ASSERT_TRUE(parked->start(v1::Start()).ok());
  const std::string parked_token = parked->started().resume_token();
  parked->cancel();
  parked->finish();
  parked.reset();
  EXPECT_EQ(wait_for_metric(*server, "wm_sessions_parked", 1), 1);
  // the log's own thread writes the lines: every one so far (three starts
  // and the park) is in the file before it is rotated
  ASSERT_EQ(session_log_lines(log_path, 4).size(), 4u);

  // rotate the log and give bob alice's place
  std::filesystem::rename(log_path, log_path + ".1");
  put("bob fedcba9876543210fedc\ncarol cccccccccccccccccccc\n");
  hup_and_wait("SIGHUP: 2 API token(s) from " + tokens + "; 2 session(s) of revoked tokens closed");
  {
    client::PlayStream p(alice, deadline);
    EXPECT_EQ(p.start(v1::Start()).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  // alice's open session ended, saying why; her parked one is gone
  v1::Frame f;
  while (next_frame(open, &f)) {
  }
  const grpc::Status revoked = open.finish();
  EXPECT_EQ(revoked.error_code(), grpc::StatusCode::UNAUTHENTICATED) << revoked.error_message();
  EXPECT_TRUE(absl::StrContains(revoked.error_message(), "was revoked")) << revoked.error_message();
  EXPECT_EQ(wait_for_metric(*server, "wm_sessions_ended_total{reason=\"revoked\"}", 2), 2);
  EXPECT_EQ(wait_for_metric(*server, "wm_sessions_parked", 0), 0);
  {
    // not even bob, whose token now has alice's place, resumes it
    v1::Start resume;
    resume.set_resume_token(parked_token);
    client::PlayStream p(bob, deadline);
    EXPECT_EQ(p.start(resume).error_code(), grpc::StatusCode::NOT_FOUND);
  }
  PlayResult r = client::play(bob, per_action(1, script_actions()));
  EXPECT_TRUE(r.status.ok()) << r.status.error_message();
  // carol's session went on
  v1::Action a;
  a.set_seq(1);
  ASSERT_TRUE(stays.send_action(a));
  EXPECT_TRUE(next_frame(stays, &f));
  // a bad file: the tokens in use stay, and so do their sessions
  put("bob 0123\n");
  hup_and_wait("the tokens in use stay");
  r = client::play(bob, per_action(2, script_actions()));
  EXPECT_TRUE(r.status.ok()) << r.status.error_message();
  a.set_seq(2);
  ASSERT_TRUE(stays.send_action(a));
  EXPECT_TRUE(next_frame(stays, &f));
  stays.writes_done();
  while (next_frame(stays, &f)) {
  }
  EXPECT_TRUE(stays.finish().ok());
  EXPECT_EQ(wait_for_metric(*server, "wm_sessions_active", 0), 0);
  // alice's starts went to the old file, everything after the rotation to
  // the new one (written by the log's own thread: wait for carol's end)
  std::string new_log;
  for (int i = 0; i < 250; ++i) {
    new_log = read_file(log_path).value_or("");
    if (absl::StrContains(new_log, "\"event\":\"end\",\"session\":\"" + stays.started().session_id())) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const std::string old_log = *read_file(log_path + ".1");
  EXPECT_TRUE(absl::StrContains(old_log, "\"user\":\"alice\",\"format\"")) << old_log;
  EXPECT_FALSE(absl::StrContains(old_log, "bob")) << old_log;
  EXPECT_TRUE(absl::StrContains(new_log, "\"event\":\"end\",\"session\":\"" + open.started().session_id()))
      << new_log;
  int revoked_ends = 0, bob_starts = 0;
  for (size_t at = new_log.find("\"reason\":\"revoked\""); at != std::string::npos;
       at = new_log.find("\"reason\":\"revoked\"", at + 1))
    ++revoked_ends;
  for (size_t at = new_log.find("\"event\":\"start\""); at != std::string::npos;
       at = new_log.find("\"event\":\"start\"", at + 1))
    ++bob_starts;
  EXPECT_EQ(revoked_ends, 2) << new_log;
  EXPECT_EQ(bob_starts, 2) << new_log;
}

// --metrics_auth: /metrics answers HTTP basic auth with a NAME and TOKEN of
// its file and nothing else; SIGHUP reads the file again
TEST(ServerIntegration, MetricsAuthNeedsBasicCredentialsAndReloads) {
  const std::string dir = testing::fresh_dir("metrics_auth");
  const std::string file = dir + "/metrics_auth";
  auto put = [&](const std::string& text) { ASSERT_TRUE(write_file(file, text.data(), text.size()).ok()); };
  put("prometheus 0123456789abcdef0123\n");
  std::filesystem::permissions(file, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  auto server = ServerProcess::start(tiny_model(), {"--metrics_auth=" + file});
  ASSERT_NE(server, nullptr);
  auto get = [&](const std::string& user, const std::string& password, std::string* body = nullptr) {
    int code = 0;
    const std::string headers =
        user.empty() ? "" : "Authorization: Basic " + absl::Base64Escape(user + ":" + password) + "\r\n";
    const std::string b = testing::http_request(server->metrics_port(), "GET", "/metrics", &code, 5, headers);
    if (body != nullptr) *body = b;
    return code;
  };
  std::string body;
  EXPECT_EQ(get("prometheus", "0123456789abcdef0123", &body), 200);
  EXPECT_TRUE(absl::StrContains(body, "wm_sessions_active")) << body;
  EXPECT_EQ(get("", "", &body), 401);
  EXPECT_FALSE(absl::StrContains(body, "wm_sessions_active")) << body;
  EXPECT_EQ(get("prometheus", "0123456789abcdef012"), 401);  // a prefix
  EXPECT_EQ(get("prometheus", ""), 401);
  EXPECT_EQ(get("grafana", "0123456789abcdef0123"), 401);     // another name
  // the gRPC port does not care
  EXPECT_TRUE(client::health_check(channel(*server), "").serving());

  put("grafana fedcba9876543210fedc\n");
  const size_t before = server->log().size();
  server->signal(SIGHUP);
  for (int i = 0; i < 200 && server->log().find("1 metrics credential(s)", before) == std::string::npos; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(get("prometheus", "0123456789abcdef0123"), 401);
  EXPECT_EQ(get("grafana", "fedcba9876543210fedc"), 200);
  // a bad file keeps the credentials in use
  put("grafana short\n");
  server->signal(SIGHUP);
  for (int i = 0; i < 200 && server->log().find("metrics credentials in use stay", before) == std::string::npos; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_NE(server->log().find("the metrics credentials in use stay", before), std::string::npos) << server->log();
  EXPECT_EQ(get("grafana", "fedcba9876543210fedc"), 200);

  // (expect_server_refuses turns the endpoint off: turn it on again)
  expect_server_refuses({"--metrics_port=0", "--metrics_auth=" + dir + "/none"}, "--metrics_auth: cannot open");
  expect_server_refuses({"--metrics_port=0", "--metrics_auth=" + file},
                        "--metrics_auth " + file + " line 1: a token is 16..512");
  put("prometheus 0123456789abcdef0123\n");
  expect_server_refuses({"--metrics_auth=" + file, "--metrics_port=-1"}, "--metrics_auth needs the metrics endpoint");
}

// --max_connections_per_client / --max_connections: past a cap a new
// connection is closed at accept, gRPC never sees it; closed connections
// make room again; the metrics count both
TEST(ServerIntegration, ConnectionCapsCloseWhatIsPastThemAtAccept) {
  auto server = ServerProcess::start(tiny_model(), {"--max_connections_per_client=2", "--handshake_timeout_s=30"});
  ASSERT_NE(server, nullptr);
  // two connections that send nothing hold the address's two places
  const int idle1 = testing::idle_connection(server->port()), idle2 = testing::idle_connection(server->port());
  ASSERT_GE(idle1, 0);
  ASSERT_GE(idle2, 0);
  EXPECT_EQ(wait_for_metric(*server, "wm_connections_open", 2), 2);
  client::ChannelOptions co;
  co.own_connection = true;
  const auto refused = client::health_check(client::make_channel(server->target(), co), "", std::chrono::seconds(2));
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::UNAVAILABLE) << refused.status.error_message();
  EXPECT_GE(scrape(*server).at("wm_connections_refused_total{reason=\"client_cap\"}"), 1);
  EXPECT_TRUE(absl::StrContains(server->log(), "refused connections from ipv4:127.0.0.1: it has 2 open "
                                               "(--max_connections_per_client)"))
      << server->log();
  close(idle1);
  close(idle2);
  // gRPC closes them on its side too, and the listener's sweep (each
  // second) sees that: the next connections find the room
  EXPECT_EQ(wait_for_metric(*server, "wm_connections_open", 0), 0);
  EXPECT_TRUE(client::health_check(client::make_channel(server->target(), co), "", std::chrono::seconds(2)).serving());
  EXPECT_EQ(wait_for_metric(*server, "wm_connections_open", 0), 0);
  PlayResult r = client::play(client::make_channel(server->target(), co), per_action(1, script_actions()));
  EXPECT_TRUE(r.status.ok()) << r.status.error_message();

  auto one = ServerProcess::start(tiny_model(), {"--max_connections=1", "--handshake_timeout_s=30"});
  ASSERT_NE(one, nullptr);
  const int idle = testing::idle_connection(one->port());
  ASSERT_GE(idle, 0);
  EXPECT_EQ(wait_for_metric(*one, "wm_connections_open", 1), 1);
  EXPECT_FALSE(client::health_check(client::make_channel(one->target(), co), "", std::chrono::seconds(2)).serving());
  EXPECT_GE(scrape(*one).at("wm_connections_refused_total{reason=\"total_cap\"}"), 1);
  close(idle);

  // a cap above the open-file limit comes down below it
  std::string log;
  EXPECT_EQ(testing::run_program({"/usr/bin/prlimit", "--nofile=400:400", WMSERVE_BIN, "--model=" + tiny_model(),
                                  "--max_connections=1000", "--encoder_threads=0"},
                                 &log),
            1);
  EXPECT_TRUE(absl::StrContains(log, "--max_connections 1000 lowered to 144: the open-file limit is 400")) << log;
  expect_server_refuses({"--max_connections=-1"}, "--max_connections and --max_connections_per_client must be");
}

// --client_connection_rate/--client_connection_burst: a client that opens
// connections faster is refused at accept, whether or not it keeps them
TEST(ServerIntegration, NewConnectionsPerClientAreRationed) {
  auto server = ServerProcess::start(tiny_model(), {"--client_connection_burst=3", "--client_connection_rate=0.1"});
  ASSERT_NE(server, nullptr);
  client::ChannelOptions co;
  co.own_connection = true;
  int served = 0, refused = 0;
  for (int i = 0; i < 6; ++i) {
    // each its own connection, closed when the channel goes
    const auto h = client::health_check(client::make_channel(server->target(), co), "", std::chrono::seconds(2));
    (h.serving() ? served : refused) += 1;
  }
  EXPECT_EQ(served, 3);
  EXPECT_EQ(refused, 3);
  EXPECT_GE(scrape(*server).at("wm_connections_refused_total{reason=\"client_rate\"}"), 3);
  EXPECT_TRUE(absl::StrContains(server->log(), "refused connections from ipv4:127.0.0.1: more than 3 at once, then "
                                               "0.1 a second"))
      << server->log();
  expect_server_refuses({"--client_connection_burst=0"}, "--client_connection_burst must be 1..1000000");
  expect_server_refuses({"--client_connection_rate=-1"}, "--client_connection_rate must be 0..1000000");
}

// --max_calls_per_connection: a connection that opens calls faster (an HTTP/2
// rapid reset opens and cancels them by the ten thousand) is shut down,
// and its address refused for a while; other addresses are not
TEST(ServerIntegration, AConnectionPastItsCallsPerSecondIsShutDown) {
  auto server = ServerProcess::start(tiny_model(), {"--max_calls_per_connection=50"});
  ASSERT_NE(server, nullptr);
  client::ChannelOptions co;
  co.own_connection = true;
  auto stub = v1::WorldModel::NewStub(client::make_channel(server->target(), co));
  int ok = 0;
  grpc::Status failed;
  for (int i = 0; i < 400 && failed.ok(); ++i) {
    v1::ServerInfo info;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    const grpc::Status st = stub->GetServerInfo(&ctx, {}, &info);
    if (st.ok()) {
      ++ok;
    } else {
      failed = st;
    }
  }
  EXPECT_EQ(failed.error_code(), grpc::StatusCode::UNAVAILABLE) << failed.error_message();
  EXPECT_GE(ok, 50);
  EXPECT_LT(ok, 400);
  EXPECT_EQ(wait_for_metric(*server, "wm_connections_shut_down_total", 1), 1);
  for (int i = 0; i < 200 && !absl::StrContains(server->log(), "is refused for"); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_TRUE(absl::StrContains(server->log(), "more than 50 calls in a second (--max_calls_per_connection); "
                                               "ipv4:127.0.0.1 is refused for 10 s"))
      << server->log();
  // the address is refused for now, on any new connection, and a client says what that may mean
  const auto blocked =
      client::health_check(client::make_channel(server->target(), co), "", std::chrono::seconds(2));
  EXPECT_FALSE(blocked.serving());
  EXPECT_TRUE(absl::StrContains(client::describe_call_failure(server->target(), blocked.status),
                                "the server may be refusing connections from this address"))
      << client::describe_call_failure(server->target(), blocked.status);
  EXPECT_GE(scrape(*server).at("wm_connections_refused_total{reason=\"client_blocked\"}"), 1);
  expect_server_refuses({"--max_calls_per_connection=-1"}, "--max_calls_per_connection must be 0..1000000");

  // over IPv6 too (gRPC writes an IPv6 peer as a URI, "ipv6:%5B::1%5D:port"), where the machine has it
  const int probe = socket(AF_INET6, SOCK_STREAM, 0);
  sockaddr_in6 loop6{};
  loop6.sin6_family = AF_INET6;
  loop6.sin6_addr = in6addr_loopback;
  const bool has_v6 = probe >= 0 && bind(probe, reinterpret_cast<sockaddr*>(&loop6), sizeof loop6) == 0;
  if (probe >= 0) close(probe);
  if (!has_v6) GTEST_SKIP() << "no IPv6 loopback here";
  auto v6 = ServerProcess::start(tiny_model(), {"--host=::1", "--metrics_host=127.0.0.1", "--max_calls_per_connection=50"});
  ASSERT_NE(v6, nullptr);
  const std::string target6 = "[::1]:" + std::to_string(v6->port());
  auto stub6 = v1::WorldModel::NewStub(client::make_channel(target6, co));
  grpc::Status failed6;
  for (int i = 0; i < 400 && failed6.ok(); ++i) {
    v1::ServerInfo info;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    failed6 = stub6->GetServerInfo(&ctx, {}, &info);
  }
  EXPECT_EQ(failed6.error_code(), grpc::StatusCode::UNAVAILABLE) << failed6.error_message();
  EXPECT_EQ(wait_for_metric(*v6, "wm_connections_shut_down_total", 1), 1);
  for (int i = 0; i < 200 && !absl::StrContains(v6->log(), "is refused for"); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_TRUE(absl::StrContains(v6->log(), "ipv6:[::]/64 is refused for 10 s")) << v6->log();
  // the metrics endpoint has no IPv6 (civetweb as Debian builds it): a clear refusal
  expect_server_refuses({"--host=::1", "--metrics_port=0"}, "the metrics endpoint listens on IPv4 only");
  // an IPv4 address civetweb would bind as another (256.0.0.0: every interface)
  for (const char* host : {"256.0.0.0", "127.0.0.256", "999.9.9.9", "127.1", "0x7f.1", "1.2.3.4.5", "a_b"})
    expect_server_refuses({"--metrics_port=0", std::string("--metrics_host=") + host},
                          "--metrics_host");
}

TEST(ServerIntegration, BadTokenFilesStopTheServerAndTheClientsWithAMessage) {
  const std::string dir = testing::fresh_dir("bad_tokens");
  auto file = [&](const std::string& name, const std::string& text) {
    EXPECT_TRUE(write_file(dir + "/" + name, text.data(), text.size()).ok());
    return dir + "/" + name;
  };
  for (const auto& [flag, says] : std::vector<std::pair<std::string, std::string>>{
           {"--auth_tokens=" + dir + "/none", "--auth_tokens: cannot open"},
           {"--auth_tokens=" + file("empty", "# nobody\n"), "no tokens"},
           {"--auth_tokens=" + file("short", "alice 0123\n"), "line 1: a token is 16..512"},
           {"--auth_tokens=" + file("twice", "a 0123456789abcdef0123\nb 0123456789abcdef0123\n"),
            "line 2: this token is given twice"}}) {
    expect_server_refuses({flag}, says);
  }
  // a readable token file starts, with a warning
  const std::string open_file = file("open", "alice 0123456789abcdef0123\n");
  std::filesystem::permissions(open_file, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write |
                                              std::filesystem::perms::others_read);
  auto server = ServerProcess::start(tiny_model(), {"--auth_tokens=" + open_file});
  ASSERT_NE(server, nullptr);
  EXPECT_TRUE(absl::StrContains(server->log(), "can be read by others (chmod 600 it)")) << server->log();
  // the clients' token file
  for (const auto& [path, says] : std::vector<std::pair<std::string, std::string>>{
           {dir + "/none", "--token_file: cannot open"},
           {file("blank", "\n0123456789abcdef0123\n"), "its first line is empty"},
           {file("spaced", "0123 456789abcdef0123\n"), "without spaces"}}) {
    std::string log;
    EXPECT_EQ(testing::run_program({WMHEALTH_BIN, "--server=127.0.0.1:9", "--token_file=" + path}, &log), 2)
        << path << ":\n" << log;
    EXPECT_TRUE(absl::StrContains(log, says)) << path << ":\n" << log;
  }
  {
    // gRPC would abort the client on a token with a newline in the metadata
    std::string log;
    EXPECT_EQ(testing::run_program({"/bin/sh", "-c",
                                    std::string("WMSERVE_TOKEN=\"$(printf 'abcdefghijklmnop\\nq')\" exec ") +
                                        WMHEALTH_BIN + " --server=127.0.0.1:9"},
                                   &log),
              2)
        << log;
    EXPECT_TRUE(absl::StrContains(log, "WMSERVE_TOKEN: a token is printable characters")) << log;
  }
  // and a good one reaches the server
  std::string log;
  EXPECT_EQ(testing::run_program({WMHEALTH_BIN, "--server=" + server->target(),
                                  "--token_file=" + file("alice", "0123456789abcdef0123\n")},
                                 &log),
            0)
      << log;
}

TEST(ServerIntegration, IdleSessionsExpireAndFreeTheirCache) {
  auto server = ServerProcess::start(tiny_model(), {"--idle_ttl_s=0.5"});
  ASSERT_NE(server, nullptr);
  auto ch = channel(*server);
  client::PlayStream s(ch, std::chrono::system_clock::now() + std::chrono::seconds(20));
  ASSERT_TRUE(s.start(v1::Start()).ok());
  ASSERT_TRUE(s.send_action(client::to_proto(Action{}, 1, 0)));
  v1::PlayResponse r;
  ASSERT_TRUE(s.read(&r));
  EXPECT_TRUE(r.has_frame());
  const auto t0 = std::chrono::steady_clock::now();
  while (s.read(&r)) {
  }
  const grpc::Status st = s.finish();
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << st.error_message();
  EXPECT_TRUE(absl::StrContains(st.error_message(), "idle TTL")) << st.error_message();
  EXPECT_GT(waited, 0.3);
  EXPECT_LT(waited, 3.0);
  auto stub = v1::WorldModel::NewStub(ch);
  v1::ServerInfo info;
  for (int i = 0; i < 100; ++i) {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub->GetServerInfo(&ctx, {}, &info).ok());
    if (info.sessions_active() == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(info.sessions_active(), 0);
  EXPECT_EQ(info.kv_reserved_bytes(), 0);
  const auto m = scrape(*server);
  EXPECT_EQ(m.at("wm_sessions_evicted_total{reason=\"idle_ttl\"}"), 1);
  EXPECT_EQ(m.at("wm_sessions_ended_total{reason=\"idle_ttl\"}"), 1);
}

// the next frame of a stream (skipping events); false at its end
bool next_frame(client::PlayStream& s, v1::Frame* frame) {
  v1::PlayResponse r;
  while (s.read(&r))
    if (r.has_frame()) {
      *frame = r.frame();
      return true;
    }
  return false;
}

TEST(ServerIntegration, AResumedSessionContinuesExactlyWhereItsBrokenStreamStopped) {
  const std::string session_log = testing::fresh_dir("resume_log") + "/sessions.jsonl";
  // --park_ttl_s 30 by default
  auto server = ServerProcess::start(tiny_model(), {"--session_log=" + session_log});
  ASSERT_NE(server, nullptr);
  auto ch = channel(*server);
  const auto actions = script_actions();
  const size_t n = 7;  // played before the stream breaks; the rest after the resume
  // the reference: one unbroken session
  const PlayResult whole = client::play(ch, per_action(7, actions));
  ASSERT_TRUE(whole.status.ok()) << whole.status.error_message();
  ASSERT_EQ(whole.frames.size(), actions.size());

  const auto deadline = std::chrono::system_clock::now() + std::chrono::seconds(30);
  auto first = std::make_unique<client::PlayStream>(ch, deadline);
  v1::Start start;
  start.set_seed(7);
  ASSERT_TRUE(first->start(start).ok());
  const v1::Started started = first->started();
  EXPECT_FALSE(started.resumed());
  ASSERT_EQ(started.resume_token().size(), 32u);  // 128 bits, hex
  EXPECT_NE(started.resume_token(), whole.started.resume_token());
  for (size_t i = 0; i < n; ++i) {
    ASSERT_TRUE(first->send_action(client::to_proto(actions[i], i + 1, client::now_us())));
    v1::Frame f;
    ASSERT_TRUE(next_frame(*first, &f));
    EXPECT_EQ(f.index(), static_cast<int64_t>(i));
    EXPECT_EQ(f.jpeg(), whole.frames[i].jpeg) << "frame " << i;
  }
  // the token of a session attached to a live stream is refused
  v1::Start resume;
  resume.set_resume_token(started.resume_token());
  {
    client::PlayStream twin(ch, deadline);
    const grpc::Status st = twin.start(resume);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::ALREADY_EXISTS) << st.error_message();
  }
  // the network drops: the session is parked, still holding its reservation
  first->cancel();
  EXPECT_EQ(first->finish().error_code(), grpc::StatusCode::CANCELLED);
  first.reset();
  EXPECT_EQ(wait_for_metric(*server, "wm_sessions_parked", 1), 1);
  {
    v1::ServerInfo info;
    grpc::ClientContext ctx;
    ASSERT_TRUE(v1::WorldModel::NewStub(ch)->GetServerInfo(&ctx, {}, &info).ok());
    EXPECT_EQ(info.sessions_active(), 1);
    EXPECT_EQ(info.kv_reserved_bytes(), started.kv_reserved_bytes());
  }

  // resume: the other fields of the Start are ignored, the session keeps its own
  resume.set_seed(999);
  resume.set_cache_format("no-such-format");
  client::PlayStream second(ch, deadline);
  const grpc::Status st = second.start(resume);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_TRUE(second.started().resumed());
  EXPECT_EQ(second.started().session_id(), started.session_id());
  EXPECT_EQ(second.started().resume_token(), started.resume_token());
  EXPECT_EQ(second.started().cache_format(), started.cache_format());
  EXPECT_EQ(second.started().width(), started.width());
  EXPECT_EQ(second.started().jpeg_quality(), started.jpeg_quality());
  EXPECT_EQ(wait_for_metric(*server, "wm_sessions_parked", 0), 0);
  // action seqs start afresh on the new stream; frame indices go on
  for (size_t i = n; i < actions.size(); ++i) {
    ASSERT_TRUE(second.send_action(client::to_proto(actions[i], i - n + 1, client::now_us())));
    v1::Frame f;
    ASSERT_TRUE(next_frame(second, &f));
    EXPECT_EQ(f.index(), static_cast<int64_t>(i));
    EXPECT_EQ(f.last_action_seq(), i - n + 1);
    EXPECT_EQ(f.jpeg(), whole.frames[i].jpeg) << "frame " << i;
  }
  // a half-close ends the session for good: its token is dead
  second.writes_done();
  v1::Frame f;
  EXPECT_FALSE(next_frame(second, &f));
  EXPECT_TRUE(second.finish().ok());
  EXPECT_EQ(wait_for_metric(*server, "wm_sessions_active", 0), 0);
  client::PlayStream again(ch, deadline);
  const grpc::Status gone = again.start(resume);
  EXPECT_EQ(gone.error_code(), grpc::StatusCode::NOT_FOUND) << gone.error_message();
  // a half-closed session is counted once its stream is over
  EXPECT_EQ(wait_for_metric(*server, "wm_sessions_ended_total{reason=\"client_closed\"}", 2), 2);
  const auto m = scrape(*server);
  EXPECT_EQ(m.at("wm_sessions_resumed_total"), 1);
  EXPECT_EQ(m.at("wm_sessions_parked_total"), 1);
  EXPECT_EQ(m.at("wm_sessions_started_total"), 2);
  EXPECT_EQ(m.at("wm_sessions_ended_total{reason=\"client_closed\"}"), 2);
  EXPECT_EQ(m.at("wm_sessions_rejected_total{reason=\"resume_attached\"}"), 1);
  EXPECT_EQ(m.at("wm_sessions_rejected_total{reason=\"resume_not_found\"}"), 1);

  // the session log: one line per event, refusals not among them
  const std::vector<nlohmann::json> lines = session_log_lines(session_log, 6);
  ASSERT_EQ(lines.size(), 6u) << *read_file(session_log);
  // each session's events in order (a half-closed session's end is written
  // once its stream is over, which may come after the next one's start)
  const std::string whole_id = whole.started.session_id(), id = started.session_id();
  std::map<std::string, std::vector<nlohmann::json>> of;
  for (const nlohmann::json& l : lines) {
    EXPECT_EQ(l["client"], "ipv4:127.0.0.1") << l;
    EXPECT_EQ(l["time"].get<std::string>().size(), 24u) << l;  // 2026-12-01T12:00:00.000Z
    of[l["session"].get<std::string>()].push_back(l);
  }
  ASSERT_EQ(of[whole_id].size(), 2u);
  ASSERT_EQ(of[id].size(), 4u);
  const std::vector<std::string> whole_events{"start", "end"}, events{"start", "park", "resume", "end"};
  for (size_t i = 0; i < 2; ++i) EXPECT_EQ(of[whole_id][i]["event"], whole_events[i]) << of[whole_id][i];
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(of[id][i]["event"], events[i]) << of[id][i];
  const nlohmann::json &id_start = of[id][0], &whole_end = of[whole_id][1], &id_end = of[id][3];
  EXPECT_EQ(id_start["seed"], 7);
  EXPECT_EQ(id_start["format"], "fp16");
  EXPECT_EQ(id_start["pacing"], "per_action");
  EXPECT_EQ(id_start["kv_reserved_bytes"], started.kv_reserved_bytes());
  EXPECT_EQ(whole_end["reason"], "client_closed");
  EXPECT_EQ(whole_end["frames_sent"], actions.size());
  EXPECT_EQ(id_end["reason"], "client_closed");
  EXPECT_EQ(id_end["frames_sent"], actions.size() - n) << "the frames of its last stream";
  EXPECT_GT(id_end["seconds"].get<double>(), 0);
}

// a message over --max_request_bytes in a started session: gRPC ends the
// stream itself (RESOURCE_EXHAUSTED) and the server learns only that its
// read failed, as at a half-close, and then that the stream was cancelled.
// The session ends as cancelled, not as a client that closed on purpose,
// in the metrics and in the session log; the server goes on. (Parking is
// off: where the server sees the cancellation before the failed read, the
// stream is a broken one and its session would be parked.)
TEST(ServerIntegration, AnOversizeMessageMidSessionEndsItAsCancelled) {
  const std::string session_log = testing::fresh_dir("oversize_log") + "/sessions.jsonl";
  auto server = ServerProcess::start(
      tiny_model(), {"--max_request_bytes=1048576", "--park_ttl_s=0", "--session_log=" + session_log});
  ASSERT_NE(server, nullptr);
  const v1::PlayRequest huge = start_req([](v1::Start* s) { s->add_prompt_jpeg(std::string(1100 * 1024, 'x')); });
  std::vector<v1::PlayResponse> got;
  // the oversize message once Started and the action's frame have come
  const grpc::Status st = raw_play_status(
      *server, {start_req().SerializeAsString(), action_req(1).SerializeAsString(), huge.SerializeAsString()}, &got,
      /*hold_last=*/2);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << st.error_message();
  ASSERT_EQ(got.size(), 2u);
  EXPECT_TRUE(got[0].has_started());
  EXPECT_TRUE(got[1].has_frame());
  EXPECT_EQ(wait_for_metric(*server, "wm_sessions_ended_total{reason=\"cancelled\"}", 1), 1);
  EXPECT_EQ(wait_for_metric(*server, "wm_sessions_active", 0), 0);
  // a session that half-closes gets its frames, OK, and counts as client_closed
  got.clear();
  const grpc::Status clean =
      raw_play_status(*server, {start_req().SerializeAsString(), action_req(1).SerializeAsString()}, &got);
  EXPECT_TRUE(clean.ok()) << clean.error_message();
  EXPECT_EQ(got.size(), 2u) << "Started and the action's frame";
  EXPECT_EQ(wait_for_metric(*server, "wm_sessions_ended_total{reason=\"client_closed\"}", 1), 1);
  const auto m = scrape(*server);
  EXPECT_EQ(m.at("wm_sessions_ended_total{reason=\"cancelled\"}"), 1);
  EXPECT_EQ(m.at("wm_sessions_started_total"), 2);
  std::vector<nlohmann::json> ends;
  for (const nlohmann::json& j : session_log_lines(session_log, 4))  // two starts, two ends
    if (j["event"] == "end") ends.push_back(j);
  ASSERT_EQ(ends.size(), 2u);
  EXPECT_EQ(ends[0]["reason"], "cancelled");
  EXPECT_EQ(ends[1]["reason"], "client_closed");
  EXPECT_EQ(ends[1]["frames_sent"], 1);
}

TEST(ServerIntegration, ParkedSessionsExpireAndFreeTheirCache) {
  auto server = ServerProcess::start(tiny_model(), {"--park_ttl_s=0.6"});
  ASSERT_NE(server, nullptr);
  auto ch = channel(*server);
  client::PlayStream s(ch, std::chrono::system_clock::now() + std::chrono::seconds(20));
  ASSERT_TRUE(s.start(v1::Start()).ok());
  const std::string token = s.started().resume_token();
  ASSERT_TRUE(s.send_action(client::to_proto(Action{}, 1, 0)));
  v1::Frame f;
  ASSERT_TRUE(next_frame(s, &f));
  s.cancel();
  s.finish();
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(wait_for_metric(*server, "wm_sessions_ended_total{reason=\"park_expired\"}", 1), 1);
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_GT(waited, 0.3);
  EXPECT_LT(waited, 3.0);
  EXPECT_EQ(wait_for_metric(*server, "wm_sessions_parked", 0), 0);
  v1::ServerInfo info;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(v1::WorldModel::NewStub(ch)->GetServerInfo(&ctx, {}, &info).ok());
  }
  EXPECT_EQ(info.sessions_active(), 0);
  EXPECT_EQ(info.kv_reserved_bytes(), 0);
  v1::Start resume;
  resume.set_resume_token(token);
  client::PlayStream late(ch);
  const grpc::Status st = late.start(resume);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::NOT_FOUND) << st.error_message();
  EXPECT_TRUE(absl::StrContains(st.error_message(), "unknown or expired resume token")) << st.error_message();
  // --park_ttl_s 0: a broken stream closes its session at once
  auto no_park = ServerProcess::start(tiny_model(), {"--park_ttl_s=0"});
  ASSERT_NE(no_park, nullptr);
  client::PlayStream t(channel(*no_park));
  ASSERT_TRUE(t.start(v1::Start()).ok());
  t.cancel();
  t.finish();
  EXPECT_EQ(wait_for_metric(*no_park, "wm_sessions_ended_total{reason=\"cancelled\"}", 1), 1);
  EXPECT_EQ(scrape(*no_park).at("wm_sessions_parked_total"), 0);
}

TEST(ServerIntegration, ASlowReaderLosesFramesNotMemoryAndOthersDoNotNotice) {
  auto server = ServerProcess::start(tiny_model());
  ASSERT_NE(server, nullptr);
  // warm up, then measure the server's memory
  ASSERT_TRUE(client::play(channel(*server), per_action(1, script_actions())).status.ok());
  const int64_t rss0 = server->rss_bytes();
  // the slow reader: 200 frames/s for 3 s at the highest quality, reading
  // nothing for 2.5 s; a small HTTP/2 window so that the transport fills up
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 16 * 1024);
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  auto slow_ch = grpc::CreateCustomChannel(server->target(), grpc::InsecureChannelCredentials(), args);
  auto slow = std::async(std::launch::async, [&] {
    PlayConfig pc;
    pc.start.set_pacing(v1::PACING_FIXED_RATE);
    pc.start.set_fps(200);
    pc.start.set_jpeg_quality(100);
    pc.actions = std::vector<Action>(60, Action{1, {5, 0}, 0});
    pc.send_fps = 20;
    pc.reader_stall_s = 2.5;
    pc.timeout_s = 30;
    return client::play(slow_ch, pc);
  });
  // a normal player at the same time
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  PlayConfig normal = per_action(2, std::vector<Action>(100, Action{2, {0, 1}, 0}));
  const PlayResult n = client::play(client::make_channel(server->target(), {.own_connection = true}), normal);
  const int64_t rss_during = server->rss_bytes();
  const PlayResult s = slow.get();
  ASSERT_TRUE(s.status.ok()) << s.status.error_message();
  ASSERT_TRUE(n.status.ok()) << n.status.error_message();

  std::vector<int64_t> idx;
  for (const auto& f : s.frames) idx.push_back(f.index);
  ASSERT_FALSE(idx.empty());
  // frames before the first one received were dropped too (a loaded machine
  // can be slow to write Started while the first blocks arrive)
  const int64_t gaps = client::count_index_gaps(idx) + idx.front();
  EXPECT_GT(gaps, 100) << "the stalled reader should have lost most frames";
  EXPECT_EQ(s.frames.back().frames_dropped, static_cast<uint64_t>(gaps));
  const auto m = scrape(*server);
  EXPECT_GE(m.at("wm_frames_dropped_total{reason=\"slow_client\"}"), static_cast<double>(gaps));
  // the normal player got every frame, none dropped, promptly
  EXPECT_EQ(n.frames.size(), 100u);
  EXPECT_EQ(n.frames.back().frames_dropped, 0u);
  EXPECT_LT(client::percentile(n.action_to_frame_s, 0.5), 0.25);
  // nothing piled up in the server: ~600 frames at q100 would be megabytes
  EXPECT_LT(rss_during - rss0, int64_t{24} << 20) << "rss " << rss0 << " -> " << rss_during;
  EXPECT_LT(server->rss_bytes() - rss0, int64_t{24} << 20);
}

TEST(ServerIntegration, FixedRatePacingKeepsASteadyRateWithTheLatestAction) {
  auto server = ServerProcess::start(tiny_model());
  ASSERT_NE(server, nullptr);
  PlayConfig pc;
  pc.start.set_pacing(v1::PACING_FIXED_RATE);
  pc.start.set_fps(25);
  pc.actions = script_actions();  // 16 actions at 10/s: 1.6 s
  pc.send_fps = 10;
  pc.linger_s = 0.4;  // frames go on without new actions
  const PlayResult r = client::play(channel(*server), pc);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.started.pacing(), v1::PACING_FIXED_RATE);
  // about 25 frames a second for about 2 s
  EXPECT_GT(r.frames.size(), 35u);
  EXPECT_LT(r.frames.size(), 65u);
  const double mean_interval = client::mean(r.intervals_s());
  EXPECT_NEAR(mean_interval, 0.040, 0.012);
  // every action got applied; frames repeat the latest one in between
  EXPECT_EQ(r.last_acked_seq, script_actions().size());
  int repeats = 0;
  for (size_t i = 1; i < r.frames.size(); ++i)
    repeats += r.frames[i].last_action_seq == r.frames[i - 1].last_action_seq ? 1 : 0;
  EXPECT_GT(repeats, 10);
  EXPECT_EQ(r.frames.back().last_action_seq, script_actions().size());
}

TEST(ServerIntegration, MetricsAreScrapedOverHttp) {
  auto server = ServerProcess::start(tiny_model(), {"--kv_budget_bytes=5000000"});
  ASSERT_NE(server, nullptr);
  const PlayResult r = client::play(channel(*server), per_action(1, script_actions()));
  ASSERT_TRUE(r.status.ok());
  // the client has its status once the stream finishes; the server counts
  // the session's end right after: scrape once it has (on a loaded machine
  // the scrape could come first)
  wait_for_metric(*server, "wm_sessions_ended_total{reason=\"client_closed\"}", 1);
  int code = 0;
  const std::string body = testing::http_get(server->metrics_port(), "/metrics", &code);
  ASSERT_EQ(code, 200);
  const auto m = testing::parse_prometheus(body);
  ASSERT_FALSE(m.empty());
  for (const auto& [name, value] : m) {
    // ours, and prometheus-cpp's own exposer_* family
    EXPECT_TRUE(name.rfind("wm_", 0) == 0 || name.rfind("exposer_", 0) == 0) << name;
    EXPECT_FALSE(absl::StrContains(name, "session_id")) << name;
    EXPECT_FALSE(absl::StrContains(name, r.started.session_id())) << name;
  }
  const double frames = static_cast<double>(r.frames.size());
  EXPECT_EQ(m.at("wm_frames_sent_total"), frames);
  EXPECT_EQ(m.at("wm_actions_received_total"), frames);
  EXPECT_EQ(m.at("wm_sessions_started_total"), 1);
  EXPECT_EQ(m.at("wm_sessions_ended_total{reason=\"client_closed\"}"), 1);
  EXPECT_EQ(m.at("wm_action_to_frame_seconds_count"), frames);
  EXPECT_EQ(m.at("wm_jpeg_encode_seconds_count"), frames);
  EXPECT_EQ(m.at("wm_time_to_first_frame_seconds_count"), 1);
  EXPECT_EQ(m.at("wm_inter_frame_interval_seconds_count"), frames - 1);
  EXPECT_EQ(m.at("wm_step_duration_seconds_count"), frames);
  EXPECT_EQ(m.at("wm_step_wait_seconds_count"), frames);  // one session, one frame a step
  EXPECT_GE(m.at("wm_step_wait_seconds_sum"), 0);
  EXPECT_EQ(m.at("wm_batch_size_sum"), frames);
  EXPECT_EQ(m.at("wm_action_to_frame_seconds_bucket{le=\"+Inf\"}"), frames);
  EXPECT_EQ(m.at("wm_kv_cache_bytes_capacity"), 5000000);
  EXPECT_EQ(m.at("wm_kv_cache_compression_ratio{format=\"fp16\"}"), 1);
  EXPECT_EQ(m.at("wm_kv_cache_session_reserved_bytes{format=\"fp16\"}"), 40960);
  EXPECT_EQ(m.at("wm_frames_dropped_total{reason=\"slow_client\"}"), 0);
  EXPECT_EQ(m.count("wm_sessions_active"), 1u);
  EXPECT_EQ(m.count("wm_sessions_queued"), 1u);
  EXPECT_EQ(m.count("wm_kv_cache_usage_ratio"), 1u);
  EXPECT_EQ(m.count("wm_kv_cache_bytes_used"), 1u);
  // SIGTERM with nothing open: exit 0 at once
  server->signal(SIGTERM);
  EXPECT_EQ(server->wait_exit(5), std::optional<int>(0)) << server->log();
}

// a flag value the server cannot honour stops it at start-up with a message
// naming the flag (values that used to be accepted and then overflowed a
// clock, aborted the process on the first session, or admitted nothing)
TEST(ServerIntegration, BadFlagValuesStopTheServerWithAMessage) {
  for (const auto& [flag, says] : std::vector<std::pair<std::string, std::string>>{
           {"--max_fps=1e12", "--max_fps"}, {"--max_fps=inf", "--max_fps"}, {"--park_ttl_s=1e300", "--park_ttl_s"},
           {"--idle_ttl_s=nan", "--idle_ttl_s"}, {"--shutdown_grace_s=nan", "--shutdown_grace_s"},
           {"--threads=-1", "--threads"}, {"--kv_budget_bytes=100", "--kv_budget_bytes"},
           {"--max_batch_wait_ms=1e12", "--max_batch_wait_ms"}, {"--max_batch_wait_ms=nan", "--max_batch_wait_ms"},
           {"--action_queue=2000000000", "--action_queue"}, {"--max_prompt_frames=100000000", "--max_prompt_frames"},
           // milliseconds in an int: 2147484 s wrapped to a ping every few microseconds
           {"--keepalive_time_s=2147484", "--keepalive_time_s"},
           {"--keepalive_timeout_s=0", "--keepalive_timeout_s"},
           {"--min_client_ping_interval_s=3000000", "--min_client_ping_interval_s"},
           {"--client_prompt_rate=nan", "--client_prompt_rate"}, {"--client_prompt_rate=-1", "--client_prompt_rate"},
           {"--client_prompt_burst=0", "--client_prompt_burst"},
           {"--session_log=/nonexistent-dir/sessions.jsonl", "cannot open for appending"},
           {"--session_log=", "--session_log: give -, a file, or off"},
           // a 16-frame Start could never be paid for
           {"--client_prompt_burst=15", "is below --max_prompt_frames 16"},
           {"stray_word", "unexpected argument 'stray_word'"}}) {
    expect_server_refuses({flag}, says);
  }
}

// the clients check their flags before they connect: a value that would
// overflow a clock (NaN, 1e300, a rate whose period is 1e300 s) is refused
// with exit 2 (wmbench, wmhealth) or 1 (wmplay) and a message naming it; no
// server listens on port 9, so a value that slipped through would be reported
// as "cannot reach" instead
TEST(ServerIntegration, ClientsRefuseFlagValuesThatOverflowAClock) {
  const std::string nowhere = "--server=127.0.0.1:9";
  for (const auto& [argv, says] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{WMHEALTH_BIN, nowhere, "--wait_s=nan"}, "--wait_s"},
           {{WMHEALTH_BIN, nowhere, "--wait_s=1e300"}, "--wait_s"},
           {{WMBENCH_BIN, nowhere, "--timeout_s=1e300"}, "--timeout_s"},
           {{WMBENCH_BIN, nowhere, "--pacing=realtime", "--fps=1e-300"}, "--fps"},
           {{WMPLAY_BIN, nowhere, "--headless", "--script=x", "--out=/nonexistent", "--timeout_s=nan"}, "--timeout_s"},
           {{WMPLAY_BIN, nowhere, "--headless", "--script=x", "--out=/nonexistent", "--fps=1e-9"}, "--fps"},
           {{WMPLAY_BIN, nowhere, "--web=127.0.0.1:0", "--fps=1e-5"}, "--fps"},
           {{WMPLAY_BIN, nowhere, "--web=127.0.0.1:0", "--fps=nan"}, "--fps"},  // used to become 20
           {{WMPLAY_BIN, nowhere, "--web=127.0.0.1:0", "--port_file=/nonexistent/p.json"}, "--port_file"},
           // a port past 65535 wrapped around to another server's
           {{WMPLAY_BIN, "--server=127.0.0.1:65545", "--headless", "--script=x", "--out=/nonexistent"}, "--server"},
           {{WMBENCH_BIN, "--server=localhost:-1"}, "--server"},
           {{WMHEALTH_BIN, "--server=[::1]:99999"}, "--server"},
           // an IPv6 address without brackets went to gRPC's default port, 443
           {{WMHEALTH_BIN, "--server=::1"}, "--server"},
           {{WMBENCH_BIN, "--server=fe80::1:50051"}, "--server"},
           // no port: gRPC dialled 443 for a trailing colon and 0 for a bare [v6]
           {{WMHEALTH_BIN, "--server=localhost:"}, "--server"},
           {{WMHEALTH_BIN, "--server=[::1]"}, "--server"},
           // prompts past what any server takes are refused before they are read
           {{WMPLAY_BIN, "--server=127.0.0.1:9", "--headless", "--script=x", "--out=/nonexistent",
             "--prompt=" + absl::StrJoin(std::vector<std::string>(257, "/nonexistent.jpg"), ",")},
            "--prompt"}}) {
    std::string log;
    const int rc = testing::run_program(argv, &log);
    EXPECT_TRUE(rc == 1 || rc == 2) << argv[0] << " " << argv.back() << ":\n" << log;
    EXPECT_TRUE(absl::StrContains(log, says + " must") || absl::StrContains(log, "cannot write " + says) ||
                absl::StrContains(log, says + " '"))
        << argv[0] << " " << argv.back() << ":\n" << log;
  }
}

// wmplay --web refuses an address it would not bind as typed: civetweb read
// an IPv4 address's numbers unchecked and shifted them into place, so
// 256.0.0.0 bound every interface and 127.0.0.257 bound 127.0.1.1 while the
// page's address printed was the typed one. `timeout` ends a wmplay that
// listens after all (exit 124)
TEST(ServerIntegration, WmplayWebRefusesAnAddressItWouldNotBindAsTyped) {
  const std::string port_file = testing::fresh_dir("web_address") + "/port.json";
  auto run_web = [&](const std::string& address, double seconds, std::string* log) {
    return testing::run_program({"/usr/bin/timeout", absl::StrFormat("%g", seconds), WMPLAY_BIN,
                                 "--server=127.0.0.1:9", "--web=" + address, "--port_file=" + port_file},
                                log);
  };
  for (const std::string address : {"256.0.0.0:0", "999.1.1.1:0", "127.0.0.257:0", "1.2.3:0", "127.0.0.1.5:0",
                                    "127.0.0.01:0", "0x7f.1:0", "127.0.0.1 :0", "127.0.0.1:65536", "127.0.0.1:0s",
                                    "127.0.0.1:", "127.0.0.1", "8080", ":0", "::1:0", "[127.0.0.1]:0",
                                    "127.0.0.1:0,[::1]:0"}) {
    std::string log;
    EXPECT_EQ(run_web(address, 10, &log), 2) << address << ":\n" << log;
    EXPECT_TRUE(absl::StrContains(log, "--web")) << address << ":\n" << log;
    EXPECT_FALSE(absl::StrContains(log, "open http://")) << address << ":\n" << log;
  }
  // a host name is resolved (by civetweb) and served as before
  std::string log;
  EXPECT_EQ(run_web("localhost:0", 5, &log), 124) << log;
  EXPECT_TRUE(absl::StrContains(log, "open http://localhost:")) << log;
}

// a wmplay --headless run that fails before its first frame leaves DIR as
// the last good run left it: its frames and the summary that counts them
// (the frames used to be deleted first, leaving a summary of 3 frames beside
// none); a run that succeeds replaces both
TEST(ServerIntegration, WmplayHeadlessOutputStaysConsistentWhenARunFails) {
  auto server = ServerProcess::start(tiny_model());
  ASSERT_NE(server, nullptr);
  const std::string dir = testing::fresh_dir("headless_out"), out = dir + "/out";
  auto script = [&](const std::string& name, const std::string& text) {
    EXPECT_TRUE(write_file(dir + "/" + name, text.data(), text.size()).ok());
    return dir + "/" + name;
  };
  const std::string three = script("three.txt", "W 0 0 *3\n"), two = script("two.txt", "D 0 0 *2\n");
  auto run = [&](const std::string& script_path, const std::string& format) {
    std::string log;
    const int rc = testing::run_program({WMPLAY_BIN, "--server=" + server->target(), "--headless",
                                         "--script=" + script_path, "--out=" + out, "--format=" + format},
                                        &log);
    return std::make_pair(rc, log);
  };
  auto frame_files = [&] {
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(out))
      if (e.path().filename().string().rfind("frame_", 0) == 0) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  };
  auto summary = [&] { return nlohmann::json::parse(read_file(out + "/summary.json").value_or("null")); };
  const std::vector<std::string> first_frames = {"frame_00000.jpg", "frame_00001.jpg", "frame_00002.jpg"};

  auto [rc, log] = run(three, "");
  ASSERT_EQ(rc, 0) << log;
  ASSERT_EQ(frame_files(), first_frames);
  ASSERT_EQ(summary().value("frames", -1), 3) << summary();

  std::tie(rc, log) = run(two, "bogus");
  EXPECT_EQ(rc, 1) << log;
  EXPECT_TRUE(absl::StrContains(log, "unknown cache format")) << log;
  EXPECT_EQ(frame_files(), first_frames);
  EXPECT_EQ(summary().value("frames", -1), 3) << summary();
  EXPECT_EQ(summary().value("status", ""), "OK") << summary();

  std::tie(rc, log) = run(two, "");
  ASSERT_EQ(rc, 0) << log;
  EXPECT_EQ(frame_files(), (std::vector<std::string>{"frame_00000.jpg", "frame_00001.jpg"}));
  EXPECT_EQ(summary().value("frames", -1), 2) << summary();
}

// a Play stream carries the first two mouse axes: wmplay refuses a script
// that moves a later axis of a model that has one (it used to drop the
// movement, and the frames silently differed from wmgen's)
TEST(ServerIntegration, WmplayRefusesMovementOnAxesAPlayStreamCannotCarry) {
  const std::string model = testing::fresh_dir("tiny_four_axes");
  auto config = load_model_config(std::string(WM_SOURCE_DIR) + "/configs/tiny-test.json");
  ASSERT_TRUE(config.ok()) << config.status();
  config->actions.mouse = {"yaw", "pitch", "roll", "zoom"};
  ASSERT_TRUE(save_checkpoint(*config, random_host_weights(*config, 1), model).ok());
  auto server = ServerProcess::start(model);
  ASSERT_NE(server, nullptr);
  const std::string dir = testing::fresh_dir("four_axes_play");
  auto run = [&](const std::string& text) {
    EXPECT_TRUE(write_file(dir + "/script.txt", text.data(), text.size()).ok());
    std::string log;
    const int rc = testing::run_program({WMPLAY_BIN, "--server=" + server->target(), "--headless",
                                         "--script=" + dir + "/script.txt", "--out=" + dir + "/out"},
                                        &log);
    return std::make_pair(rc, log);
  };
  auto [rc, log] = run("W 1 2 0 0\nD 0 0 0 3\n");
  EXPECT_EQ(rc, 1) << log;
  EXPECT_TRUE(absl::StrContains(log, "action 2 moves mouse axis 'zoom', which a Play stream cannot carry")) << log;
  std::tie(rc, log) = run("W 1 2 0 0\nD -1 0 0 0\n");
  EXPECT_EQ(rc, 0) << log;
}

// a TCP socket listening on 127.0.0.1 at a free port (*port), never
// accepting: the kernel still completes connections up to `backlog`. With
// reuse_port another socket may bind the same port. -1 on failure
int listen_on_loopback(int backlog, bool reuse_port, int* port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  const int one = 1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if ((reuse_port && setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one)) != 0) ||
      bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(fd, backlog) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    close(fd);
    return -1;
  }
  *port = ntohs(addr.sin_port);
  return fd;
}

// a port that takes connections and never answers (a hung server, the wrong
// service) costs the clients their --timeout_s, not the fixed deadline of
// their first call (10 s for wmplay's ListModels, 5 s for wmbench's
// GetServerInfo)
TEST(ServerIntegration, ClientsGiveUpOnASilentServerWithinTheirTimeout) {
  // a listening socket that never accepts: the kernel completes the
  // connection, and nothing is ever sent on it
  int port = 0;
  const int fd = listen_on_loopback(16, /*reuse_port=*/false, &port);
  ASSERT_GE(fd, 0);
  const std::string server = absl::StrFormat("--server=127.0.0.1:%d", port);
  const std::string dir = testing::fresh_dir("silent_server");
  ASSERT_TRUE(write_file(dir + "/script.txt", "W 0 0 *2\n", 9).ok());
  for (const auto& argv : std::vector<std::vector<std::string>>{
           {WMPLAY_BIN, server, "--headless", "--script=" + dir + "/script.txt", "--out=" + dir + "/out",
            "--timeout_s=0.5"},
           {WMBENCH_BIN, server, "--sessions=1", "--frames=1", "--timeout_s=0.5"}}) {
    std::string log;
    const auto t0 = std::chrono::steady_clock::now();
    EXPECT_EQ(testing::run_program(argv, &log), 1) << argv[0] << ":\n" << log;
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    // 0.5 s asked; the old fixed deadlines took 10 and 5 s: the margin is for a loaded machine
    EXPECT_LT(took, 4.0) << argv[0] << ":\n" << log;
    EXPECT_TRUE(absl::StrContains(log, "cannot reach wmserve")) << argv[0] << ":\n" << log;
  }
  close(fd);
}

// a client that asks for more actions in flight than the server queues
// keeps to the server's capacity: every action gets its frame, none is
// refused (a window of 1000 used to lose most of the script)
TEST(ServerIntegration, APlayWindowKeepsToTheServersActionQueue) {
  auto server = ServerProcess::start(tiny_model(), {"--action_queue=3"});
  ASSERT_NE(server, nullptr);
  PlayConfig pc = per_action(5, std::vector<Action>(40, Action{1, {2, 0}, 0}));
  pc.window = 1000;
  const PlayResult r = client::play(channel(*server), pc);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.started.action_queue_capacity(), 3);
  for (const auto& e : r.events) EXPECT_NE(e.code(), "ACTION_QUEUE_FULL") << e.message();
  ASSERT_FALSE(r.frames.empty());
  EXPECT_EQ(r.frames.back().last_action_seq, 40u);
}

// what a browser or a scanner sends to the metrics port gets an HTTP error
// and nothing else: the server, its metrics and its sessions go on (an error
// page used to overflow the HTTP server's worker stack and kill the process)
TEST(ServerIntegration, TheMetricsPortAnswersStrayRequestsAndStaysUp) {
  auto server = ServerProcess::start(tiny_model());
  ASSERT_NE(server, nullptr);
  for (const auto& [method, path] : std::vector<std::pair<std::string, std::string>>{
           {"GET", "/"}, {"GET", "/favicon.ico"}, {"POST", "/metrics"}, {"HEAD", "/metrics"},
           {"GET", "/../../etc/passwd"}, {"DELETE", "/metrics"}}) {
    int code = 0;
    testing::http_request(server->metrics_port(), method, path, &code);
    EXPECT_GE(code, 400) << method << " " << path;
    EXPECT_LT(code, 500) << method << " " << path;
    ASSERT_FALSE(server->wait_exit(0.2).has_value()) << method << " " << path << " killed the server:\n"
                                                   << server->log();
  }
  const PlayResult r = client::play(channel(*server), per_action(1, script_actions()));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  int code = 0;
  const auto m = testing::parse_prometheus(testing::http_get(server->metrics_port(), "/metrics", &code));
  EXPECT_EQ(code, 200);
  EXPECT_EQ(m.at("wm_frames_sent_total"), static_cast<double>(r.frames.size()));
}

// idle connections to the metrics port (a scanner, a stuck scraper) hold
// HTTP threads until their request timeout; scrapes still get through
// a connection that never finishes its handshake is closed after
// --handshake_timeout_s (gRPC's default would keep it 120 s): idle
// connections cannot pile up until the server runs out of descriptors
TEST(ServerIntegration, ConnectionsThatNeverHandshakeAreClosed) {
  auto server = ServerProcess::start(tiny_model(), {"--handshake_timeout_s=1"});
  ASSERT_NE(server, nullptr);
  const int fd = testing::idle_connection(server->port());
  ASSERT_GE(fd, 0);
  timeval tv{20, 0};
  ASSERT_EQ(setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv), 0);
  const auto t0 = std::chrono::steady_clock::now();
  char buf[256];
  ssize_t n = 0;
  while ((n = ::read(fd, buf, sizeof buf)) > 0) {  // the server's SETTINGS, then its close
  }
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ::close(fd);
  EXPECT_EQ(n, 0) << "closed by the server, not timed out here";
  EXPECT_LT(waited, 15.0);
  // and a client that does talk is served as before
  EXPECT_TRUE(client::health_check(channel(*server), "").serving());
  std::string log;
  EXPECT_EQ(testing::run_program({WMSERVE_BIN, "--model=" + tiny_model(), "--port=0", "--metrics_port=-1",
                                  "--handshake_timeout_s=0"},
                                 &log),
            1);
  EXPECT_TRUE(absl::StrContains(log, "--handshake_timeout_s must be 1..300")) << log;
}

TEST(ServerIntegration, IdleConnectionsDoNotHoldUpTheMetrics) {
  auto server = ServerProcess::start(tiny_model());
  ASSERT_NE(server, nullptr);
  std::vector<int> idle;
  for (int i = 0; i < 4; ++i) idle.push_back(testing::idle_connection(server->metrics_port()));
  for (int fd : idle) ASSERT_GE(fd, 0);
  int code = 0;
  // each idle connection would hold its thread for the request timeout (30 s
  // with civetweb's defaults, on 2 threads): a scrape gets no answer in 10 s
  const auto m = testing::parse_prometheus(
      testing::http_request(server->metrics_port(), "GET", "/metrics", &code, /*timeout_s=*/10));
  EXPECT_EQ(code, 200);
  EXPECT_EQ(m.count("wm_sessions_active"), 1u);
  for (int fd : idle) close(fd);
}

// a port another process listens on stops the server, even when that
// listener allows port sharing (gRPC's own default)
TEST(ServerIntegration, APortInUseStopsTheServer) {
  int port = 0;
  const int fd = listen_on_loopback(4, /*reuse_port=*/true, &port);
  ASSERT_GE(fd, 0);
  std::string log;
  // `timeout`: a server that shares the port runs on instead of exiting
  const int rc = testing::run_program({"/usr/bin/timeout", "30", WMSERVE_BIN, "--model=" + tiny_model(), "--host=127.0.0.1",
                                       "--port=" + std::to_string(port), "--metrics_port=-1"},
                                      &log);
  close(fd);
  EXPECT_EQ(rc, 1) << log;
  EXPECT_TRUE(absl::StrContains(log, "cannot listen")) << log;
}

// the environment a process started with (after its last exec)
std::vector<std::string> environment_of(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/environ", std::ios::binary);
  std::vector<std::string> vars;
  std::string v;
  while (std::getline(f, v, '\0')) vars.push_back(v);
  return vars;
}

bool has(const std::vector<std::string>& vars, const std::string& var) {
  return std::find(vars.begin(), vars.end(), var) != vars.end();
}

TEST(ServerIntegration, OpenMpWaitsPassivelyUnlessTheEnvironmentChooses) {
  auto saved = [](const char* name) {
    const char* v = std::getenv(name);
    return v != nullptr ? std::optional<std::string>(v) : std::nullopt;
  };
  const std::optional<std::string> policy = saved("OMP_WAIT_POLICY"), spin = saved("GOMP_SPINCOUNT");
  unsetenv("OMP_WAIT_POLICY");
  unsetenv("GOMP_SPINCOUNT");
  {  // not chosen: the server restarts itself with the passive policy and a brief spin (a plain setenv
     // would not reach the OpenMP runtime, nor /proc/PID/environ)
    auto server = ServerProcess::start(tiny_model());
    ASSERT_NE(server, nullptr);
    const auto vars = environment_of(server->pid());
    EXPECT_TRUE(has(vars, "OMP_WAIT_POLICY=passive"));
    EXPECT_TRUE(has(vars, "GOMP_SPINCOUNT=10000"));
    const PlayResult r = client::play(channel(*server), per_action(3, script_actions()));
    EXPECT_TRUE(r.status.ok()) << r.status.error_message();
  }
  setenv("GOMP_SPINCOUNT", "0", 1);
  {  // a spin count chosen without a policy: the policy is added, the spin count kept
    auto server = ServerProcess::start(tiny_model());
    ASSERT_NE(server, nullptr);
    const auto vars = environment_of(server->pid());
    EXPECT_TRUE(has(vars, "OMP_WAIT_POLICY=passive"));
    EXPECT_TRUE(has(vars, "GOMP_SPINCOUNT=0"));
    EXPECT_FALSE(has(vars, "GOMP_SPINCOUNT=10000"));
  }
  unsetenv("GOMP_SPINCOUNT");
  setenv("OMP_WAIT_POLICY", "active", 1);
  {  // a policy chosen: kept, and nothing added
    auto server = ServerProcess::start(tiny_model());
    ASSERT_NE(server, nullptr);
    const auto vars = environment_of(server->pid());
    EXPECT_TRUE(has(vars, "OMP_WAIT_POLICY=active"));
    EXPECT_FALSE(has(vars, "OMP_WAIT_POLICY=passive"));
    EXPECT_FALSE(std::any_of(vars.begin(), vars.end(),
                             [](const std::string& v) { return v.rfind("GOMP_SPINCOUNT=", 0) == 0; }));
  }
  auto restore = [](const char* name, const std::optional<std::string>& v) {
    if (v) {
      setenv(name, v->c_str(), 1);
    } else {
      unsetenv(name);
    }
  };
  restore("OMP_WAIT_POLICY", policy);
  restore("GOMP_SPINCOUNT", spin);
}

TEST(ServerIntegration, SigtermDrainsRefusesNewSessionsAndExitsZero) {
  auto server = ServerProcess::start(tiny_model(), {"--shutdown_grace_s=1.5"});
  ASSERT_NE(server, nullptr);
  auto ch = channel(*server);
  std::atomic<int> frames{0};
  auto player = std::async(std::launch::async, [&] {
    PlayConfig pc = per_action(1, std::vector<Action>(400, Action{1, {0, 0}, 0}));
    pc.send_fps = 50;  // 8 s of play: longer than the grace period
    pc.on_frame = [&](const v1::Frame&) { ++frames; };
    return client::play(client::make_channel(server->target(), {.own_connection = true}), pc);
  });
  while (frames < 5) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  {  // and a session whose stream broke: parked (--park_ttl_s 30 by default)
    client::PlayStream broken(ch, std::chrono::system_clock::now() + std::chrono::seconds(30));
    ASSERT_TRUE(broken.start(v1::Start()).ok());
    broken.cancel();
    broken.finish();
  }
  ASSERT_EQ(wait_for_metric(*server, "wm_sessions_parked", 1), 1);
  const auto t0 = std::chrono::steady_clock::now();
  server->signal(SIGTERM);
  // draining: not serving, new sessions refused with UNAVAILABLE
  bool not_serving = false;
  for (int i = 0; i < 50 && !not_serving; ++i) {
    const auto h = client::health_check(ch, "");
    not_serving = h.status.ok() && h.serving_status == 2;
    if (!not_serving) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(not_serving);
  client::PlayStream late(ch);
  const grpc::Status refused = late.start(v1::Start());
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE) << refused.error_message();
  // the open session is told, plays on during the grace period, then ends
  const PlayResult r = player.get();
  const double lasted = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::UNAVAILABLE) << r.status.error_message();
  EXPECT_GT(lasted, 1.2);
  bool told = false;
  for (const auto& e : r.events) told |= e.code() == "SERVER_DRAINING";
  EXPECT_TRUE(told);
  EXPECT_GT(frames.load(), 40);  // it kept playing while draining
  EXPECT_EQ(server->wait_exit(5), std::optional<int>(0)) << server->log();
  const double exited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(exited, 5.0);
  // the log counts the playing session and the parked one apart
  EXPECT_TRUE(absl::StrContains(server->log(),
                                "draining, 1 session(s) get 1.5 s to finish, 1 parked one(s) end now"))
      << server->log();
}

}  // namespace
}  // namespace wm

namespace wm {
namespace {

// --audit_fraction 1: every session keeps a full-precision shadow; its drift
// reaches /metrics as wm_token_selection_drift_ratio{format}, a rate in [0, 1],
// and (--audit_blocks 1: every block made again against the shadow) the
// frames' PSNR as wm_shadow_frame_psnr_db{format}
TEST(ServerIntegration, AuditedSessionsExportTokenSelectionDrift) {
  const std::string session_log = testing::fresh_dir("audit_log") + "/sessions.jsonl";
  auto server =
      ServerProcess::start(tiny_model(), {"--audit_fraction=1", "--audit_blocks=1", "--session_log=" + session_log});
  ASSERT_NE(server, nullptr);
  PlayConfig pc = per_action(3, script_actions());
  pc.start.set_cache_format("quantwm2");
  const PlayResult r = client::play(channel(*server), pc);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  ASSERT_EQ(r.frames.size(), script_actions().size());
  // the shadow is part of the session's reservation: the format's bytes plus an fp32 cache's
  v1::ListModelsResponse models;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(v1::WorldModel::NewStub(channel(*server))->ListModels(&ctx, {}, &models).ok());
  }
  std::map<std::string, int64_t> session_bytes;
  for (const auto& f : models.models(0).cache_format_info()) session_bytes[f.name()] = f.session_bytes();
  EXPECT_EQ(models.models(0).audit_bytes(), session_bytes.at("fp32"));
  EXPECT_EQ(r.started.kv_reserved_bytes(), session_bytes.at("quantwm2") + session_bytes.at("fp32"));
  const std::string key = "wm_token_selection_drift_ratio{format=\"quantwm2\"}";
  const std::string queries = "wm_token_selection_drift_queries{format=\"quantwm2\"}";
  std::map<std::string, double> m;
  // the gauges are refreshed about once a second by the engine thread
  const std::string shadow_frames = "wm_shadow_frames{format=\"quantwm2\"}";
  const auto played = static_cast<double>(r.frames.size());
  for (int i = 0; i < 50 && (!m.count(key) || m[queries] <= 0 || m[shadow_frames] != played); ++i) {
    m = scrape(*server);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(m.count(key)) << "no drift gauge for quantwm2";
  EXPECT_GT(m[queries], 0);
  EXPECT_GE(m[key], 0.0);
  EXPECT_LE(m[key], 1.0);
  const std::string psnr = "wm_shadow_frame_psnr_db{format=\"quantwm2\"}";
  const std::string psnr_min = "wm_shadow_frame_psnr_min_db{format=\"quantwm2\"}";
  ASSERT_TRUE(m.count(psnr) && m.count(psnr_min)) << "no shadow PSNR gauges";
  EXPECT_EQ(m[shadow_frames], played);  // every block, all its frames
  EXPECT_GT(m[psnr], 0.0);
  EXPECT_LE(m[psnr], 60.0);
  EXPECT_LE(m[psnr_min], m[psnr]);
  // fp16 sessions are audited too, and their drift against fp32 is tiny
  PlayConfig pf = per_action(4, script_actions());
  pf.start.set_cache_format("fp16");
  const PlayResult rf = client::play(channel(*server), pf);
  ASSERT_TRUE(rf.status.ok());
  const std::string fkey = "wm_token_selection_drift_ratio{format=\"fp16\"}";
  const std::string fframes = "wm_shadow_frames{format=\"fp16\"}";
  for (int i = 0; i < 50 && m[fframes] != static_cast<double>(rf.frames.size()); ++i) {
    m = scrape(*server);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(m.count(fkey));
  EXPECT_LE(m[fkey], m[key]);
  const std::string fpsnr = "wm_shadow_frame_psnr_db{format=\"fp16\"}";
  ASSERT_TRUE(m.count(fpsnr));
  EXPECT_GE(m[fpsnr], m[psnr]);  // fp16 frames are at least as close to the shadow's
  // each session's own numbers close its line in the session log; one
  // session per format here, so they are the gauges'
  std::map<std::string, nlohmann::json> end_of;
  for (const nlohmann::json& j : session_log_lines(session_log, 4))
    if (j["event"] == "end") end_of[j["session"].get<std::string>()] = j;
  ASSERT_EQ(end_of.size(), 2u) << *read_file(session_log);
  const nlohmann::json &qe = end_of[r.started.session_id()], &fe = end_of[rf.started.session_id()];
  EXPECT_NEAR(qe["drift"].get<double>(), m[key], 1e-9) << qe;
  EXPECT_EQ(qe["drift_queries"].get<double>(), m[queries]) << qe;
  EXPECT_NEAR(qe["shadow_frame_psnr_db"].get<double>(), m[psnr], 1e-9) << qe;
  EXPECT_NEAR(qe["shadow_frame_psnr_min_db"].get<double>(), m[psnr_min], 1e-9) << qe;
  EXPECT_EQ(qe["shadow_frames"], r.frames.size()) << qe;
  EXPECT_NEAR(fe["shadow_frame_psnr_db"].get<double>(), m[fpsnr], 1e-9) << fe;
  EXPECT_EQ(fe["shadow_frames"], rf.frames.size()) << fe;
}

// --device cuda end to end: the real server on the CUDA plugin, here the
// plugin built for the kernel emulator (tests/engine/simt/, no GPU needed);
// the same session as the CPU's offline rollout, frame for frame within
// bf16 rounding, the device and its memory in the metrics, and admission in
// the plugin's page-rounded device bytes
TEST(ServerIntegration, DeviceCudaPlaysLikeTheCpuAndReportsDeviceMemory) {
#ifndef WM_CUDA_SIMT_PLUGIN
  GTEST_SKIP() << "the emulated CUDA plugin is not built (no CUDA headers)";
#else
  auto server = ServerProcess::start(tiny_model(), {"--device=cuda", "--cuda_plugin=" WM_CUDA_SIMT_PLUGIN,
                                                    "--kv_budget_bytes=67108864"});
  ASSERT_NE(server, nullptr);
  EXPECT_TRUE(absl::StrContains(server->log(), "device: simt emulator (sm_90)")) << server->log();
  const auto expected = wmgen_frames(tiny_model(), 5);
  PlayConfig pc = per_action(5, script_actions());
  pc.start.set_jpeg_quality(90);
  const PlayResult r = client::play(channel(*server), pc);
  ASSERT_TRUE(r.status.ok()) << r.status.error_message() << server->log();
  ASSERT_EQ(r.frames.size(), expected.size());
  // PSNR of the decoded frames: bf16 weights against fp32 gives ~40 dB here;
  // the bar is the parity suite's 35 dB, and another seed's rollout, the
  // stand-in for a broken kernel, stays far below it
  const auto other = wmgen_frames(tiny_model(), 6);
  ASSERT_EQ(other.size(), expected.size());
  double worst = 1e9, best_other = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(r.frames[i].index, static_cast<int64_t>(i));
    const double p = jpeg_psnr(r.frames[i].jpeg, expected[i]);
    worst = std::min(worst, p);
    best_other = std::max(best_other, jpeg_psnr(other[i], expected[i]));
    EXPECT_GE(p, 35.0) << "frame " << i;
  }
  EXPECT_LT(best_other, 30.0) << "the bar must tell another rollout apart";
  std::printf("--device cuda (emulated) vs the CPU rollout: min PSNR %.1f dB (another seed: at most %.1f dB)\n",
              worst, best_other);
  // the plugin's pages: 64 KiB each, the worst case reserved at Start
  EXPECT_GT(r.started.kv_reserved_bytes(), 0);
  EXPECT_EQ(r.started.kv_reserved_bytes() % 65536, 0);
  const auto m = scrape(*server);
  EXPECT_EQ(m.at("wm_model_info{default_cache_format=\"fp16\",device=\"cuda\",model=\"tiny-test\"}"), 1);
  EXPECT_EQ(m.at("wm_gpu_memory_bytes{kind=\"total\"}"), 16.0 * (1 << 30));
  EXPECT_GT(m.at("wm_gpu_memory_bytes{kind=\"used\"}"), 64.0 * (1 << 20)) << "the KV pool alone is 64 MiB";
  EXPECT_EQ(m.at("wm_kv_cache_bytes_capacity"), 67108864);
  server->signal(SIGTERM);
  EXPECT_EQ(server->wait_exit(10), std::optional<int>(0)) << server->log();
#endif
}

// --device cuda serves kivi2 where a frame is whole chunks (here 64 tokens):
// the format listed with its pages, an audited session's drift exported, its
// shadow in its reservation; and --kv_options that take kivi2 away from the
// device stop the server with the plugin's reason
// the tiny model with 4x4 patches: 64 tokens a frame
const std::string& tiny_patch4_model() {
  static const std::string model = testing::make_tiny_model("tiny_patch4", 1, 1, /*patch=*/4);
  return model;
}

TEST(ServerIntegration, DeviceCudaServesQuantizedCachesAndAuditsThem) {
#ifndef WM_CUDA_SIMT_PLUGIN
  GTEST_SKIP() << "the emulated CUDA plugin is not built (no CUDA headers)";
#else
  const std::string model = tiny_patch4_model();
  const std::vector<std::string> device = {"--device=cuda", "--cuda_plugin=" WM_CUDA_SIMT_PLUGIN,
                                           "--kv_budget_bytes=67108864"};
  std::vector<std::string> audited = device;
  audited.push_back("--audit_blocks=1");
  auto server = ServerProcess::start(model, audited);
  ASSERT_NE(server, nullptr);
  v1::ListModelsResponse models;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(v1::WorldModel::NewStub(channel(*server))->ListModels(&ctx, {}, &models).ok());
  }
  std::map<std::string, v1::CacheFormatInfo> info;
  for (const auto& f : models.models(0).cache_format_info()) info[f.name()] = f;
  for (const char* f : {"kivi2", "qvg2", "quantwm2"}) ASSERT_TRUE(info.count(f)) << f << models.DebugString();
  EXPECT_FALSE(info.count("fp32")) << "no fp32 kernels on the device";
  // 2 layers x 2 heads, one 64 KiB page each in kivi2 (the sink frame's fp16 unit and the window's
  // chunks); a window this short fits one page in fp16 too (the default model's kivi2 session takes a
  // fifth of fp16's pages: CudaKivi.DefaultModelSessionFillsOnePagePerHead), and in the span formats,
  // where QuantWM-2 takes one more for its running query statistics (docs/CUDA.md, "Span pages")
  EXPECT_EQ(info["kivi2"].session_bytes(), 4 * 65536);
  EXPECT_EQ(info["fp16"].session_bytes(), 4 * 65536);
  EXPECT_EQ(info["quantwm2"].session_bytes(), 5 * 65536);
  for (const char* format : {"kivi2", "quantwm2"}) {
    SCOPED_TRACE(format);
    PlayConfig pc = per_action(7, script_actions());
    pc.start.set_cache_format(format);
    pc.start.set_audit(true);
    const PlayResult r = client::play(channel(*server), pc);
    ASSERT_TRUE(r.status.ok()) << r.status.error_message() << server->log();
    ASSERT_EQ(r.frames.size(), script_actions().size());
    EXPECT_EQ(r.started.kv_reserved_bytes(), info[format].session_bytes() + models.models(0).audit_bytes());
    EXPECT_EQ(models.models(0).audit_bytes(), info["fp16"].session_bytes()) << "the shadow: fp16 device pages";
    const std::string key = absl::StrCat("wm_token_selection_drift_ratio{format=\"", format, "\"}");
    const std::string queries = absl::StrCat("wm_token_selection_drift_queries{format=\"", format, "\"}");
    std::map<std::string, double> m;
    // every block made again against the device shadow (--audit_blocks 1)
    const std::string shadow_frames = absl::StrCat("wm_shadow_frames{format=\"", format, "\"}");
    const std::string psnr = absl::StrCat("wm_shadow_frame_psnr_db{format=\"", format, "\"}");
    const auto played = static_cast<double>(r.frames.size());
    for (int i = 0; i < 50 && (!m.count(key) || m[queries] <= 0 || m[shadow_frames] != played); ++i) {
      m = scrape(*server);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ASSERT_TRUE(m.count(key)) << "no drift gauge on the device";
    EXPECT_GT(m[queries], 0);
    EXPECT_GE(m[key], 0.0);
    EXPECT_LE(m[key], 1.0);
    EXPECT_EQ(m[shadow_frames], played);
    ASSERT_TRUE(m.count(psnr)) << "no shadow PSNR on the device";
    EXPECT_GT(m[psnr], 0.0);
    EXPECT_LT(m[psnr], 60.0) << "2-bit frames differ from the fp16 shadow's";
  }
  server->signal(SIGTERM);
  EXPECT_EQ(server->wait_exit(10), std::optional<int>(0)) << server->log();

  // a residual longer than a frame leaves tokens in KIVI's fp16 buffer: not on the device
  std::vector<std::string> argv = {WMSERVE_BIN, "--model=" + model, "--host=127.0.0.1", "--port=0",
                                   "--metrics_port=-1", "--kv_options=kivi_residual=128"};
  argv.insert(argv.end(), device.begin(), device.end());
  std::string log;
  EXPECT_EQ(testing::run_program(argv, &log), 1) << log;
  EXPECT_TRUE(absl::StrContains(log, "kivi2 on the GPU needs the tokens of a frame (64) to be a multiple of the "
                                     "residual (128)"))
      << log;
  // quantized sink frames: the span formats on the device keep them fp16
  argv[5] = "--kv_options=quantize_sinks=true";
  log.clear();
  EXPECT_EQ(testing::run_program(argv, &log), 1) << log;
  EXPECT_TRUE(absl::StrContains(log, "on the GPU keeps the sink frames fp16 (quantize_sinks=false)")) << log;
#endif
}

// --device_graphs (the default): each step's later denoising passes run from
// a recorded graph; the player gets the same JPEG bytes as without
TEST(ServerIntegration, DeviceGraphsChangeNoFrame) {
#ifndef WM_CUDA_SIMT_PLUGIN
  GTEST_SKIP() << "the emulated CUDA plugin is not built (no CUDA headers)";
#else
  std::vector<std::vector<std::string>> jpegs;
  for (bool graphs : {false, true}) {
    std::vector<std::string> args = {"--device=cuda", "--cuda_plugin=" WM_CUDA_SIMT_PLUGIN,
                                     "--kv_budget_bytes=67108864"};
    if (!graphs) args.push_back("--device_graphs=false");  // graphs are the default
    // 64 tokens a frame: the device holds the quantized formats (whole key tiles of sinks)
    auto server = ServerProcess::start(tiny_patch4_model(), args);
    ASSERT_NE(server, nullptr);
    // fp16, and QuantWM-2, whose recorded passes sum its query statistics on the device
    for (const char* format : {"fp16", "quantwm2"}) {
      PlayConfig pc = per_action(6, script_actions());
      pc.start.set_cache_format(format);
      const PlayResult r = client::play(channel(*server), pc);
      ASSERT_TRUE(r.status.ok()) << format << ": " << r.status.error_message() << server->log();
      ASSERT_EQ(r.frames.size(), script_actions().size());
      jpegs.emplace_back();
      for (const auto& f : r.frames) jpegs.back().push_back(f.jpeg);
    }
    if (graphs) {
      // the passes ran from graphs, and the metrics say so (published about once a second)
      const std::string launched = "wm_device_graph_events_total{event=\"launched\"}";
      std::map<std::string, double> m;
      for (int i = 0; i < 40 && !m.count(launched); ++i) {
        m = scrape(*server);
        if (!m.count(launched)) std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      ASSERT_TRUE(m.count(launched)) << "no graph ran";
      EXPECT_GT(m[launched], 0);
      EXPECT_GT(m["wm_device_graph_events_total{event=\"recorded\"}"], 0);
      // QuantWM-2's first appends were coded on the host as well and found the same: the device codes on
      const std::string same = "wm_device_span_coder_checks_total{result=\"same\"}";
      for (int i = 0; i < 40 && !(m.count(same) && m[same] > 0); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        m = scrape(*server);
      }
      EXPECT_GT(m[same], 0);
      EXPECT_EQ(m["wm_device_span_coder_checks_total{result=\"different\"}"], 0);
      EXPECT_EQ(m["wm_device_span_coder{coder=\"device\"}"], 1);
      EXPECT_EQ(m["wm_device_span_coder{coder=\"host\"}"], 0);
    }
    server->signal(SIGTERM);
    EXPECT_EQ(server->wait_exit(10), std::optional<int>(0)) << server->log();
  }
  for (size_t f = 0; f < 2; ++f)
    for (size_t i = 0; i < jpegs[f].size(); ++i) EXPECT_EQ(jpegs[f][i], jpegs[2 + f][i]) << "format " << f << " frame " << i;
#endif
}
}  // namespace
}  // namespace wm
