#include "agent/bounded_command.h"

#include <signal.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <string>
#include <thread>

#include "gtest/gtest.h"
#include "tests/support/temp_dir.h"

namespace meshrun::agent {
namespace {

using std::chrono::seconds;
using Clock = std::chrono::steady_clock;

// Generous for a loaded 2-core machine; the bug held each run to its
// command's own end (30 s).
constexpr auto kBound = seconds(15);

bool Alive(pid_t pid) { return kill(pid, 0) == 0; }

pid_t ReadPid(const std::string& file) {
  pid_t pid = 0;
  std::ifstream(file) >> pid;
  return pid;
}

TEST(BoundedCommandTest, OutputAndExitCode) {
  CommandResult result =
      RunBounded({"/bin/sh", "-c", "echo out; echo err >&2; exit 3"}, seconds(10),
                 /*merge_stderr=*/true, 1024);
  EXPECT_TRUE(result.started);
  EXPECT_FALSE(result.timed_out);
  EXPECT_EQ(result.exit_code, 3);
  EXPECT_EQ(result.output, "out\nerr\n");
  EXPECT_EQ(result.Outcome(seconds(10)), "exit 3");
}

TEST(BoundedCommandTest, OnlyTheLastOutputIsKept) {
  CommandResult result = RunBounded({"/bin/sh", "-c", "seq 1 10000"}, seconds(10),
                                    /*merge_stderr=*/false, 7);
  EXPECT_TRUE(result.ok());
  EXPECT_EQ(result.output, "\n10000\n");
}

// Issue 44 item 4: the command closes its stdout, then hangs. The bound
// covers its exit too, not only its output; its process group (what it
// started) is killed with it.
TEST(BoundedCommandTest, ACommandThatClosesItsOutputAndHangsIsBounded) {
  meshrun::testing::TempDir dir("bounded-command");
  const std::string pid_file = dir / "child.pid";
  const auto start = Clock::now();
  CommandResult result = RunBounded(
      {"/bin/sh", "-c",
       "echo before; exec >&- 2>&-; sleep 30 & echo $! > " + pid_file + "; sleep 30"},
      seconds(2), /*merge_stderr=*/true, 1024);
  const auto took = Clock::now() - start;
  EXPECT_TRUE(result.started);
  EXPECT_TRUE(result.timed_out);
  EXPECT_EQ(result.Outcome(seconds(2)), "took over 2 s");
  EXPECT_EQ(result.output, "before\n");
  EXPECT_GE(took, seconds(2));
  EXPECT_LT(took, kBound);
  const pid_t child = ReadPid(pid_file);
  ASSERT_GT(child, 0);
  // SIGKILLed with the group; the test process reaps nothing of it (it is
  // the shell's orphan, reparented), so wait for it to go, bounded.
  const auto deadline = Clock::now() + kBound;
  while (Alive(child) && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(Alive(child)) << "the command's own child outlived the bound";
}

TEST(BoundedCommandTest, CancellingEndsACommandThatClosedItsOutput) {
  std::atomic<bool> cancel{false};
  std::thread canceller([&cancel] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    cancel = true;
  });
  const auto start = Clock::now();
  CommandResult result = RunBounded({"/bin/sh", "-c", "exec >&- 2>&-; sleep 30"},
                                    seconds(60), /*merge_stderr=*/true, 1024, &cancel);
  canceller.join();
  EXPECT_TRUE(result.cancelled);
  EXPECT_EQ(result.Outcome(seconds(60)), "cancelled");
  EXPECT_LT(Clock::now() - start, kBound);
}

// The command has exited; something it left holds the output: still the
// bound, and that process is killed with the group.
TEST(BoundedCommandTest, OutputHeldAfterTheCommandExitedIsBounded) {
  const auto start = Clock::now();
  CommandResult result = RunBounded({"/bin/sh", "-c", "sleep 30 & exit 0"}, seconds(2),
                                    /*merge_stderr=*/false, 1024);
  EXPECT_TRUE(result.timed_out);
  EXPECT_LT(Clock::now() - start, kBound);
}

TEST(BoundedCommandTest, AMissingProgramDoesNotStart) {
  CommandResult result =
      RunBounded({"/nonexistent/program"}, seconds(2), /*merge_stderr=*/false, 1024);
  EXPECT_FALSE(result.started);
  EXPECT_NE(result.Outcome(seconds(2)).find("cannot start /nonexistent/program"),
            std::string::npos)
      << result.Outcome(seconds(2));
}

}  // namespace
}  // namespace meshrun::agent
