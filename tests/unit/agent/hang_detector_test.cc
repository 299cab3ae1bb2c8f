#include "agent/hang_detector.h"

#include <gtest/gtest.h>

#include <chrono>
#include <optional>

namespace meshrun::agent {
namespace {

using std::chrono::microseconds;
using std::chrono::milliseconds;
using std::chrono::seconds;
using Clock = HangDetector::Clock;

const Clock::time_point kT0 = Clock::time_point() + seconds(1000);

WorkerProgress Sample(pid_t pid, microseconds cpu, uint64_t output = 0) {
  return WorkerProgress{pid, cpu, output};
}

TEST(HangDetectorTest, AGroupWhoseWorkersUseNoCpuAndWriteNothingHangsAfterTheTimeout) {
  HangDetector detector(seconds(10));
  EXPECT_FALSE(detector.Observe(kT0, {Sample(1, seconds(3)), Sample(2, seconds(3))}));
  for (int s = 1; s < 10; ++s)
    EXPECT_FALSE(detector.Observe(kT0 + seconds(s),
                                  {Sample(1, seconds(3)), Sample(2, seconds(3))}))
        << s;
  std::optional<Hang> hang =
      detector.Observe(kT0 + seconds(10), {Sample(1, seconds(3)), Sample(2, seconds(3))});
  ASSERT_TRUE(hang);
  EXPECT_EQ(hang->quiet_for, seconds(10));
  EXPECT_FALSE(hang->by_heartbeat);
  // Said once.
  EXPECT_FALSE(detector.Observe(kT0 + seconds(11),
                                {Sample(1, seconds(3)), Sample(2, seconds(3))}));
}

TEST(HangDetectorTest, OneWorkerComputingKeepsItsWaitingPeersFromHanging) {
  HangDetector detector(seconds(10));
  for (int s = 0; s <= 30; ++s) {
    EXPECT_FALSE(
        detector.Observe(kT0 + seconds(s), {Sample(1, seconds(s)), Sample(2, {})}))
        << s;
  }
}

TEST(HangDetectorTest, OutputIsProgressWithoutCpuTime) {
  HangDetector detector(seconds(10));
  for (int s = 0; s <= 30; ++s)
    EXPECT_FALSE(detector.Observe(kT0 + seconds(s), {Sample(1, {}, /*output=*/s)})) << s;
}

TEST(HangDetectorTest, ABackgroundThreadsStrayTicksAreNotProgress) {
  // A 10 ms clock tick now and then (0.1% of a core) is under both bounds.
  HangDetector detector(seconds(20));
  std::optional<Hang> hang;
  int s = 0;
  for (; s <= 25 && !hang; ++s)
    hang = detector.Observe(kT0 + seconds(s), {Sample(1, milliseconds(10 * (s / 10)))});
  ASSERT_TRUE(hang);
  EXPECT_EQ(s - 1, 20);
}

TEST(HangDetectorTest, CpuUseUnderOnePercentOfACoreIsNotProgress) {
  // 0.5% of a core for 100 s: 500 ms, over kMinCpu but under 1%.
  HangDetector detector(seconds(100));
  std::optional<Hang> hang;
  for (int s = 0; s <= 100 && !hang; ++s)
    hang = detector.Observe(kT0 + seconds(s), {Sample(1, milliseconds(5 * s))});
  EXPECT_TRUE(hang);
}

TEST(HangDetectorTest, AGroupThatMovesAgainCanHangAgain) {
  HangDetector detector(seconds(5));
  detector.Observe(kT0, {Sample(1, {})});
  ASSERT_TRUE(detector.Observe(kT0 + seconds(5), {Sample(1, {})}));
  EXPECT_FALSE(detector.Observe(kT0 + seconds(6), {Sample(1, {}, 10)}));
  EXPECT_FALSE(detector.Observe(kT0 + seconds(10), {Sample(1, {}, 10)}));
  EXPECT_TRUE(detector.Observe(kT0 + seconds(11), {Sample(1, {}, 10)}));
}

TEST(HangDetectorTest, NewWorkersStartTheirClockWhenFirstSeenAndEndedOnesAreForgotten) {
  HangDetector detector(seconds(5));
  detector.Observe(kT0, {Sample(1, {})});
  // Worker 1 ended; worker 2 (a restart) is new at t+4.
  EXPECT_FALSE(detector.Observe(kT0 + seconds(4), {Sample(2, {})}));
  EXPECT_FALSE(detector.Observe(kT0 + seconds(8), {Sample(2, {})}));
  EXPECT_TRUE(detector.Observe(kT0 + seconds(9), {Sample(2, {})}));
  EXPECT_FALSE(detector.Observe(kT0 + seconds(10), {}));
}

TEST(HangDetectorTest, AWorkerThatSendsHeartbeatsIsJudgedByThemAlone) {
  HangDetector detector(seconds(5));
  detector.Observe(kT0, {Sample(1, {})});
  detector.Heartbeat(1, kT0 + seconds(1));
  // Spinning at a full core, writing output: no heartbeat, no progress.
  std::optional<Hang> hang;
  int s = 2;
  for (; s <= 10 && !hang; ++s)
    hang = detector.Observe(kT0 + seconds(s), {Sample(1, seconds(s), s)});
  ASSERT_TRUE(hang);
  EXPECT_EQ(s - 1, 6);
  EXPECT_TRUE(hang->by_heartbeat);
  EXPECT_EQ(hang->quiet_for, seconds(5));

  HangDetector beating(seconds(5));
  for (int t = 0; t <= 20; ++t) {
    beating.Heartbeat(7, kT0 + seconds(t));
    EXPECT_FALSE(beating.Observe(kT0 + seconds(t) + milliseconds(500), {Sample(7, {})}))
        << t;
  }
}

TEST(HangDetectorTest, AGroupOfHeartbeatsAndCpuIsNotAllHeartbeats) {
  HangDetector detector(seconds(5));
  detector.Observe(kT0, {Sample(1, {}), Sample(2, {})});
  detector.Heartbeat(1, kT0);
  std::optional<Hang> hang =
      detector.Observe(kT0 + seconds(5), {Sample(1, {}), Sample(2, {})});
  ASSERT_TRUE(hang);
  EXPECT_FALSE(hang->by_heartbeat);
}

}  // namespace
}  // namespace meshrun::agent
