#pragma once

// Stragglers among fault-tolerant replica groups (issue 32): every group's
// arrival at each step's quorum (rendezvous/core/replica_quorum.h), kept as
// its lag behind the first group to be complete, so that the status page and
// /metrics show the slowest groups and the daemon logs one that is
// persistently the last.
//
// A group is complete when its last member arrives; its lag at a quorum is
// that moment minus the moment the first participant was complete. The
// slowest group of a quorum (two or more participants) is the one with the
// largest lag.
//
// Pure: the caller gives the times (RdzvClock in the daemon).

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <vector>

#include "rendezvous/core/rendezvous_state.h"

namespace meshrun::rdzv {

struct ReplicaLag {
  uint32_t replica = 0;
  double mean_lag_ms = 0;  // over its last kWindow quorums
  double last_lag_ms = 0;
  uint64_t quorums = 0;  // it took part in
  uint64_t slowest = 0;  // of those, the ones it was the last to arrive at
};

// A group that was the slowest at most of the last kWindow quorums.
struct PersistentStraggler {
  uint32_t replica = 0;
  size_t slowest_of_window = 0;
  double mean_lag_ms = 0;
};

class StragglerTracker {
 public:
  static constexpr size_t kWindow = 100;
  // Slowest at this share of the window, and this far behind on average
  // (below it, the order of arrival is noise): reported.
  static constexpr double kPersistentShare = 0.8;
  static constexpr double kMinReportedLagMs = 1.0;

  // A member of `replica` arrived for the next step at `now`.
  void Arrived(uint32_t replica, RdzvTime now);
  // The next step's quorum formed with `participants`: their lags are kept.
  // Returns a persistent straggler when there is one, at most once a window.
  std::optional<PersistentStraggler> Formed(const std::vector<uint32_t>& participants);
  // Every group seen, slowest (largest mean lag) first.
  std::vector<ReplicaLag> Lags() const;

 private:
  struct Group {
    std::deque<double> lags_ms;  // the last kWindow
    double sum_ms = 0;
    ReplicaLag totals;
  };
  // When each group was last complete, since the quorum before.
  std::map<uint32_t, RdzvTime> complete_at_;
  std::map<uint32_t, Group> groups_;
  std::deque<uint32_t> slowest_;  // of each of the last kWindow quorums
  size_t since_reported_ = kWindow;
};

}  // namespace meshrun::rdzv
