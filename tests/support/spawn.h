// Starting a program from a test: fork, stdout and stderr into a log file,
// an empty signal mask (a test runner may block signals the program needs),
// an optional step in the child just before exec (resource limits), exec.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace wm::testing {

// returns the child's pid (-1 if fork failed); the child exits 127 if exec fails
pid_t spawn_logged(const std::vector<std::string>& argv, const std::string& log_path,
                   void (*before_exec)() = nullptr);

// what a program did: its exit code (128 + the signal when one ended it) and
// its stdout and stderr together
struct LoggedRun {
  int code = -1;
  std::string log;
};
// spawn_logged, then waits for the program and reads its log back
LoggedRun run_logged(const std::vector<std::string>& argv, const std::string& log_path,
                     void (*before_exec)() = nullptr);

}  // namespace wm::testing
