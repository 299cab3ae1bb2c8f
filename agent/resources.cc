#include "agent/resources.h"

#include <dirent.h>
#include <sys/resource.h>

#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <sstream>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace meshrun::agent {
namespace {

// The first line of a file, or nullopt.
std::optional<std::string> FirstLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) return std::nullopt;
  return line;
}

std::string Amount(rlim_t value, bool bytes) {
  if (value == RLIM_INFINITY) return "unlimited";
  if (bytes) return absl::StrCat(value / (1024 * 1024), " MiB");
  return absl::StrCat(value);
}

// Descriptors open in this process now; -1 when /proc is not there.
int OpenDescriptors() {
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return -1;
  int count = 0;
  while (dirent* entry = readdir(dir)) {
    if (entry->d_name[0] != '.') ++count;
  }
  closedir(dir);
  return count - 1;  // the directory's own
}

// The directory RemoveOnResourceExit removes (the agent's temporary log root).
std::mutex removed_on_exit_mu;
std::string removed_on_exit;  // guarded by removed_on_exit_mu

// The pids.max of this process's cgroup (v2, or v1's pids controller), when
// one is set.
std::optional<std::string> CgroupPidsMax() {
  std::ifstream in("/proc/self/cgroup");
  for (std::string line; std::getline(in, line);) {
    // "0::/path" (v2) or "N:pids:/path" (v1).
    const size_t first = line.find(':');
    const size_t second = line.find(':', first + 1);
    if (first == std::string::npos || second == std::string::npos) continue;
    const std::string controllers = line.substr(first + 1, second - first - 1);
    const std::string path = line.substr(second + 1);
    std::string file;
    if (controllers.empty()) {
      file = "/sys/fs/cgroup" + path + "/pids.max";
    } else if (controllers == "pids") {
      file = "/sys/fs/cgroup/pids" + path + "/pids.max";
    } else {
      continue;
    }
    if (auto value = FirstLine(file); value && *value != "max") return value;
  }
  return std::nullopt;
}

}  // namespace

int DescriptorsNeeded(int nproc, bool hosts_daemon) {
  // Measured with gRPC 1.51 and Asio: an agent holds ~17 of its own and ~4 a
  // worker (output pipes, log files; 3 more pipes while one starts), 21 in
  // all with one worker and 47 with eight; a hosted daemon ~5 more before
  // its clients, each worker's store connection one. Rounded up, plus room
  // for reconnects: a refusal here must never stop a launch that would work.
  const int per_worker = hosts_daemon ? 5 : 4;
  return 64 + (hosts_daemon ? 16 : 0) + per_worker * nproc;
}

absl::Status CheckDescriptors(int needed) {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY)
    return absl::OkStatus();
  const int open = OpenDescriptors();
  if (open < 0) return absl::OkStatus();
  if (static_cast<rlim_t>(open) + static_cast<rlim_t>(needed) <= limit.rlim_cur)
    return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "cannot get the file descriptors it needs: RLIMIT_NOFILE allows ", limit.rlim_cur,
      " (hard limit ", Amount(limit.rlim_max, false), "), ", open, " are open and ",
      needed, " more are needed; raise `ulimit -n`"));
}

std::string ThreadLimits() {
  std::vector<std::string> machine;
  // /proc/loadavg's fourth field: runnable/all threads of the machine.
  if (auto loadavg = FirstLine("/proc/loadavg")) {
    std::istringstream fields(*loadavg);
    std::string field;
    for (int i = 0; i < 4 && fields >> field; ++i) {
    }
    if (const size_t slash = field.find('/'); slash != std::string::npos)
      machine.push_back(
          absl::StrCat("this machine runs ", field.substr(slash + 1), " threads"));
  }
  if (auto value = FirstLine("/proc/sys/kernel/pid_max"))
    machine.push_back("kernel.pid_max " + *value);
  if (auto value = FirstLine("/proc/sys/kernel/threads-max"))
    machine.push_back("kernel.threads-max " + *value);
  if (auto value = CgroupPidsMax()) machine.push_back("cgroup pids.max " + *value);
  std::vector<std::string> process;
  for (auto [resource, name, bytes] : {std::tuple{RLIMIT_NPROC, "RLIMIT_NPROC", false},
                                       std::tuple{RLIMIT_STACK, "RLIMIT_STACK", true},
                                       std::tuple{RLIMIT_AS, "RLIMIT_AS", true}}) {
    rlimit limit{};
    if (getrlimit(resource, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY)
      process.push_back(absl::StrCat(name, " ", Amount(limit.rlim_cur, bytes)));
  }
  std::string text = absl::StrJoin(machine, ", ");
  if (!process.empty())
    absl::StrAppend(&text, text.empty() ? "" : "; ", "this process's ",
                    absl::StrJoin(process, ", "));
  return text;
}

void SetRemovedOnResourceExit(const std::string& dir) {
  std::lock_guard<std::mutex> lock(removed_on_exit_mu);
  removed_on_exit = dir;
}

void RemoveOnResourceExit() {
  std::lock_guard<std::mutex> lock(removed_on_exit_mu);
  if (removed_on_exit.empty()) return;
  std::error_code ignored;
  std::filesystem::remove_all(removed_on_exit, ignored);
}

}  // namespace meshrun::agent
