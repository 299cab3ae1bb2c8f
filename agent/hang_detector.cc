#include "agent/hang_detector.h"

#include <algorithm>

namespace meshrun::agent {

std::optional<Hang> HangDetector::Observe(Clock::time_point now,
                                          const std::vector<WorkerProgress>& workers) {
  std::map<pid_t, Worker> seen;
  for (const WorkerProgress& sample : workers) {
    auto known = workers_.find(sample.pid);
    if (known == workers_.end()) {
      seen[sample.pid] = Worker{now, sample.cpu, sample.output_bytes, false};
      continue;
    }
    Worker worker = known->second;
    if (!worker.heartbeats) {
      const auto since =
          std::chrono::duration_cast<std::chrono::microseconds>(now - worker.progress_at);
      const auto needed = std::max<std::chrono::microseconds>(
          std::chrono::duration_cast<std::chrono::microseconds>(since * kMinCpuShare),
          kMinCpu);
      if (sample.output_bytes != worker.output_at || sample.cpu - worker.cpu_at >= needed)
        worker = Worker{now, sample.cpu, sample.output_bytes, false};
    }
    seen[sample.pid] = worker;
  }
  workers_ = std::move(seen);
  if (workers_.empty()) return std::nullopt;

  Clock::time_point last = workers_.begin()->second.progress_at;
  bool by_heartbeat = true;
  for (const auto& [pid, worker] : workers_) {
    last = std::max(last, worker.progress_at);
    by_heartbeat = by_heartbeat && worker.heartbeats;
  }
  if (now - last < timeout_) {
    reported_ = false;
    return std::nullopt;
  }
  if (reported_) return std::nullopt;
  reported_ = true;
  return Hang{now - last, by_heartbeat};
}

void HangDetector::Heartbeat(pid_t pid, Clock::time_point now) {
  Worker& worker = workers_[pid];
  worker.heartbeats = true;
  worker.progress_at = std::max(worker.progress_at, now);
}

}  // namespace meshrun::agent
