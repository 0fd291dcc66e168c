#include "tests/support/spawn.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <iterator>

namespace wm::testing {

pid_t spawn_logged(const std::vector<std::string>& argv, const std::string& log_path, void (*before_exec)()) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    const int fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
      close(fd);
    }
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    if (before_exec != nullptr) before_exec();
    execv(args[0], args.data());
    _exit(127);
  }
  return pid;
}

LoggedRun run_logged(const std::vector<std::string>& argv, const std::string& log_path, void (*before_exec)()) {
  LoggedRun r;
  const pid_t pid = spawn_logged(argv, log_path, before_exec);
  if (pid < 0) return r;
  int status = 0;
  if (waitpid(pid, &status, 0) != pid) return r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  std::ifstream in(log_path, std::ios::binary);
  r.log.assign(std::istreambuf_iterator<char>(in), {});
  return r;
}

}  // namespace wm::testing
