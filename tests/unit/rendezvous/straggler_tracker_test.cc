#include "rendezvous/core/straggler_tracker.h"

#include <gtest/gtest.h>

#include <chrono>
#include <optional>

namespace meshrun::rdzv {
namespace {

using std::chrono::milliseconds;
const RdzvTime kT0 = RdzvTime() + std::chrono::hours(1);

TEST(StragglerTrackerTest, AGroupsLagIsWhenItsLastMemberArrivedBehindTheFirstGroup) {
  StragglerTracker tracker;
  // Group 0 complete at +0 (its members at -5 and 0), group 1 at +30, group 2
  // at +10.
  tracker.Arrived(0, kT0 - milliseconds(5));
  tracker.Arrived(0, kT0);
  tracker.Arrived(1, kT0 + milliseconds(2));
  tracker.Arrived(1, kT0 + milliseconds(30));
  tracker.Arrived(2, kT0 + milliseconds(10));
  EXPECT_FALSE(tracker.Formed({0, 1, 2}));
  std::vector<ReplicaLag> lags = tracker.Lags();
  ASSERT_EQ(lags.size(), 3u);
  EXPECT_EQ(lags[0].replica, 1u);
  EXPECT_DOUBLE_EQ(lags[0].last_lag_ms, 30);
  EXPECT_EQ(lags[0].slowest, 1u);
  EXPECT_EQ(lags[1].replica, 2u);
  EXPECT_DOUBLE_EQ(lags[1].mean_lag_ms, 10);
  EXPECT_EQ(lags[2].replica, 0u);
  EXPECT_DOUBLE_EQ(lags[2].mean_lag_ms, 0);
  EXPECT_EQ(lags[2].quorums, 1u);
}

TEST(StragglerTrackerTest, AGroupSlowestAtMostQuorumsIsReportedOnceAWindow) {
  StragglerTracker tracker;
  int reports = 0;
  std::optional<PersistentStraggler> first;
  for (int step = 0; step < 3 * static_cast<int>(StragglerTracker::kWindow); ++step) {
    const RdzvTime start = kT0 + milliseconds(1000 * step);
    // Group 2 is 20 ms late at 9 steps of 10; group 0 is 5 ms late otherwise.
    tracker.Arrived(0, start + milliseconds(step % 10 == 0 ? 5 : 0));
    tracker.Arrived(1, start);
    tracker.Arrived(2, start + milliseconds(step % 10 == 0 ? 0 : 20));
    if (auto straggler = tracker.Formed({0, 1, 2})) {
      ++reports;
      if (!first) first = straggler;
    }
  }
  EXPECT_EQ(reports, 3);
  ASSERT_TRUE(first);
  EXPECT_EQ(first->replica, 2u);
  EXPECT_EQ(first->slowest_of_window, 90u);
  EXPECT_DOUBLE_EQ(first->mean_lag_ms, 18);
  EXPECT_EQ(tracker.Lags().front().replica, 2u);
}

TEST(StragglerTrackerTest, ArrivalOrderThatChangesIsNoStraggler) {
  StragglerTracker tracker;
  for (int step = 0; step < 5 * static_cast<int>(StragglerTracker::kWindow); ++step) {
    const RdzvTime start = kT0 + milliseconds(1000 * step);
    tracker.Arrived(step % 3, start + milliseconds(20));
    tracker.Arrived((step + 1) % 3, start);
    tracker.Arrived((step + 2) % 3, start);
    EXPECT_FALSE(tracker.Formed({0, 1, 2})) << step;
  }
}

TEST(StragglerTrackerTest, ALateGroupLeftOutKeepsItsArrivalForTheNextQuorum) {
  StragglerTracker tracker;
  tracker.Arrived(0, kT0);
  EXPECT_FALSE(tracker.Formed({0}));  // group 1 missed it (not here yet)
  tracker.Arrived(1, kT0 + milliseconds(500));
  tracker.Arrived(0, kT0 + milliseconds(600));
  EXPECT_FALSE(tracker.Formed({0, 1}));
  std::vector<ReplicaLag> lags = tracker.Lags();
  ASSERT_EQ(lags.size(), 2u);
  EXPECT_EQ(lags[0].replica, 0u);  // at 600, behind group 1 at 500
  EXPECT_DOUBLE_EQ(lags[0].last_lag_ms, 100);
  EXPECT_EQ(lags[0].quorums, 2u);
  EXPECT_DOUBLE_EQ(lags[0].mean_lag_ms, 50);
}

}  // namespace
}  // namespace meshrun::rdzv
