#include "agent/file_timer.h"

#include <gtest/gtest.h>

#include <string>

namespace meshrun::agent {
namespace {

// What torch's FileTimerRequest.to_json() writes.
constexpr char kAcquire[] =
    R"({"version": 1, "pid": 4242, "scope_id": "step", "expiration_time": 1700000010.5, "signal": 9})";

TEST(ParseTimerRequestTest, ReadsTorchsRequests) {
  auto request = ParseTimerRequest(kAcquire);
  ASSERT_TRUE(request.ok()) << request.status();
  EXPECT_EQ(request->pid, 4242);
  EXPECT_EQ(request->scope_id, "step");
  EXPECT_DOUBLE_EQ(request->expiration_time, 1700000010.5);
  EXPECT_EQ(request->signal, 9);
  EXPECT_FALSE(request->release());

  auto release = ParseTimerRequest(
      R"({"version": 1, "pid": 4242, "scope_id": "step", "expiration_time": -1, "signal": 0})");
  ASSERT_TRUE(release.ok()) << release.status();
  EXPECT_TRUE(release->release());
}

TEST(ParseTimerRequestTest, RefusesWhatIsNotARequest) {
  for (
      const char* line : {
          "",
          "not json",
          "[1, 2]",
          R"({"pid": 4242, "scope_id": "s", "signal": 9})",  // no time
          R"({"pid": "4242", "scope_id": "s", "expiration_time": 1, "signal": 9})",  // string
                                                                                     // pid
          R"({"pid": 0, "scope_id": "s", "expiration_time": 1, "signal": 9})",   // pid 0
          R"({"pid": -1, "scope_id": "s", "expiration_time": 1, "signal": 9})",  // every
                                                                                 // process
          R"({"pid": 1.5, "scope_id": "s", "expiration_time": 1, "signal": 9})",
          R"({"pid": 1e20, "scope_id": "s", "expiration_time": 1, "signal": 9})",
          R"({"pid": 7, "scope_id": 3, "expiration_time": 1, "signal": 9})",
          R"({"pid": 7, "scope_id": "s", "expiration_time": 1, "signal": 99})",
      }) {
    EXPECT_FALSE(ParseTimerRequest(line).ok()) << line;
  }
}

TimerRequest Timer(pid_t pid, const std::string& scope, double expiration,
                   int signal = 9) {
  return TimerRequest{pid, scope, expiration, signal};
}

TEST(TimerTableTest, ExpiresEachWorkerOnceWithItsEarliestSignal) {
  TimerTable table;
  table.Apply(Timer(10, "outer", 100, 15));
  table.Apply(Timer(10, "inner", 90, 9));
  table.Apply(Timer(20, "step", 200));
  EXPECT_EQ(table.NextExpiration(), 90);
  EXPECT_TRUE(table.TakeExpired(89.9).empty());

  auto expired = table.TakeExpired(150);
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0].pid, 10);
  EXPECT_EQ(expired[0].scope_id, "inner");
  EXPECT_EQ(expired[0].signal, 9);
  EXPECT_DOUBLE_EQ(expired[0].overdue_s, 60);
  EXPECT_EQ(table.size(), 1u);  // both of pid 10's timers went
  EXPECT_EQ(table.NextExpiration(), 200);
}

TEST(TimerTableTest, ReleaseAndRenewal) {
  TimerTable table;
  table.Apply(Timer(10, "step", 100));
  table.Apply(Timer(10, "step", 300));  // renewed: replaces
  EXPECT_TRUE(table.TakeExpired(200).empty());
  table.Apply(Timer(10, "step", -1, 0));  // released
  EXPECT_EQ(table.size(), 0u);
  EXPECT_FALSE(table.NextExpiration().has_value());
  table.Apply(Timer(11, "other", -1, 0));  // releasing nothing is fine
  EXPECT_EQ(table.size(), 0u);
}

TEST(TimerTableTest, ATimerWithoutASignalExpiresWithoutKilling) {
  TimerTable table;
  table.Apply(Timer(10, "quiet", 100, 0));
  auto expired = table.TakeExpired(100);
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0].signal, 0);
  EXPECT_EQ(table.size(), 0u);
}

TEST(TimerTableTest, AnEndedWorkersTimersAreForgotten) {
  TimerTable table;
  table.Apply(Timer(10, "a", 100));
  table.Apply(Timer(10, "b", 100));
  table.Apply(Timer(11, "a", 100));
  table.Forget(10);
  auto expired = table.TakeExpired(1000);
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0].pid, 11);
}

TEST(TimerTableTest, ExpiredWorkersComeEarliestFirst) {
  TimerTable table;
  table.Apply(Timer(30, "s", 50));
  table.Apply(Timer(10, "s", 70));
  table.Apply(Timer(20, "s", 60));
  auto expired = table.TakeExpired(100);
  ASSERT_EQ(expired.size(), 3u);
  EXPECT_EQ(expired[0].pid, 30);
  EXPECT_EQ(expired[1].pid, 20);
  EXPECT_EQ(expired[2].pid, 10);
}

}  // namespace
}  // namespace meshrun::agent
