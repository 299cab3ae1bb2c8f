#pragma once

// Child processes of the benchmark: started with posix_spawn (safe after gRPC
// or libtorch started threads, unlike fork), stdin and stdout on pipes, stderr
// inherited, and ended by pid. Every wait has a deadline.
//
// Not thread-safe; the orchestrator drives its children from one thread.

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace meshrun::bench {

using SteadyClock = std::chrono::steady_clock;
using SteadyTime = SteadyClock::time_point;

class ChildProcess {
 public:
  // Starts argv[0] (a path) with `argv`.
  static absl::StatusOr<std::unique_ptr<ChildProcess>> Spawn(
      const std::vector<std::string>& argv);
  ~ChildProcess();  // Kill() if still running
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  // The next stdout line without '\n'; nullopt at EOF or once `deadline` passed.
  std::optional<std::string> ReadLine(SteadyTime deadline);
  // Writes `line` and '\n' to the child's stdin; false if the child is gone.
  bool WriteLine(const std::string& line);
  // Closes the child's stdin (it sees EOF).
  void CloseStdin();
  // Asks the child to end (SIGTERM), waits up to `grace`, then SIGKILLs it.
  // Returns the wait status.
  int Stop(std::chrono::milliseconds grace);
  // SIGKILL and reap.
  void Kill();
  // The wait status if the child has exited (reaping it), else nullopt.
  std::optional<int> ExitStatus();

 private:
  ChildProcess() = default;
  std::optional<int> WaitUntil(SteadyTime deadline);

  pid_t pid_ = -1;
  int stdin_fd_ = -1;
  int stdout_fd_ = -1;
  std::string buffer_;
  std::optional<int> status_;
};

// "exit code 1", "signal Aborted", ...
std::string DescribeWaitStatus(int status);

// On SIGINT/SIGTERM/SIGHUP, SIGKILLs every live child (by pid) and exits, so an
// interrupted benchmark leaves no daemon or client behind. Also ignores SIGPIPE.
void InstallChildCleanupHandlers();

// For client processes: die with the parent (PR_SET_PDEATHSIG).
void DieWithParent();

// Directory of the running executable (build/bin).
std::string SelfDir();
std::string SelfPath();

}  // namespace meshrun::bench
