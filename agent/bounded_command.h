#pragma once

// A helper program the agent runs and waits for, bounded in time and in the
// output it keeps: the stack dumpers of --hang-timeout (agent/stack_dump.h)
// and the health checks (agent/health_check.h). Blocking: call it off the
// agent's io_context.

#include <atomic>
#include <chrono>
#include <string>
#include <vector>

namespace meshrun::agent {

struct CommandResult {
  bool started = false;
  bool timed_out = false;  // killed (SIGKILL to its process group) at the bound
  bool cancelled = false;  // killed because `cancel` became true
  int exit_code = -1;      // when it exited
  int signal = 0;          // when a signal ended it
  // The last `max_output` bytes of its stdout (and stderr, when merged).
  std::string output;
  std::string error;  // why it did not start

  bool ok() const { return started && !timed_out && signal == 0 && exit_code == 0; }
  // "exit 3", "killed by SIGSEGV", "took over 5 s", "cancelled", "cannot start ...".
  std::string Outcome(std::chrono::seconds timeout) const;
};

// Runs argv[0] (a path) with stdin from /dev/null, in a process group of its
// own, for at most `timeout`, and no longer than `cancel` (when given) stays
// false: it is looked at every 100 ms, so an agent that exits need not wait
// out the bound. Its stderr goes to the output too when `merge_stderr`, else
// to /dev/null.
CommandResult RunBounded(const std::vector<std::string>& argv,
                         std::chrono::seconds timeout, bool merge_stderr,
                         size_t max_output, const std::atomic<bool>* cancel = nullptr);

}  // namespace meshrun::agent
