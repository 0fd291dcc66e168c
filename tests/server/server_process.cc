#include "tests/server/server_process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "engine/model_config.h"
#include "tests/support/spawn.h"
#include "engine/weights.h"

namespace wm::testing {

namespace {

// removes the directories fresh_dir made once the process's tests are done,
// where they all passed: a failure keeps its servers' logs and checkpoints
// to read (ctest runs every test in a process of its own)
class TempDirs : public ::testing::Environment {
 public:
  void add(const std::string& dir) {
    if (std::find(dirs_.begin(), dirs_.end(), dir) == dirs_.end()) dirs_.push_back(dir);
  }
  void TearDown() override {
    if (!::testing::UnitTest::GetInstance()->Passed()) {
      for (const std::string& d : dirs_) std::fprintf(stderr, "kept for the failure: %s\n", d.c_str());
      return;
    }
    std::error_code ec;  // a directory that cannot go stays; it fails nothing
    for (const std::string& d : dirs_) std::filesystem::remove_all(d, ec);
    dirs_.clear();
  }

 private:
  std::vector<std::string> dirs_;
};

TempDirs& temp_dirs() {
  // gtest owns (and deletes) a registered environment
  static TempDirs* dirs = static_cast<TempDirs*>(::testing::AddGlobalTestEnvironment(new TempDirs));
  return *dirs;
}

}  // namespace

std::string fresh_dir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "wmserve_test_" + std::to_string(getpid()) + "_" + name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  temp_dirs().add(dir);
  return dir;
}

std::string make_tiny_model(const std::string& name, uint64_t seed, int frames_per_block, int patch) {
  const std::string dir = fresh_dir(name);
  auto config = load_model_config(std::string(WM_SOURCE_DIR) + "/configs/tiny-test.json");
  EXPECT_TRUE(config.ok()) << config.status();
  config->frames_per_block = frames_per_block;
  if (patch > 0) config->patch = patch;
  auto st = save_checkpoint(*config, random_host_weights(*config, seed), dir);
  EXPECT_TRUE(st.ok()) << st;
  return dir;
}

namespace {

pid_t spawn(const std::vector<std::string>& argv, const std::string& log_path) { return spawn_logged(argv, log_path); }

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

std::unique_ptr<ServerProcess> ServerProcess::start(const std::string& model_dir,
                                                    const std::vector<std::string>& args) {
  auto p = std::unique_ptr<ServerProcess>(new ServerProcess());
  static int count = 0;
  const std::string dir = fresh_dir("server" + std::to_string(count++));
  const std::string port_file = dir + "/ports.json";
  p->log_path_ = dir + "/wmserve.log";
  std::vector<std::string> argv = {WMSERVE_BIN,          "--model=" + model_dir, "--host=127.0.0.1",
                                   "--port=0",           "--metrics_port=0",     "--port_file=" + port_file,
                                   "--threads=1",        "--encoder_threads=1"};
  argv.insert(argv.end(), args.begin(), args.end());
  p->pid_ = spawn(argv, p->log_path_);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < deadline) {
    if (std::filesystem::exists(port_file)) {
      auto j = nlohmann::json::parse(read_text(port_file), nullptr, false);
      if (!j.is_discarded()) {
        p->port_ = j["port"].get<int>();
        p->metrics_port_ = j["metrics_port"].get<int>();
        return p;
      }
    }
    int status = 0;
    if (waitpid(p->pid_, &status, WNOHANG) == p->pid_) {
      p->exited_ = true;
      ADD_FAILURE() << "wmserve exited at startup:\n" << p->log();
      return nullptr;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ADD_FAILURE() << "wmserve did not start within 30 s:\n" << p->log();
  return nullptr;
}

ServerProcess::~ServerProcess() {
  if (pid_ > 0 && !exited_) {
    kill(pid_, SIGKILL);
    int status = 0;
    waitpid(pid_, &status, 0);
  }
}

void ServerProcess::signal(int sig) const { kill(pid_, sig); }

std::optional<int> ServerProcess::wait_exit(double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(static_cast<int>(timeout_s * 1000));
  for (;;) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      exited_ = true;
      if (WIFEXITED(status)) return WEXITSTATUS(status);
      if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
      return -1;
    }
    if (std::chrono::steady_clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

int64_t ServerProcess::rss_bytes() const {
  std::ifstream in("/proc/" + std::to_string(pid_) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::atoll(line.c_str() + 6) * 1024;
  }
  return 0;
}

std::string ServerProcess::log() const { return read_text(log_path_); }

int run_program(const std::vector<std::string>& argv, std::string* log) {
  const std::string path = fresh_dir("run") + "/out.log";
  const pid_t pid = spawn(argv, path);
  int status = 0;
  waitpid(pid, &status, 0);
  if (log != nullptr) *log = read_text(path);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string http_get(int port, const std::string& path, int* http_status) {
  return http_request(port, "GET", path, http_status);
}

int idle_connection(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

std::string http_request(int port, const std::string& method, const std::string& path, int* http_status,
                         double timeout_s, const std::string& headers) {
  const int fd = idle_connection(port);
  if (fd < 0) return "";
  if (timeout_s > 0) {
    timeval tv{};
    tv.tv_sec = static_cast<time_t>(timeout_s);
    tv.tv_usec = static_cast<suseconds_t>((timeout_s - static_cast<double>(tv.tv_sec)) * 1e6);
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  }
  std::string response;
  {
    const std::string req =
        method + " " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n" + headers + "Content-Length: 0\r\n\r\n";
    if (write(fd, req.data(), req.size()) == static_cast<ssize_t>(req.size())) {
      char buf[65536];
      ssize_t n;
      while ((n = read(fd, buf, sizeof(buf))) > 0) response.append(buf, static_cast<size_t>(n));
    }
  }
  close(fd);
  const size_t body = response.find("\r\n\r\n");
  if (body == std::string::npos) return "";
  if (http_status != nullptr) {
    // "HTTP/1.1 200 OK"
    const size_t sp = response.find(' ');
    *http_status = sp == std::string::npos ? 0 : std::atoi(response.c_str() + sp + 1);
  }
  return response.substr(body + 4);
}

std::map<std::string, double> parse_prometheus(const std::string& text) {
  std::map<std::string, double> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    // the value follows the last space (labels may hold spaces only inside quotes; ours do not)
    const size_t sp = line.rfind(' ');
    if (sp == std::string::npos) continue;
    out[line.substr(0, sp)] = std::strtod(line.c_str() + sp + 1, nullptr);
  }
  return out;
}

}  // namespace wm::testing
