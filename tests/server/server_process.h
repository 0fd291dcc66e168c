// Test helpers: a real wmserve process on a loopback port, a tiny random
// checkpoint, running a tool, and a plain-socket HTTP GET.
#pragma once

#include <sys/types.h>

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace wm::testing {

// a seeded random checkpoint of configs/tiny-test.json in a fresh directory
// (frames_per_block > 1 makes a variant that generates blocks of frames)
// patch 0 keeps the config's (8: 16 tokens a frame; 4: 64)
std::string make_tiny_model(const std::string& name, uint64_t seed = 1, int frames_per_block = 1, int patch = 0);
// a fresh empty directory under the test's temporary directory
std::string fresh_dir(const std::string& name);

class ServerProcess {
 public:
  // starts build/server/wmserve on 127.0.0.1 (any free ports) and waits until it listens
  static std::unique_ptr<ServerProcess> start(const std::string& model_dir, const std::vector<std::string>& args = {});
  ~ServerProcess();

  std::string target() const { return "127.0.0.1:" + std::to_string(port_); }
  int port() const { return port_; }
  int metrics_port() const { return metrics_port_; }
  pid_t pid() const { return pid_; }
  void signal(int sig) const;
  // the exit code (128 + signal when killed), or nothing after the timeout
  std::optional<int> wait_exit(double timeout_s);
  int64_t rss_bytes() const;
  std::string log() const;

 private:
  pid_t pid_ = -1;
  int port_ = 0;
  int metrics_port_ = -1;
  std::string log_path_;
  bool exited_ = false;
};

// runs a program to completion; returns its exit code, output in *log
int run_program(const std::vector<std::string>& argv, std::string* log);

// GET path over a plain TCP socket; returns the body (empty on failure)
std::string http_get(int port, const std::string& path, int* http_status = nullptr);
// any method (HTTP/1.0, empty body); the status is 0 when no response came
// (within timeout_s of each read, when positive); headers: more header
// lines, each ending in \r\n
std::string http_request(int port, const std::string& method, const std::string& path, int* http_status = nullptr,
                         double timeout_s = 0, const std::string& headers = "");
// a connection to 127.0.0.1:port that sends nothing (-1 on failure; close it)
int idle_connection(int port);

// Prometheus text format: "name{labels}" -> value, for every sample line
std::map<std::string, double> parse_prometheus(const std::string& text);

}  // namespace wm::testing
