#include "rendezvous/core/straggler_tracker.h"

#include <algorithm>
#include <chrono>

namespace meshrun::rdzv {

void StragglerTracker::Arrived(uint32_t replica, RdzvTime now) {
  auto [it, inserted] = complete_at_.emplace(replica, now);
  if (!inserted) it->second = std::max(it->second, now);
}

std::optional<PersistentStraggler> StragglerTracker::Formed(
    const std::vector<uint32_t>& participants) {
  std::vector<std::pair<uint32_t, RdzvTime>> complete;
  for (uint32_t replica : participants) {
    auto it = complete_at_.find(replica);
    if (it == complete_at_.end()) continue;
    complete.emplace_back(replica, it->second);
    complete_at_.erase(it);
  }
  if (complete.empty()) return std::nullopt;
  RdzvTime first = complete.front().second;
  for (const auto& [replica, at] : complete) first = std::min(first, at);
  uint32_t slowest = complete.front().first;
  double slowest_lag = -1;
  for (const auto& [replica, at] : complete) {
    const double lag_ms = std::chrono::duration<double, std::milli>(at - first).count();
    Group& group = groups_[replica];
    group.totals.replica = replica;
    group.totals.last_lag_ms = lag_ms;
    ++group.totals.quorums;
    group.lags_ms.push_back(lag_ms);
    group.sum_ms += lag_ms;
    if (group.lags_ms.size() > kWindow) {
      group.sum_ms -= group.lags_ms.front();
      group.lags_ms.pop_front();
    }
    group.totals.mean_lag_ms = group.sum_ms / static_cast<double>(group.lags_ms.size());
    if (lag_ms > slowest_lag) {
      slowest_lag = lag_ms;
      slowest = replica;
    }
  }
  if (complete.size() < 2) return std::nullopt;
  ++groups_[slowest].totals.slowest;
  slowest_.push_back(slowest);
  if (slowest_.size() > kWindow) slowest_.pop_front();
  ++since_reported_;
  if (slowest_.size() < kWindow || since_reported_ < kWindow) return std::nullopt;
  const size_t times =
      static_cast<size_t>(std::count(slowest_.begin(), slowest_.end(), slowest));
  const double mean_ms = groups_[slowest].totals.mean_lag_ms;
  if (static_cast<double>(times) < kPersistentShare * kWindow ||
      mean_ms < kMinReportedLagMs)
    return std::nullopt;
  since_reported_ = 0;
  return PersistentStraggler{slowest, times, mean_ms};
}

std::vector<ReplicaLag> StragglerTracker::Lags() const {
  std::vector<ReplicaLag> lags;
  for (const auto& [replica, group] : groups_) lags.push_back(group.totals);
  std::stable_sort(lags.begin(), lags.end(),
                   [](const ReplicaLag& a, const ReplicaLag& b) {
                     return a.mean_lag_ms > b.mean_lag_ms;
                   });
  return lags;
}

}  // namespace meshrun::rdzv
