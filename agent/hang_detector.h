#pragma once

// --hang-timeout, the pure part: whether a local worker group still makes
// progress, judged from what the agent sees without the program's help.
//
// A worker makes progress when it writes output (stdout or stderr), or when
// it and everything it started use CPU time: at least kMinCpuShare of one
// core since its last progress, and at least kMinCpu (a few clock ticks, so
// that a background thread's stray tick is no progress). A worker blocked in
// a collective, a lock, a SIGSTOP or an unanswered read uses none.
//
// A worker that has called meshrun.heartbeat() (or its C++ twin) is judged
// by its heartbeats alone from then on: precise where CPU time is not (a
// rank spinning in a collective that never completes).
//
// The group hangs when none of its workers has made progress for the
// timeout: a rank waiting for a local peer that computes is not hung.
// Samples and the clock come from the caller (agent/agent.cc).

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <vector>

namespace meshrun::agent {

// What a worker has done so far, as the agent counts it.
struct WorkerProgress {
  pid_t pid = 0;
  std::chrono::microseconds cpu{0};  // the worker's and its descendants'
  uint64_t output_bytes = 0;
};

struct Hang {
  // Since the group's last progress.
  std::chrono::steady_clock::duration quiet_for{};
  // Whether every worker was judged by heartbeats (else some by CPU time and
  // output).
  bool by_heartbeat = false;
};

class HangDetector {
 public:
  using Clock = std::chrono::steady_clock;
  static constexpr double kMinCpuShare = 0.01;
  static constexpr std::chrono::milliseconds kMinCpu{50};

  // `timeout` > 0.
  explicit HangDetector(Clock::duration timeout) : timeout_(timeout) {}

  // One sample of every live worker of the group, taken at `now`. Returns a
  // Hang once when the group has made no progress for the timeout; then
  // nothing until it makes progress again. Workers missing from `workers`
  // (ended) are forgotten; new ones start with progress at `now`.
  std::optional<Hang> Observe(Clock::time_point now,
                              const std::vector<WorkerProgress>& workers);
  // A heartbeat from `pid` (one of the group's workers) at `now`.
  void Heartbeat(pid_t pid, Clock::time_point now);

 private:
  struct Worker {
    // Where its last progress left it.
    Clock::time_point progress_at;
    std::chrono::microseconds cpu_at{0};
    uint64_t output_at = 0;
    bool heartbeats = false;
  };

  const Clock::duration timeout_;
  std::map<pid_t, Worker> workers_;
  bool reported_ = false;
};

}  // namespace meshrun::agent
