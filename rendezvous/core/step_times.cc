#include "rendezvous/core/step_times.h"

#include <algorithm>

namespace meshrun::rdzv {

void StepWindow::Add(double seconds) {
  times_.push_back(seconds);
  sum_ += seconds;
  ++steps_;
  if (times_.size() > kSize) {
    sum_ -= times_.front();
    times_.pop_front();
  }
}

std::vector<SlowRank> SlowRanks(const std::vector<RankStepTime>& ranks) {
  std::vector<double> means;
  for (const RankStepTime& rank : ranks)
    if (rank.steps >= kMinSteps) means.push_back(rank.mean_seconds);
  if (means.size() < 2) return {};
  std::sort(means.begin(), means.end());
  const size_t half = means.size() / 2;
  const double median =
      means.size() % 2 == 1 ? means[half] : (means[half - 1] + means[half]) / 2;
  if (median <= 0) return {};
  std::vector<SlowRank> slow;
  for (const RankStepTime& rank : ranks) {
    if (rank.steps < kMinSteps) continue;
    const double ratio = rank.mean_seconds / median;
    if (ratio >= kSlowRatio) slow.push_back({rank, ratio});
  }
  std::sort(slow.begin(), slow.end(), [](const SlowRank& a, const SlowRank& b) {
    return a.times_median > b.times_median;
  });
  return slow;
}

}  // namespace meshrun::rdzv
