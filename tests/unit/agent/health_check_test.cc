#include "agent/health_check.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

namespace meshrun::agent {
namespace {

namespace fs = std::filesystem;
using std::chrono::seconds;

TEST(HealthCheckTest, PassingChecksPass) {
  EXPECT_FALSE(RunHealthChecks({"true", "exit 0", "test 1 -eq 1"}, seconds(10)));
  EXPECT_FALSE(RunHealthChecks({}, seconds(10)));
}

TEST(HealthCheckTest, TheFirstFailingCheckIsNamedWithItsOutput) {
  auto failure = RunHealthChecks(
      {"true", "echo checking; echo 'disk full' >&2; exit 3", "false"}, seconds(10));
  ASSERT_TRUE(failure);
  EXPECT_EQ(failure->check, "echo checking; echo 'disk full' >&2; exit 3");
  EXPECT_EQ(failure->outcome, "exit 3");
  EXPECT_EQ(failure->output, "checking\ndisk full\n");
  EXPECT_EQ(failure->Summary(),
            "health check 'echo checking; echo 'disk full' >&2; exit 3' failed (exit 3): "
            "disk full");
}

TEST(HealthCheckTest, AHangingCheckFailsAtItsTimeoutWithWhatItStarted) {
  const auto start = std::chrono::steady_clock::now();
  // The shell's child holds the output pipe too: it is ended with the group.
  auto failure = RunHealthChecks({"sleep 30 & sleep 30"}, seconds(1));
  ASSERT_TRUE(failure);
  EXPECT_EQ(failure->outcome, "took over 1 s");
  EXPECT_LT(std::chrono::steady_clock::now() - start, seconds(20));
}

TEST(HealthCheckTest, CancellingEndsTheRunningCheckAndTheRest) {
  std::atomic<bool> cancel{false};
  const auto start = std::chrono::steady_clock::now();
  std::thread canceller([&cancel] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    cancel = true;
  });
  // The second check would fail, but is never run.
  auto failure = RunHealthChecks({"sleep 30 & sleep 30", "false"}, seconds(60), &cancel);
  canceller.join();
  EXPECT_FALSE(failure);
  EXPECT_LT(std::chrono::steady_clock::now() - start, seconds(20));
  // Already cancelled: nothing runs.
  EXPECT_FALSE(RunHealthChecks({"false"}, seconds(10), &cancel));
}

TEST(HealthCheckTest, ACrashingCheckSaysBySignal) {
  auto failure = RunHealthChecks({"kill -SEGV $$"}, seconds(10));
  ASSERT_TRUE(failure);
  EXPECT_EQ(failure->outcome, "killed by SIGSEGV");
}

TEST(HealthCheckTest, ADirectorysExecutablesInNameOrder) {
  const fs::path dir = fs::path(testing::TempDir()) / "health-checks-test";
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const char* name : {"20-disk", "10-gpu", ".hidden", "30-clock~", "README"}) {
    std::ofstream(dir / name) << "#!/bin/sh\nexit 0\n";
    if (std::string(name) != "README") chmod((dir / name).c_str(), 0755);
  }
  auto checks = HealthChecksIn(dir.string());
  ASSERT_TRUE(checks.ok()) << checks.status();
  EXPECT_EQ(*checks, (std::vector<std::string>{(dir / "10-gpu").string(),
                                               (dir / "20-disk").string()}));
  EXPECT_FALSE(RunHealthChecks(*checks, seconds(10)));
  fs::remove_all(dir);
  EXPECT_FALSE(HealthChecksIn(dir.string()).ok());
}

}  // namespace
}  // namespace meshrun::agent
