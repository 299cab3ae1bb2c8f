#include "agent/stack_dump.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "agent/dump_helper.h"
#include "gtest/gtest.h"
#include "tests/support/temp_dir.h"

namespace meshrun::agent {
namespace {

using std::chrono::seconds;
using Clock = std::chrono::steady_clock;

constexpr auto kBound = seconds(15);  // for a loaded 2-core machine

// Runs in `dir` while it lives.
class InDirectory {
 public:
  explicit InDirectory(const std::string& dir) : saved_(std::filesystem::current_path()) {
    std::filesystem::current_path(dir);
  }
  ~InDirectory() { std::filesystem::current_path(saved_); }

 private:
  std::filesystem::path saved_;
};

// Issue 44 item 9: an empty PATH entry is the working directory to execvp;
// the agent must never pick a py-spy or gdb from there (nor from a relative
// entry, which is under it).
TEST(StackDumpTest, FindOnPathSkipsEmptyAndRelativeEntries) {
  meshrun::testing::TempDir work("find-on-path");
  meshrun::testing::TempDir tools("find-on-path-tools");
  std::filesystem::create_directories(work / "bin");
  work.Write("py-spy", "#!/bin/sh\n", 0755);
  work.Write("bin/py-spy", "#!/bin/sh\n", 0755);
  InDirectory in(work.path());
  EXPECT_EQ(FindOnPath("py-spy", ""), "");
  EXPECT_EQ(FindOnPath("py-spy", ":/nonexistent"), "");
  EXPECT_EQ(FindOnPath("py-spy", "/nonexistent:"), "");
  EXPECT_EQ(FindOnPath("py-spy", "/nonexistent::/also-not"), "");
  EXPECT_EQ(FindOnPath("py-spy", "."), "");
  EXPECT_EQ(FindOnPath("py-spy", "bin:./bin"), "");
  // An absolute entry still counts, wherever it is among the others.
  tools.Write("py-spy", "#!/bin/sh\n", 0755);
  EXPECT_EQ(FindOnPath("py-spy", absl::StrCat("::bin:", tools.path())), tools / "py-spy");
  // Not executable, or a directory: skipped.
  tools.Write("gdb", "#!/bin/sh\n", 0644);
  std::filesystem::create_directories(tools / "ls");
  EXPECT_EQ(FindOnPath("gdb", tools.path()), "");
  EXPECT_EQ(
      FindOnPath("ls", absl::StrCat(tools.path(), ":/bin:/usr/bin")).find(tools.path()),
      std::string::npos);
}

TEST(StackDumpTest, FindStackToolsIgnoresTheWorkingDirectory) {
  meshrun::testing::TempDir work("find-stack-tools");
  work.Write("py-spy", "#!/bin/sh\n", 0755);
  work.Write("gdb", "#!/bin/sh\n", 0755);
  InDirectory in(work.path());
  const char* saved = getenv("PATH");
  const std::string path = saved != nullptr ? saved : "";
  setenv("PATH", absl::StrCat(":", path, ":").c_str(), 1);
  StackTools tools = FindStackTools({"python3"});
  setenv("PATH", path.c_str(), 1);
  EXPECT_EQ(tools.py_spy.find(work.path()), std::string::npos) << tools.py_spy;
  EXPECT_NE(tools.py_spy, "./py-spy");
  EXPECT_EQ(tools.gdb.find(work.path()), std::string::npos) << tools.gdb;
  EXPECT_NE(tools.gdb, "./gdb");
}

std::unique_ptr<DumpHelper> StartHelper() {
  auto helper = DumpHelper::Start(MESHRUN_DUMP_HELPER);
  EXPECT_TRUE(helper.ok()) << helper.status();
  return helper.ok() ? std::move(*helper) : nullptr;
}

// The dumpers run as the helper's children: the process the workers name
// with PR_SET_PTRACER, which is not the agent (whose descendants include
// every worker).
TEST(DumpHelperTest, RunsCommandsAsItsChildren) {
  std::unique_ptr<DumpHelper> helper = StartHelper();
  ASSERT_NE(helper, nullptr);
  EXPECT_NE(helper->pid(), getpid());
  CommandResult result =
      helper->Run({"/bin/sh", "-c", "echo out; echo err >&2; echo $PPID; exit 4"},
                  seconds(10), /*merge_stderr=*/false, 1024);
  EXPECT_TRUE(result.started);
  EXPECT_EQ(result.exit_code, 4);
  EXPECT_EQ(result.output, absl::StrCat("out\n", helper->pid(), "\n"));
  // Again, merged: one helper serves many dumps.
  result = helper->Run({"/bin/sh", "-c", "echo out; echo err >&2"}, seconds(10),
                       /*merge_stderr=*/true, 1024);
  EXPECT_TRUE(result.ok());
  EXPECT_EQ(result.output, "out\nerr\n");
  result = helper->Run({"/nonexistent/py-spy"}, seconds(10), false, 1024);
  EXPECT_FALSE(result.started);
  EXPECT_NE(result.error.find("cannot start /nonexistent/py-spy"), std::string::npos)
      << result.error;
}

TEST(DumpHelperTest, ItsCommandsAreBounded) {
  std::unique_ptr<DumpHelper> helper = StartHelper();
  ASSERT_NE(helper, nullptr);
  const auto start = Clock::now();
  CommandResult result = helper->Run({"/bin/sh", "-c", "exec >&- 2>&-; sleep 30"},
                                     seconds(1), /*merge_stderr=*/false, 1024);
  EXPECT_TRUE(result.timed_out);
  EXPECT_LT(Clock::now() - start, kBound);
}

TEST(DumpHelperTest, CancellingEndsTheHelperAndItsCommand) {
  std::unique_ptr<DumpHelper> helper = StartHelper();
  ASSERT_NE(helper, nullptr);
  std::atomic<bool> cancel{false};
  std::thread canceller([&cancel] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    cancel = true;
  });
  const auto start = Clock::now();
  CommandResult result = helper->Run({"/bin/sh", "-c", "sleep 30"}, seconds(60),
                                     /*merge_stderr=*/false, 1024, &cancel);
  canceller.join();
  EXPECT_TRUE(result.cancelled);
  EXPECT_LT(Clock::now() - start, kBound);
  result = helper->Run({"/bin/true"}, seconds(10), false, 1024);
  EXPECT_FALSE(result.started);
  // The destructor reaps it: bounded, it has been told to end.
  helper.reset();
  EXPECT_LT(Clock::now() - start, kBound);
}

TEST(DumpHelperTest, DumpStacksThroughTheHelper) {
  std::unique_ptr<DumpHelper> helper = StartHelper();
  ASSERT_NE(helper, nullptr);
  const pid_t sleeper = fork();
  ASSERT_GE(sleeper, 0);
  if (sleeper == 0) {
    execl("/bin/sleep", "sleep", "30", nullptr);
    _exit(127);
  }
  // A fake py-spy that shows what it was asked and by whom.
  meshrun::testing::TempDir tools("dump-stacks");
  const std::string py_spy =
      tools.Write("py-spy", "#!/bin/sh\necho \"frames of $3, dumped by $PPID\"\n", 0755);
  const std::string dump =
      DumpStacks(sleeper, {py_spy, ""}, seconds(10), nullptr, helper.get());
  kill(sleeper, SIGKILL);
  waitpid(sleeper, nullptr, 0);
  EXPECT_EQ(dump, absl::StrCat("Python stacks (py-spy dump):\nframes of ", sleeper,
                               ", dumped by ", helper->pid(), "\n"));
}

}  // namespace
}  // namespace meshrun::agent
