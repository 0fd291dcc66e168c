#include "engine/engine.h"

#include <gtest/gtest.h>

#include <sys/resource.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "engine/noise.h"
#include "quant/kv_cache.h"

namespace wm {
namespace {

std::unique_ptr<Engine> make_engine(int64_t budget = int64_t{1} << 30, const std::string& config = "tiny-test",
                                    bool defer_writes = false, bool batch_invariant = false) {
  EngineOptions o;
  o.defer_writes = defer_writes;
  o.batch_invariant = batch_invariant;
  o.random_weights = true;
  o.random_seed = 5;
  o.config_path = std::string(WM_SOURCE_DIR) + "/configs/" + config + ".json";
  o.kv_budget_bytes = budget;
  o.threads = 1;
  auto e = Engine::create(o);
  EXPECT_TRUE(e.ok()) << e.status();
  return std::move(*e);
}

Action act(uint32_t keys, float yaw, float pitch = 0) {
  Action a;
  a.keys = keys;
  a.mouse[0] = yaw;
  a.mouse[1] = pitch;
  return a;
}

std::vector<Action> script(int n) {
  std::vector<Action> s;
  for (int i = 0; i < n; ++i) s.push_back(act(1u << (i % 4), static_cast<float>((i * 7) % 30 - 15), 1.0f));
  return s;
}

std::vector<Frame> rollout(Engine& e, SessionId id, const std::vector<Action>& actions) {
  std::vector<Frame> out;
  for (const Action& a : actions) {
    StepRequest r{id, {a}, {}};
    auto res = e.step(std::span<const StepRequest>(&r, 1), nullptr, /*keep_values=*/true);
    EXPECT_TRUE(res.ok()) << res.status();
    out.push_back((*res)[0].frames[0]);
  }
  return out;
}

TEST(Engine, SameSeedAndActionsGiveSameFrames) {
  auto e1 = make_engine(), e2 = make_engine();
  auto a = *e1->open_session({7, "fp16", {}});
  auto b = *e2->open_session({7, "fp16", {}});
  auto c = *e2->open_session({8, "fp16", {}});
  const auto s = script(6);
  auto fa = rollout(*e1, a, s), fb = rollout(*e2, b, s), fc = rollout(*e2, c, s);
  for (size_t i = 0; i < fa.size(); ++i) {
    EXPECT_EQ(fa[i].rgb, fb[i].rgb) << "frame " << i;
    EXPECT_EQ(fa[i].index, static_cast<int64_t>(i));
  }
  EXPECT_NE(fa[0].rgb, fc[0].rgb);
}

TEST(Engine, BatchedStepMatchesSteppingAlone) {
  auto alone = make_engine(), batched = make_engine();
  const auto s = script(12);
  std::vector<SessionId> ia, ib;
  // three sessions at different cache lengths: 0, 3 and 6 frames (window 4 + sink 1 evicts)
  for (int k = 0; k < 3; ++k) {
    ia.push_back(*alone->open_session({static_cast<uint64_t>(100 + k), "fp32", {}}));
    ib.push_back(*batched->open_session({static_cast<uint64_t>(100 + k), "fp32", {}}));
    rollout(*alone, ia.back(), std::vector<Action>(s.begin(), s.begin() + 3 * k));
    rollout(*batched, ib.back(), std::vector<Action>(s.begin(), s.begin() + 3 * k));
  }
  for (int step = 0; step < 3; ++step) {
    std::vector<StepRequest> reqs;
    std::vector<Frame> ref;
    for (int k = 0; k < 3; ++k) {
      const Action a = s[static_cast<size_t>(step + k)];
      reqs.push_back({ib[static_cast<size_t>(k)], {a}, {}});
      ref.push_back(rollout(*alone, ia[static_cast<size_t>(k)], {a})[0]);
    }
    auto res = batched->step(reqs, nullptr, /*keep_values=*/true);
    ASSERT_TRUE(res.ok()) << res.status();
    for (int k = 0; k < 3; ++k) {
      const Frame& got = (*res)[static_cast<size_t>(k)].frames[0];
      float max_diff = 0;
      for (size_t i = 0; i < got.values.size(); ++i)
        max_diff = std::max(max_diff, std::fabs(got.values[i] - ref[static_cast<size_t>(k)].values[i]));
      // the documented tolerance: 1e-4 on values in [-1, 1]
      EXPECT_LT(max_diff, 1e-4f) << "session " << k << " step " << step;
      EXPECT_EQ(got.index, ref[static_cast<size_t>(k)].index);
    }
  }
}

// batch-invariant: a session's frames in a batch are bit for bit those it
// gets stepped alone (in a batch of sessions at different cache lengths,
// joining at different steps, with the default model's shapes); `all`: the
// engine's option, else sessions 0 and 2 ask and session 1 does not
void expect_batch_invariant_frames(bool all) {
  const std::string config = "default";
  auto alone = make_engine(int64_t{1} << 30, config), batched = make_engine(int64_t{1} << 30, config, false, all);
  const auto s = script(8);
  std::vector<SessionId> ia, ib;
  for (int k = 0; k < 3; ++k) {
    SessionOptions so{static_cast<uint64_t>(200 + k), "fp16", {}};
    ia.push_back(*alone->open_session(so));
    so.batch_invariant = k != 1;
    ib.push_back(*batched->open_session(so));
  }
  for (int step = 0; step < 6; ++step) {
    std::vector<StepRequest> reqs;
    std::vector<Frame> ref;
    for (int k = 0; k < 3; ++k) {
      if (step < 2 * k) continue;  // session k joins at step 2k
      const Action a = s[static_cast<size_t>(step + k)];
      reqs.push_back({ib[static_cast<size_t>(k)], {a}, {}});
      ref.push_back(rollout(*alone, ia[static_cast<size_t>(k)], {a})[0]);
    }
    auto res = batched->step(reqs, nullptr, /*keep_values=*/true);
    ASSERT_TRUE(res.ok()) << res.status();
    for (size_t r = 0; r < ref.size(); ++r) {
      if (!all && r == 1) continue;  // not asked: equal up to rounding (BatchedStepMatchesSteppingAlone)
      const Frame& got = (*res)[r].frames[0];
      ASSERT_EQ(got.values, ref[r].values) << "session " << r << " step " << step;
      ASSERT_EQ(got.rgb, ref[r].rgb);
    }
  }
}

TEST(Engine, BatchInvariantStepsGiveTheFramesOfSteppingAlone) { expect_batch_invariant_frames(/*all=*/true); }

TEST(Engine, BatchInvariantSessionsGiveTheFramesOfSteppingAlone) { expect_batch_invariant_frames(/*all=*/false); }

TEST(Engine, SamplerIsEulerOverTheSigmas) {
  auto e = make_engine();
  const ModelConfig& c = e->config();
  auto id = *e->open_session({11, "fp32", {}});
  std::vector<std::vector<float>> velocities;
  TraceFn trace = [&](absl::string_view name, const float* d, int64_t n) {
    if (name == "velocity") velocities.emplace_back(d, d + n);
  };
  StepRequest r{id, {act(1, 3)}, {}};
  auto res = e->step(std::span<const StepRequest>(&r, 1), nullptr, true, &trace);
  ASSERT_TRUE(res.ok());
  ASSERT_EQ(velocities.size(), c.sigmas.size());
  // replay Euler in token space from the documented noise
  const int fv = c.frame_values();
  std::vector<float> noise(static_cast<size_t>(fv)), tok(static_cast<size_t>(fv)), out(static_cast<size_t>(fv));
  noise_fill_frame(11, 0, noise.data(), fv);
  auto be = make_cpu_backend(1);
  const FrameShape s{c.height, c.width, c.channels, c.patch};
  be->patchify(noise.data(), 1, s, tok.data());
  for (size_t i = 0; i < c.sigmas.size(); ++i) {
    const float next = i + 1 < c.sigmas.size() ? c.sigmas[i + 1] : 0.0f;
    for (int j = 0; j < fv; ++j) tok[static_cast<size_t>(j)] += (next - c.sigmas[i]) * velocities[i][static_cast<size_t>(j)];
  }
  for (float& x : tok) x = std::fmin(1.0f, std::fmax(-1.0f, x));
  be->unpatchify(tok.data(), 1, s, out.data());
  for (int j = 0; j < fv; ++j) ASSERT_FLOAT_EQ((*res)[0].frames[0].values[static_cast<size_t>(j)], out[static_cast<size_t>(j)]);
}

TEST(Engine, CacheBytesFollowTheWindowAndSinks) {
  auto e = make_engine();
  const ModelConfig& c = e->config();
  auto id = *e->open_session({1, "fp16", {}});
  const int64_t per_frame = int64_t{2} * c.layers * c.heads * c.head_dim * c.tokens_per_frame() * 2;
  for (int n = 1; n <= 8; ++n) {
    rollout(*e, id, {act(0, 0)});
    auto info = e->session_info(id);
    ASSERT_TRUE(info.ok());
    const int held = std::min(n, c.window_frames + c.sink_frames);
    EXPECT_EQ(info->kv.total(), held * per_frame) << "after " << n << " frames";
    EXPECT_EQ(info->frames_generated, n);
    std::vector<int64_t> expect;
    for (int f = 0; f < n; ++f)
      if (f < c.sink_frames || f >= n - c.window_frames) expect.push_back(f);
    EXPECT_EQ(e->session_cache(id)->frames(0), expect);
  }
  EXPECT_EQ(e->session_info(id)->kv_reserved, (c.window_frames + c.sink_frames) * per_frame);
  EXPECT_EQ(e->kv_used_bytes(), e->session_info(id)->kv.total());
}

TEST(Engine, AdmissionRespectsTheBudget) {
  auto probe = make_engine();
  const int64_t one = probe->session_reservation("fp16");
  auto e = make_engine(one * 2 + one / 2);
  auto a = e->open_session({1, "fp16", {}});
  auto b = e->open_session({2, "fp16", {}});
  ASSERT_TRUE(a.ok() && b.ok());
  auto c = e->open_session({3, "fp16", {}});
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(e->kv_reserved_bytes(), 2 * one);
  ASSERT_TRUE(e->close_session(*a).ok());
  EXPECT_TRUE(e->open_session({3, "fp16", {}}).ok());
  EXPECT_EQ(e->close_session(999).code(), absl::StatusCode::kNotFound);
}

TEST(Engine, AnAuditedSessionReservesItsShadow) {
  auto probe = make_engine();
  ASSERT_TRUE(probe->audit_supported());  // the CPU backend
  const int64_t q = probe->session_reservation("quantwm2"), fp32 = probe->session_reservation("fp32");
  EXPECT_EQ(probe->session_reservation("quantwm2", true), q + fp32);
  // room for one plain session and one audited one, not two audited
  auto e = make_engine(q + (q + fp32) + fp32 / 2);
  SessionOptions audited{1, "quantwm2", {}};
  audited.audit = true;
  auto a = e->open_session(audited);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(e->kv_reserved_bytes(), q + fp32);
  auto b = e->open_session(audited);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(e->open_session({2, "quantwm2", {}}).ok());
  ASSERT_TRUE(e->close_session(*a).ok());
  EXPECT_EQ(e->kv_reserved_bytes(), q);
}

// a session's worst case is replayed once per format, not at every open: on
// a long window with blocks of 7 frames the replay takes a good part of a
// second, and the server opens sessions on its engine thread, where every
// other session's frames wait for it
TEST(Engine, OpeningSessionsDoesNotReplayTheirReservation) {
  const std::string dir = ::testing::TempDir() + "/wm_long_window";
  std::filesystem::create_directories(dir);
  std::ifstream in(std::string(WM_SOURCE_DIR) + "/configs/tiny-test.json");
  std::string config((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
           {"\"frames_per_block\": 1", "\"frames_per_block\": 7"},
           {"\"window_frames\": 4, \"sink_frames\": 1", "\"window_frames\": 400, \"sink_frames\": 200"}}) {
    const size_t at = config.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    config.replace(at, from.size(), to);
  }
  std::ofstream(dir + "/config.json") << config;
  EngineOptions o;
  o.random_weights = true;
  o.config_path = dir + "/config.json";
  o.threads = 1;
  auto e = Engine::create(o);
  ASSERT_TRUE(e.ok()) << e.status();
  const int64_t q = (*e)->session_reservation("quantwm2");
  ASSERT_GT(q, 0);
  const int64_t replays = kv_format_max_bytes_replays();
  for (uint64_t seed = 0; seed < 4; ++seed) {
    auto id = (*e)->open_session({seed, "quantwm2", {}});
    ASSERT_TRUE(id.ok()) << id.status();
    EXPECT_EQ((*e)->session_info(*id)->kv_reserved, q);
    ASSERT_TRUE((*e)->close_session(*id).ok());
  }
  EXPECT_EQ(kv_format_max_bytes_replays(), replays);
  std::filesystem::remove_all(dir);
}

TEST(Engine, ReservingTheLargestBatchUpFrontChangesNoFrame) {
  auto plain = make_engine(), reserved = make_engine();
  EXPECT_EQ(reserved->reserve_batch(0).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(reserved->reserve_batch(8).ok());
  ASSERT_TRUE(reserved->reserve_batch(2).ok());  // smaller: nothing to do
  auto a = *plain->open_session({31, "fp16", {}});
  auto b = *reserved->open_session({31, "fp16", {}});
  const auto s = script(5);
  const auto fa = rollout(*plain, a, s), fb = rollout(*reserved, b, s);
  for (size_t i = 0; i < fa.size(); ++i) EXPECT_EQ(fa[i].values, fb[i].values) << "frame " << i;
}

TEST(Engine, BadRequestsFailCleanlyAndHarmNothing) {
  auto e = make_engine();
  auto id = *e->open_session({1, "fp16", {}});
  EXPECT_EQ(e->open_session({1, "int7", {}}).status().code(), absl::StatusCode::kNotFound);
  Rgb8Image small{4, 4, std::vector<uint8_t>(48)};
  EXPECT_EQ(e->open_session({1, "fp16", {small}}).status().code(), absl::StatusCode::kInvalidArgument);
  std::vector<StepRequest> two_actions = {{id, {act(0, 0), act(0, 0)}, {}}};
  EXPECT_EQ(e->step(two_actions).status().code(), absl::StatusCode::kInvalidArgument);
  std::vector<StepRequest> bad_action = {{id, {act(1u << 9, 0)}, {}}};
  EXPECT_EQ(e->step(bad_action).status().code(), absl::StatusCode::kInvalidArgument);
  std::vector<StepRequest> unknown = {{id + 100, {act(0, 0)}, {}}};
  EXPECT_EQ(e->step(unknown).status().code(), absl::StatusCode::kNotFound);
  std::vector<StepRequest> dup = {{id, {act(0, 0)}, {}}, {id, {act(0, 0)}, {}}};
  EXPECT_EQ(e->step(dup).status().code(), absl::StatusCode::kInvalidArgument);
  // the session is untouched and still works
  EXPECT_EQ(e->session_info(id)->frames_generated, 0);
  EXPECT_EQ(rollout(*e, id, {act(0, 0)}).size(), 1u);
}

TEST(Engine, PromptAndTeacherForcingShapeTheCache) {
  auto e = make_engine();
  const ModelConfig& c = e->config();
  Rgb8Image img{c.width, c.height, std::vector<uint8_t>(static_cast<size_t>(c.width) * c.height * 3)};
  for (size_t i = 0; i < img.pixels.size(); ++i) img.pixels[i] = static_cast<uint8_t>((i * 37) % 256);
  auto plain = *e->open_session({3, "fp16", {}});
  auto prompted = *e->open_session({3, "fp16", {img}});
  EXPECT_EQ(e->session_info(prompted)->frames_generated, 1);
  EXPECT_EQ(e->session_cache(prompted)->frames(0), std::vector<int64_t>{0});
  const auto fp = rollout(*e, prompted, {act(1, 0)});
  EXPECT_EQ(fp[0].index, 1);
  // forcing a frame returns the sampled frame but caches the forced one
  auto a = *e->open_session({4, "fp16", {}});
  auto b = *e->open_session({4, "fp16", {}});
  std::vector<StepRequest> ra = {{a, {act(0, 0)}, {}}};
  std::vector<StepRequest> rb = {{b, {act(0, 0)}, {img}}};
  auto fa = e->step(ra);
  auto fb = e->step(rb);
  EXPECT_EQ((*fa)[0].frames[0].rgb, (*fb)[0].frames[0].rgb);
  EXPECT_NE(rollout(*e, a, {act(0, 0)})[0].rgb, rollout(*e, b, {act(0, 0)})[0].rgb);
  (void)plain;
}

// defer_writes: frames come back before their K/V are written; the write
// happens at flush_writes() or the next step, and nothing else changes
TEST(Engine, DeferredWritesGiveTheSameFramesAndCaches) {
  auto now = make_engine(), later = make_engine(int64_t{1} << 30, "tiny-test", /*defer_writes=*/true);
  const ModelConfig& c = now->config();
  Rgb8Image img{c.width, c.height, std::vector<uint8_t>(static_cast<size_t>(c.width) * c.height * 3)};
  for (size_t i = 0; i < img.pixels.size(); ++i) img.pixels[i] = static_cast<uint8_t>((i * 53) % 256);
  std::vector<SessionId> in, il;
  for (uint64_t seed : {21u, 22u}) {
    in.push_back(*now->open_session({seed, "kivi2", {img}}));
    il.push_back(*later->open_session({seed, "kivi2", {img}}));
  }
  const auto s = script(9);
  for (size_t step = 0; step < s.size(); ++step) {
    std::vector<StepRequest> rn, rl;
    for (size_t k = 0; k < in.size(); ++k) {
      // session 1 sits out every third step; session 0 is teacher-forced at step 4
      if (k == 1 && step % 3 == 2) continue;
      std::vector<Rgb8Image> force;
      if (k == 0 && step == 4) force.push_back(img);
      rn.push_back({in[k], {s[step]}, force});
      rl.push_back({il[k], {s[step]}, force});
    }
    auto fn = now->step(rn), fl = later->step(rl);
    ASSERT_TRUE(fn.ok() && fl.ok());
    ASSERT_EQ(fn->size(), fl->size());
    for (size_t r = 0; r < fn->size(); ++r) {
      EXPECT_EQ((*fn)[r].frames[0].rgb, (*fl)[r].frames[0].rgb) << "step " << step << " request " << r;
      EXPECT_EQ((*fn)[r].frames[0].index, (*fl)[r].frames[0].index);
      // the deferred engine counts the frame as generated, its cache does not hold it yet
      auto info_n = now->session_info(rn[r].session), info_l = later->session_info(rl[r].session);
      EXPECT_EQ(info_n->frames_generated, info_l->frames_generated);
      EXPECT_EQ(later->session_cache(rl[r].session)->frames(0).back(), info_l->frames_generated - 2);
    }
    EXPECT_FALSE(now->writes_pending());
    EXPECT_TRUE(later->writes_pending());
  }
  ASSERT_TRUE(later->flush_writes().ok());
  EXPECT_FALSE(later->writes_pending());
  EXPECT_EQ(now->kv_used_bytes(), later->kv_used_bytes());
  for (size_t k = 0; k < in.size(); ++k)
    for (int l = 0; l < c.layers; ++l) {
      std::vector<float> kn, vn, kl, vl;
      now->session_cache(in[k])->reconstruct(l, &kn, &vn);
      later->session_cache(il[k])->reconstruct(l, &kl, &vl);
      EXPECT_EQ(kn, kl) << "session " << k << " layer " << l;
      EXPECT_EQ(vn, vl) << "session " << k << " layer " << l;
    }
  // a session closed with its write pending just ends
  auto extra = *later->open_session({23, "fp16", {}});
  std::vector<StepRequest> r = {{extra, {s[0]}, {}}};
  ASSERT_TRUE(later->step(r).ok());
  EXPECT_TRUE(later->writes_pending());
  ASSERT_TRUE(later->close_session(extra).ok());
  EXPECT_FALSE(later->writes_pending());
}

}  // namespace
}  // namespace wm

namespace wm {
namespace {

// caps this process's address space 1 GiB above what it holds now (for a
// child process: memory limits make allocation failures testable anywhere)
bool cap_address_space_1gib_above_now() {
  std::ifstream status("/proc/self/status");
  std::string line;
  int64_t vm_kb = 0;
  while (std::getline(status, line))
    if (line.rfind("VmSize:", 0) == 0) vm_kb = std::atoll(line.c_str() + 7);
  const rlim_t cap = static_cast<rlim_t>(vm_kb + (1 << 20)) * 1024;
  rlimit lim;
  lim.rlim_cur = lim.rlim_max = cap;
  return vm_kb > 0 && setrlimit(RLIMIT_AS, &lim) == 0;
}

// activations the backend cannot allocate are RESOURCE_EXHAUSTED, not a null
// pointer written to later; the engine stays usable for batches that fit.
// Runs in a child process whose address space is capped 1 GiB above what it
// holds now, so the failure does not depend on the machine's memory.
// Returns the child's exit code: 0 when all of that holds.
int oversized_batch_in_capped_memory() {
  auto e = make_engine(int64_t{1} << 30, "default");
  if (!cap_address_space_1gib_above_now()) return 2;
  const absl::Status big = e->reserve_batch(4096);  // about 3 GB of activations
  if (big.code() != absl::StatusCode::kResourceExhausted) return 3;
  if (big.message().find("cannot allocate") == absl::string_view::npos) return 4;
  if (!e->reserve_batch(2).ok()) return 5;
  SessionOptions so;
  so.seed = 1;
  auto id = e->open_session(so);
  if (!id.ok()) return 6;
  std::vector<StepRequest> req(1);
  req[0].session = *id;
  req[0].actions.push_back(act(1, 0));
  if (!e->step(req).ok()) return 7;
  return 0;
}

// a config whose sizes do not match its weights file is refused before the
// config's sizes are allocated (dim 16384 would want ~26 GB): the child's
// address space is capped 1 GiB above what it holds, so an allocation
// before the checks would fail
int mismatched_config_in_capped_memory(const std::string& dir) {
  if (!cap_address_space_1gib_above_now()) return 2;
  EngineOptions o;
  o.model_dir = dir;
  o.threads = 1;
  auto e = Engine::create(o);
  if (e.ok()) return 3;
  // refused by the tensors' shapes, or first by the memory check, which
  // counts the cap (memory_limit)
  if (e.status().message().find("has shape") == absl::string_view::npos &&
      e.status().message().find("address-space limit") == absl::string_view::npos)
    return 4;
  return 0;
}

TEST(EngineMemory, WeightsAreCheckedAgainstTheConfigBeforeAllocating) {
  const std::string src = std::string(WM_SOURCE_DIR) + "/models/default";
  const std::string dir = ::testing::TempDir() + "/wm_big_config";
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(src + "/model.safetensors", dir + "/model.safetensors",
                             std::filesystem::copy_options::overwrite_existing);
  std::ifstream in(src + "/config.json");
  std::string config((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t at = config.find("\"dim\"");
  ASSERT_NE(at, std::string::npos);
  const size_t colon = config.find(':', at), end = config.find_first_of(",}", colon);
  config.replace(colon + 1, end - colon - 1, " 16384");
  std::ofstream(dir + "/config.json") << config;
  EXPECT_EXIT(std::exit(mismatched_config_in_capped_memory(dir)), ::testing::ExitedWithCode(0), "");
}

TEST(EngineMemory, ABatchThatCannotBeAllocatedIsAnError) {
  EXPECT_EXIT(std::exit(oversized_batch_in_capped_memory()), ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace wm
