#pragma once

// Test support: a real SLURM cluster on this machine from Debian's packages.
// One slurmctld and three slurmd "virtual nodes" n1..n3 (Debian's slurmd is
// built with multiple-slurmd support: NodeAddr=127.0.0.1, a port each, one
// `slurmd -D -N nI` each), authenticated by a private `munged -F` with its own
// key and socket. Everything lives in a fresh temporary directory; ports are
// kernel-chosen; every daemon is started and stopped by its pid.
//
// Node names must resolve for meshrun (the rendezvous host is the first node
// of SLURM's node list): when n1..n3 do not, an /etc/hosts line maps them to
// 127.0.0.1 while the cluster runs and is removed afterwards. A machine-wide
// lock keeps two clusters (two test processes) from running at once.
//
// Not thread-safe; one cluster per process at a time.

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace meshrun::testing {

class SlurmCluster {
 public:
  // Why a cluster cannot run here (not root, a package missing), or nullopt.
  static std::optional<std::string> WhyUnavailable();

  // Starts the cluster and waits (bounded) until its three nodes are idle.
  // On failure returns nullptr and sets *error (with the daemons' logs).
  static std::unique_ptr<SlurmCluster> Start(std::string* error);
  // Stops every daemon by pid (SIGTERM, then SIGKILL), undoes /etc/hosts, and
  // removes the directory.
  ~SlurmCluster();
  SlurmCluster(const SlurmCluster&) = delete;
  SlurmCluster& operator=(const SlurmCluster&) = delete;

  // The temporary directory (slurm.conf, logs, job files).
  const std::string& dir() const { return dir_; }
  // The environment SLURM's client commands need (SLURM_CONF=...), already
  // set in this process by Start().
  const std::string& conf() const { return conf_; }
  // How long Start() took until the nodes were idle.
  std::chrono::milliseconds start_time() const { return start_time_; }
  // The tail of every daemon log, for failure messages.
  std::string Logs() const;

 private:
  SlurmCluster() = default;
  bool Launch(std::string* error);
  bool WaitIdle(std::chrono::milliseconds timeout, std::string* error);
  void MapNodeNames();
  void UnmapNodeNames();

  std::string dir_;
  std::string conf_;
  int lock_fd_ = -1;
  std::vector<pid_t> daemons_;  // munged last: slurm daemons need it to stop
  pid_t munged_ = -1;
  std::string hosts_line_;  // the /etc/hosts line we added, or empty
  std::chrono::milliseconds start_time_{0};
};

// Runs argv (argv[0] a path) to completion with stdout and stderr merged;
// returns the wait status, or nullopt after `timeout` (the process is then
// killed). The output goes to *output.
std::optional<int> RunCommand(const std::vector<std::string>& argv,
                              std::chrono::milliseconds timeout, std::string* output);

}  // namespace meshrun::testing
