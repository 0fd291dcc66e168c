// wmsim as a process on outputs it cannot write: each case must exit non-zero
// with a message, within bounded time, and leave nothing behind that looks
// whole (a dataset.json beside episodes of another run, a truncated .npy).
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/support/spawn.h"

namespace wm {
namespace {

using SimRun = testing::LoggedRun;

std::string temp_dir() {
  static const std::string dir = [] {
    const std::string d = ::testing::TempDir() + "wm_sim_cli_" + std::to_string(getpid());
    std::filesystem::remove_all(d);
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

// the child's limits, set between fork and exec: a time limit (SIGALRM
// survives exec), optionally a cap on the size of the files it writes, which
// stands for a full disk (with SIGXFSZ ignored a write past it fails with
// EFBIG), and optionally stdout on /dev/full
unsigned child_timeout_s = 60;
rlim_t child_file_size_limit = RLIM_INFINITY;
bool child_stdout_full = false;
void limit_child() {
  if (child_file_size_limit != RLIM_INFINITY) {
    signal(SIGXFSZ, SIG_IGN);
    const rlimit fsize{child_file_size_limit, child_file_size_limit};
    setrlimit(RLIMIT_FSIZE, &fsize);
  }
  if (child_stdout_full) {
    const int fd = open("/dev/full", O_WRONLY);
    if (fd >= 0) {
      dup2(fd, 1);
      close(fd);
    }
  }
  alarm(child_timeout_s);
}

SimRun run_wmsim(std::vector<std::string> args, int timeout_s = 60, rlim_t file_size_limit = RLIM_INFINITY,
                 bool stdout_full = false) {
  static int count = 0;
  args.insert(args.begin(), WMSIM_BIN);
  child_timeout_s = static_cast<unsigned>(timeout_s);
  child_file_size_limit = file_size_limit;
  child_stdout_full = stdout_full;
  return testing::run_logged(args, temp_dir() + "/run" + std::to_string(count++) + ".log", limit_child);
}

TEST(WmsimCli, ScriptToAFullStdoutFails) {
  const SimRun r = run_wmsim({"script", "--seed", "1", "--frames", "50", "--out", "-"}, 30, RLIM_INFINITY, true);
  EXPECT_EQ(r.code, 1) << r.log;
  EXPECT_NE(r.log.find("stdout"), std::string::npos) << r.log;
}

TEST(WmsimCli, DatasetTooLargeForTheDiskIsRefusedBeforeWriting) {
  // a million episodes of 100,000 frames: about 1.2 PB of frames
  const std::string out = temp_dir() + "/huge_dataset";
  const SimRun r = run_wmsim({"dataset", "--seed", "1", "--episodes", "1000000", "--frames", "100000", "--out", out}, 10);
  EXPECT_EQ(r.code, 2) << r.log;
  EXPECT_NE(r.log.find("free"), std::string::npos) << r.log;
  EXPECT_FALSE(std::filesystem::exists(out));
}

TEST(WmsimCli, RenderTooLargeForTheDiskIsRefusedBeforeWriting) {
  // a million actions at 1024 x 1024: about 3 TiB of frames
  const uint64_t need = uint64_t{1000001} * 1024 * 1024 * 3;
  std::error_code ec;
  const auto space = std::filesystem::space(temp_dir(), ec);
  if (ec || space.available >= need) GTEST_SKIP() << "the disk has room for 3 TiB";
  const std::string script = temp_dir() + "/million.txt";
  {
    std::ofstream s(script);
    for (int i = 0; i < 10; ++i) s << "W 0 0 *100000\n";
  }
  const std::string out = temp_dir() + "/huge_render";
  const SimRun r = run_wmsim(
      {"render", "--seed", "1", "--script", script, "--out", out, "--width", "1024", "--height", "1024"}, 10);
  EXPECT_EQ(r.code, 2) << r.log;
  EXPECT_NE(r.log.find("free"), std::string::npos) << r.log;
  EXPECT_FALSE(std::filesystem::exists(out));
}

TEST(WmsimCli, FailedRerunLeavesNoDatasetJson) {
  const std::string out = temp_dir() + "/rerun";
  SimRun r = run_wmsim({"dataset", "--seed", "1", "--episodes", "2", "--frames", "3", "--out", out, "--threads", "1"});
  ASSERT_EQ(r.code, 0) << r.log;
  ASSERT_TRUE(std::filesystem::exists(out + "/dataset.json"));
  // the second episode's frames cannot be written this time
  std::filesystem::remove(out + "/episode_00001/frames.npy");
  std::filesystem::create_directory(out + "/episode_00001/frames.npy");
  r = run_wmsim({"dataset", "--seed", "2", "--episodes", "2", "--frames", "3", "--out", out, "--threads", "1"});
  EXPECT_EQ(r.code, 1) << r.log;
  EXPECT_FALSE(std::filesystem::exists(out + "/dataset.json")) << "episode 0 is of seed 2 now, the old description is wrong";
}

TEST(WmsimCli, FailedRerunLeavesNoSummaryJson) {
  const std::string script = temp_dir() + "/two.txt";
  {
    std::ofstream s(script);
    s << "W 0 0 *2\n";
  }
  const std::string out = temp_dir() + "/rerender";
  SimRun r = run_wmsim({"render", "--seed", "1", "--script", script, "--out", out});
  ASSERT_EQ(r.code, 0) << r.log;
  ASSERT_TRUE(std::filesystem::exists(out + "/summary.json"));
  std::filesystem::remove(out + "/frame_00001.jpg");
  std::filesystem::create_directory(out + "/frame_00001.jpg");
  r = run_wmsim({"render", "--seed", "2", "--script", script, "--out", out});
  EXPECT_EQ(r.code, 1) << r.log;
  EXPECT_FALSE(std::filesystem::exists(out + "/summary.json")) << "the old summary describes another seed";
}

TEST(WmsimCli, FullDiskLeavesNoTruncatedFrames) {
  // 4 frames of 64 x 64 are 49 KiB of frames.npy; each JPEG is ~2 KiB
  const std::string script = temp_dir() + "/four.txt";
  {
    std::ofstream s(script);
    s << "W 0 0 *3\n";
  }
  const std::string out = temp_dir() + "/full_render";
  const SimRun r = run_wmsim({"render", "--seed", "1", "--script", script, "--out", out}, 30, 20 * 1024);
  EXPECT_EQ(r.code, 1) << r.log;
  EXPECT_NE(r.log.find("frames.npy"), std::string::npos) << r.log;
  EXPECT_FALSE(std::filesystem::exists(out + "/frames.npy")) << "a truncated frames.npy stays behind";
}

}  // namespace
}  // namespace wm
