#pragma once

// Stragglers of jobs without replica groups (issue 32): the step times
// workers report with their heartbeats (meshrun.heartbeat(step_seconds=...):
// each rank's own measure of its step's work, before the collective that
// makes every rank's step last as long as the slowest's), which agents pass
// on with their keep-alive. A rank whose mean is well above the median of
// its run's ranks is slow.
//
// Pure.

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

namespace meshrun::rdzv {

struct RankStepTime {
  uint32_t rank = 0;
  double mean_seconds = 0;  // over the rank's last StepWindow::kSize steps
  uint64_t steps = 0;       // reported in all
  std::string node_id;      // filled in by the daemon
  std::string host;
};

// A rank's recent step times (in the agent).
class StepWindow {
 public:
  static constexpr size_t kSize = 100;
  void Add(double seconds);
  double mean() const {
    return times_.empty() ? 0 : sum_ / static_cast<double>(times_.size());
  }
  uint64_t steps() const { return steps_; }

 private:
  std::deque<double> times_;
  double sum_ = 0;
  uint64_t steps_ = 0;
};

struct SlowRank {
  RankStepTime rank;
  double times_median = 0;  // its mean over the median of all ranks' means
};

// Ranks at least kSlowRatio times the median of all ranks' means, with at
// least kMinSteps steps, slowest first. Fewer than two ranks: none.
inline constexpr double kSlowRatio = 1.2;
inline constexpr uint64_t kMinSteps = 10;
std::vector<SlowRank> SlowRanks(const std::vector<RankStepTime>& ranks);

}  // namespace meshrun::rdzv
