#include "agent/health_check.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "agent/bounded_command.h"
#include "rendezvous/core/health_summary.h"

namespace meshrun::agent {

namespace fs = std::filesystem;

namespace {

// What is kept of a failing check's output: enough for nvidia-smi's error.
constexpr size_t kMaxCheckOutput = 4096;

}  // namespace

std::string HealthFailure::Summary() const {
  return rdzv::HealthSummary(check, outcome, output);
}

absl::StatusOr<std::vector<std::string>> HealthChecksIn(const std::string& dir) {
  std::error_code error;
  fs::directory_iterator entries(dir, error);
  if (error)
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot read the health check directory ", dir, ": ", error.message()));
  std::vector<std::string> checks;
  for (const fs::directory_entry& entry : entries) {
    const std::string name = entry.path().filename().string();
    if (name.empty() || name[0] == '.' || name.back() == '~') continue;
    if (!entry.is_regular_file(error) || access(entry.path().c_str(), X_OK) != 0)
      continue;
    checks.push_back(entry.path().string());
  }
  std::sort(checks.begin(), checks.end());
  return checks;
}

std::optional<HealthFailure> RunHealthChecks(const std::vector<std::string>& checks,
                                             std::chrono::seconds timeout,
                                             const std::atomic<bool>* cancel) {
  for (const std::string& check : checks) {
    if (cancel != nullptr && cancel->load()) return std::nullopt;
    CommandResult result = RunBounded({"/bin/sh", "-c", check}, timeout,
                                      /*merge_stderr=*/true, kMaxCheckOutput, cancel);
    if (result.cancelled) return std::nullopt;
    if (result.ok()) continue;
    return HealthFailure{check, result.Outcome(timeout), result.output};
  }
  return std::nullopt;
}

}  // namespace meshrun::agent
