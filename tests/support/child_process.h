#pragma once

// Test support: a real child process started with posix_spawn, its stdout on
// a pipe, and ended by its pid when the object goes away. Every wait has a
// deadline.

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace meshrun::testing {

class ChildProcess {
 public:
  // Starts argv[0] (a path) with argv; stderr is inherited, or joins stdout
  // on the pipe when `merge_stderr`.
  explicit ChildProcess(std::vector<std::string> argv, bool merge_stderr = false);
  ~ChildProcess();  // SIGKILL and reap if still running
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  // The next line of stdout (without '\n'), or nullopt at EOF or timeout.
  std::optional<std::string> ReadLine(std::chrono::milliseconds timeout);
  // Reads lines until one contains `needle` (returned) or EOF/timeout; every
  // line read is also kept in output().
  std::optional<std::string> ReadUntil(const std::string& needle,
                                       std::chrono::milliseconds timeout);
  // Reads everything until EOF (bounded by `timeout`), into output().
  const std::string& ReadAll(std::chrono::milliseconds timeout);
  const std::string& output() const { return output_; }
  // Sends a signal to the child.
  void Signal(int signal_number);
  // Waits for exit; returns the wait status, or nullopt on timeout.
  std::optional<int> Wait(std::chrono::milliseconds timeout);
  bool Running();

 private:
  pid_t pid_ = -1;
  int stdout_fd_ = -1;
  std::string buffer_;
  std::string output_;
  std::optional<int> exit_status_;
};

// The real meshrun-rdzvd on 127.0.0.1 with a kernel-assigned port; started
// through `wrapper` when given (a command that execs the rest of its argv,
// e.g. {"/usr/bin/prlimit", "--nofile=64:64"}: the pid stays the daemon's).
class DaemonProcess {
 public:
  explicit DaemonProcess(std::vector<std::string> extra_args = {},
                         std::vector<std::string> wrapper = {});
  const std::string& endpoint() const { return endpoint_; }
  ChildProcess& process() { return process_; }
  // With --metrics-port: the port of its second stdout line
  // (MESHRUN_RDZVD_METRICS=host:port); -1 if it does not come.
  int ReadMetricsPort();

 private:
  ChildProcess process_;
  std::string endpoint_;
};

// Reads the child's output to EOF and waits for it: its exit code, 128 +
// the signal that ended it, or -1 if it did not end within `timeout`.
int ExitCode(ChildProcess& process,
             std::chrono::milliseconds timeout = std::chrono::seconds(60));

// A port that was free on 127.0.0.1 a moment ago (for flags that need one
// before the process that binds it starts).
int FreePort();

// Directory holding the built binaries (build/bin).
std::string BinDir();

// Whether `pid` exists and is not a zombie.
bool ProcessAlive(pid_t pid);
// Whether `pid` is gone (or a zombie) within `timeout`.
bool GoneWithin(pid_t pid, std::chrono::milliseconds timeout);

// Whether every file `names` in `dir` exists within `timeout`; meanwhile
// reads the `readers`' output (so none blocks on a full pipe).
bool FilesWithin(const std::string& dir, const std::vector<std::string>& names,
                 const std::vector<std::unique_ptr<ChildProcess>>& readers,
                 std::chrono::milliseconds timeout);

}  // namespace meshrun::testing
