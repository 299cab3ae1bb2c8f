#pragma once

// The process that runs --hang-timeout's stack dumpers (py-spy, gdb) for the
// agent, so that the workers need not let the agent's whole process tree
// trace them.
//
// Where Yama restricts ptrace (ptrace_scope 1), a process may trace another
// only if it descends from it, or from the process the other named with
// PR_SET_PTRACER. A worker that named the agent would let every descendant of
// the agent trace it: its sibling workers too. So the agent starts this
// helper before any worker, the helper's parent is the agent but it is no
// ancestor of any worker, the workers name it, and the dumpers run as its
// children: they may trace the workers, a worker may not trace another.
//
// The helper is the agent's own binary, run again with kDumpHelperFlag (a
// fresh exec, not a fork of a process with threads), serving requests on fd 3
// (a socket to the agent): each is a RunBounded (agent/bounded_command.h),
// answered with its CommandResult. It ends when the agent closes the socket,
// on SIGTERM (killing the command under way), and with the agent
// (PR_SET_PDEATHSIG).

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/bounded_command.h"

namespace meshrun::agent {

// argv[1] of the helper; argv[2] is the agent's pid.
inline constexpr char kDumpHelperFlag[] = "--meshrun-internal-dump-helper";

// The helper's main: serves the requests on fd 3 until EOF or SIGTERM, then
// returns the process's exit code. `argv` as main's.
int RunDumpHelper(int argc, char** argv);

class DumpHelper {
 public:
  // Starts `program` (the agent's binary: /proc/self/exe) as the helper and
  // waits for it to say it is ready.
  static absl::StatusOr<std::unique_ptr<DumpHelper>> Start(
      const std::string& program = "/proc/self/exe");
  // Closes its socket and SIGTERMs it (whatever it runs is killed), then
  // reaps it.
  ~DumpHelper();
  DumpHelper(const DumpHelper&) = delete;
  DumpHelper& operator=(const DumpHelper&) = delete;

  // What the workers name with PR_SET_PTRACER.
  pid_t pid() const { return pid_; }

  // RunBounded in the helper: `argv` runs as its child. Cancelling ends the
  // helper (SIGTERM): later calls fail to start. One call at a time.
  CommandResult Run(const std::vector<std::string>& argv, std::chrono::seconds timeout,
                    bool merge_stderr, size_t max_output,
                    const std::atomic<bool>* cancel = nullptr);

 private:
  DumpHelper(pid_t pid, int fd) : pid_(pid), fd_(fd) {}

  const pid_t pid_;
  int fd_;  // -1 once the helper is gone
};

}  // namespace meshrun::agent
