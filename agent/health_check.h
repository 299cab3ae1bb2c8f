#pragma once

// --health-check and --health-check-dir: commands an agent runs before it
// joins a run and before each restart round. A node whose check fails stays
// out: it says which check failed and its output, tells the daemon (the
// status page shows it unhealthy), leaves the run and exits with
// kUnhealthyExitCode (agent/agent_state.h), so that an elastic run re-forms without it
// instead of failing on it again. A check that hangs fails at its timeout.

#include <atomic>
#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace meshrun::agent {

struct HealthFailure {
  std::string check;    // the command as given
  std::string outcome;  // "exit 1", "took over 60 s", ...
  std::string output;   // its last lines (stdout and stderr)

  // One line: "health check 'CMD' failed (exit 1): <last line of output>".
  std::string Summary() const;
};

// The executable files of `dir`, in name order (as run-parts), skipping
// hidden files and editor backups ("~"). An unreadable directory is an error.
absl::StatusOr<std::vector<std::string>> HealthChecksIn(const std::string& dir);

// Runs each check through /bin/sh -c, in order, each for at most `timeout`;
// the first that fails, or nullopt when all pass or `cancel` (when given)
// became true, which kills the check running then. Blocking.
std::optional<HealthFailure> RunHealthChecks(const std::vector<std::string>& checks,
                                             std::chrono::seconds timeout,
                                             const std::atomic<bool>* cancel = nullptr);

}  // namespace meshrun::agent
