// The benchmarks (wm_attention_bench, wm_mg2_bench, engine_bench) run as
// processes on bad flags: each must exit 2 with a line that names the flag
// and what it takes, before any work (no crash, no abort, no run that times
// the default in place of a mistyped flag); good flags still run on the CPU.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/spawn.h"

namespace wm {
namespace {

// scratch files (the runs' logs, a config): removed when the process ends
const std::string& scratch_dir() {
  static const std::string dir = [] {
    const std::string d = ::testing::TempDir() + "wm_bench_flags_" + std::to_string(getpid());
    std::filesystem::create_directories(d);
    std::atexit([] {
      std::error_code ec;
      std::filesystem::remove_all(::testing::TempDir() + "wm_bench_flags_" + std::to_string(getpid()), ec);
    });
    return d;
  }();
  return dir;
}

// the child's limits, between fork and exec: an alarm and a cap on its data
// segment, so that a hang or a runaway allocation fails the test, not the machine
void limit_child() {
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
  // (a sanitizer's shadow memory would not fit under the cap)
  const rlimit data{rlim_t{4} << 30, rlim_t{4} << 30};
  setrlimit(RLIMIT_DATA, &data);
#endif
  alarm(60);
}

testing::LoggedRun run_bench(const std::vector<std::string>& argv) {
  static int count = 0;
  return testing::run_logged(argv, scratch_dir() + "/run" + std::to_string(count++) + ".log", limit_child);
}

// the CPU backend and a model small enough to run in a second; bad flags come after these
const std::string kTinyConfig = std::string(WM_SOURCE_DIR) + "/configs/tiny-test.json";
const std::vector<std::string> kMg2 = {WM_MG2_BENCH_BIN, "--device=cpu", "--config=" + kTinyConfig,
                                       "--sessions=1",   "--windows=1",  "--reps=1",
                                       "--blocks=1"};
const std::vector<std::string> kAttention = {WM_ATTENTION_BENCH_BIN, "--device=cpu", "--heads=1", "--head_dim=64",
                                             "--cached=64",          "--queries=64", "--reps=1"};

std::vector<std::string> with(std::vector<std::string> argv, const std::string& flag) {
  argv.push_back(flag);  // a repeated flag overrides the earlier one
  return argv;
}

// the refusal: exit code 2, and one line of stderr holding `message`, with no JSON row printed
void expect_refused(const std::vector<std::string>& argv, const std::string& message) {
  const testing::LoggedRun r = run_bench(argv);
  EXPECT_EQ(r.code, 2) << argv.back() << ":\n" << r.log;
  EXPECT_NE(r.log.find(message), std::string::npos) << "no '" << message << "' in:\n" << r.log;
  EXPECT_EQ(r.log.find('{'), std::string::npos) << "work was done:\n" << r.log;
}

TEST(BenchFlags, Mg2RefusesCountsOutsideTheirRange) {
  // 0 sessions crashed (SIGSEGV), -3 aborted (std::length_error), 0 blocks printed 1e+33 ms
  expect_refused(with(kMg2, "--sessions=0"), "--sessions=0: expected a comma-separated list of one or more integers");
  expect_refused(with(kMg2, "--sessions=-3"), "--sessions=-3: expected");
  expect_refused(with(kMg2, "--sessions=1,0"), "--sessions=1,0: expected");
  expect_refused(with(kMg2, "--windows=0"), "--windows=0: expected");
  expect_refused(with(kMg2, "--blocks=0"), "--blocks=0: expected an integer from 1 to");
  expect_refused(with(kMg2, "--reps=0"), "--reps=0: expected an integer from 1 to");
  expect_refused(with(kMg2, "--batch_invariant=2"), "--batch_invariant=2: expected an integer from 0 to 1");
  expect_refused(with(kMg2, "--device=gpu"), "--device=gpu: expected cuda or cpu");
}

TEST(BenchFlags, Mg2RefusesTextThatIsNotWhollyANumber) {
  // atoi read "abc" as 0 and "3x" as 3; an empty list timed nothing and exited 0
  expect_refused(with(kMg2, "--reps=abc"), "--reps=abc: expected an integer");
  expect_refused(with(kMg2, "--reps=3x"), "--reps=3x: expected an integer");
  expect_refused(with(kMg2, "--reps=99999999999999999999"), "--reps=99999999999999999999: expected");
  expect_refused(with(kMg2, "--sessions="), "--sessions=: expected a comma-separated list");
  expect_refused(with(kMg2, "--sessions=1,,2"), "--sessions=1,,2: expected");
  expect_refused(with(kMg2, "--windows=6,x"), "--windows=6,x: expected");
}

TEST(BenchFlags, Mg2RefusesWindowsShorterThanABlock) {
  const std::string three_frame_block = scratch_dir() + "/b3.json";
  std::ifstream in(kTinyConfig);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string config = ss.str();
  const std::string one = "\"frames_per_block\": 1";
  ASSERT_NE(config.find(one), std::string::npos) << config;
  config.replace(config.find(one), one.size(), "\"frames_per_block\": 3");
  std::ofstream(three_frame_block) << config;
  std::vector<std::string> argv = kMg2;
  argv[2] = "--config=" + three_frame_block;
  expect_refused(with(argv, "--windows=2"), "--windows=2: expected windows of at least 3 latent frames");
}

TEST(BenchFlags, UnknownFlagsAndStrayWordsAreRefused) {
  // a typo used to time the default grid
  expect_refused(with(kMg2, "--sesions=8"), "--sesions: unknown flag; this benchmark takes");
  expect_refused(with(kMg2, "8"), "stray argument \"8\"");
  expect_refused(with(kAttention, "--querys=64"), "--querys: unknown flag");
}

TEST(BenchFlags, AttentionRefusesShapesOutsideTheirRange) {
  // 0 queries divided by zero (SIGFPE), -1 queries or heads aborted, -64 cached tokens timed 16
  expect_refused(with(kAttention, "--queries=0"), "--queries=0: expected a comma-separated list of one or more");
  expect_refused(with(kAttention, "--queries=-1"), "--queries=-1: expected");
  expect_refused(with(kAttention, "--heads=-1"), "--heads=-1: expected an integer from 1 to");
  expect_refused(with(kAttention, "--cached=-64"), "--cached=-64: expected");
  expect_refused(with(kAttention, "--head_dim=48"), "--head_dim=48: expected 32, 64 or 128");
  expect_refused(with(kAttention, "--reps=0"), "--reps=0: expected an integer from 1 to");
  expect_refused(with(kAttention, "--reps=abc"), "--reps=abc: expected");
  expect_refused(with(kAttention, "--stages=2"),
                 "--stages=2: expected a comma-separated list of one or more of 0, 3, 4");
  expect_refused(with(kAttention, "--ws_keys=32"), "--ws_keys=32: expected");
  expect_refused(with(kAttention, "--ws_ablate=3"), "--ws_ablate=3: expected");
  expect_refused(with(kAttention, "--kernel=fast"), "--kernel=fast: expected auto, mma");
}

TEST(BenchFlags, EngineBenchNumbersAreStrict) {
  // std::stoi threw (an abort) on "abc" and read "8x" as 8
  expect_refused({ENGINE_BENCH_BIN, "--frames", "abc"}, "--frames abc: expected an integer from 1 to");
  expect_refused({ENGINE_BENCH_BIN, "--frames", "8x"}, "--frames 8x: expected");
  expect_refused({ENGINE_BENCH_BIN, "--threads", "-1"}, "--threads -1: expected an integer from 0 to");
}

TEST(BenchFlags, GoodFlagsStillRunOnTheCpu) {
  const testing::LoggedRun mg2 = run_bench(kMg2);
  EXPECT_EQ(mg2.code, 0) << mg2.log;
  EXPECT_NE(mg2.log.find("\"bench\":\"mg2\""), std::string::npos) << mg2.log;
  EXPECT_NE(mg2.log.find("\"sessions_batched\":1"), std::string::npos) << mg2.log;
  // lists as before: two query sizes give two rows; a bare --probe means --probe=1
  const testing::LoggedRun attention = run_bench(with(with(kAttention, "--queries=64,16"), "--probe"));
  EXPECT_EQ(attention.code, 0) << attention.log;
  EXPECT_NE(attention.log.find("\"query_tokens\":64"), std::string::npos) << attention.log;
  EXPECT_NE(attention.log.find("\"query_tokens\":16"), std::string::npos) << attention.log;
  EXPECT_NE(attention.log.find("\"probe_host_ms\""), std::string::npos) << attention.log;
}

}  // namespace
}  // namespace wm
