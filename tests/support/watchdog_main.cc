// The tests' main: gtest's, plus a watchdog for a test that hangs. ctest's
// TIMEOUT kills such a test with no word of where it stood (a CI run lost
// that way shows only "[ RUN ]"). With MESHRUN_TEST_WATCHDOG_S set (ctest
// sets it a little under each test's TIMEOUT), a test still running after
// that many seconds is reported: its name, the state of this process and of
// each process below it, and, where gdb is installed, the stacks of every
// thread of the first few; then those processes are killed and the test
// binary aborts.

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace {

using Clock = std::chrono::steady_clock;

// Every process below `pid`: its children, theirs, and so on.
std::vector<pid_t> DescendantsOf(pid_t pid) {
  std::vector<pid_t> found;
  std::error_code ec;
  const std::string tasks = "/proc/" + std::to_string(pid) + "/task";
  for (const auto& task : std::filesystem::directory_iterator(tasks, ec)) {
    std::ifstream list(task.path() / "children");
    for (pid_t child; list >> child;) {
      found.push_back(child);
      for (pid_t below : DescendantsOf(child)) found.push_back(below);
    }
  }
  return found;
}

// "R (running)", "S (sleeping)", "T (stopped)": a stopped process is a finding.
std::string StateOf(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string name, state;
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("Name:", 0) == 0) name = line.substr(5);
    if (line.rfind("State:", 0) == 0) state = line.substr(6);
  }
  return name + " " + state;
}

void PrintState(pid_t pid) {
  std::fprintf(stderr, "watchdog: pid %d:%s\n", pid, StateOf(pid).c_str());
  std::fflush(stderr);
}

void PrintStacks(pid_t pid) {
  if (access("/usr/bin/gdb", X_OK) != 0) return;
  std::fprintf(stderr, "watchdog: stacks of pid %d\n", pid);
  std::fflush(stderr);
  const std::string command = "timeout 20 /usr/bin/gdb -batch -nx -p " +
                              std::to_string(pid) +
                              " -ex 'thread apply all bt' 1>&2 2>/dev/null";
  if (std::system(command.c_str()) != 0)
    std::fprintf(stderr, "watchdog: gdb could not read pid %d\n", pid);
}

// What the watchdog's thread reads. Never freed: gtest destroys its
// listeners at exit, while the detached thread still runs.
struct WatchState {
  explicit WatchState(std::chrono::seconds seconds) : limit(seconds) {}
  const std::chrono::seconds limit;
  std::mutex mu;
  std::condition_variable wake;  // only for its timed wait
  std::string test;              // guarded by mu, as the two below
  Clock::time_point started;
  bool running = false;
};

constexpr size_t kMostStacks = 5;

void Watch(WatchState* state) {
  std::unique_lock<std::mutex> lock(state->mu);
  while (true) {
    state->wake.wait_for(lock, std::chrono::seconds(1));
    if (!state->running || Clock::now() - state->started < state->limit) continue;
    const std::string test = state->test;
    lock.unlock();
    std::fprintf(stderr,
                 "watchdog: %s still running after %lld s; stacks follow, then abort\n",
                 test.c_str(), static_cast<long long>(state->limit.count()));
    std::fflush(stderr);
    const std::vector<pid_t> below = DescendantsOf(getpid());
    PrintState(getpid());
    for (pid_t pid : below) PrintState(pid);
    // The test and the first few below it (gdb takes seconds a process).
    PrintStacks(getpid());
    for (size_t i = 0; i < below.size() && i < kMostStacks; ++i) PrintStacks(below[i]);
    // None is left behind holding ctest's output pipe open, including those
    // the test started while gdb read the stacks.
    for (pid_t pid : below) kill(pid, SIGKILL);
    for (pid_t pid : DescendantsOf(getpid())) kill(pid, SIGKILL);
    std::abort();
  }
}

class Watchdog : public testing::EmptyTestEventListener {
 public:
  explicit Watchdog(WatchState* state) : state_(state) {
    std::thread(Watch, state_).detach();  // lives as long as the process
  }
  void OnTestStart(const testing::TestInfo& info) override {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->test = std::string(info.test_suite_name()) + "." + info.name();
    state_->started = Clock::now();
    state_->running = true;
  }
  void OnTestEnd(const testing::TestInfo&) override {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->running = false;
  }

 private:
  WatchState* state_;
};

}  // namespace

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  if (const char* limit = std::getenv("MESHRUN_TEST_WATCHDOG_S")) {
    const long seconds = std::strtol(limit, nullptr, 10);
    if (seconds > 0) {
      static WatchState* const state = new WatchState(std::chrono::seconds(seconds));
      testing::UnitTest::GetInstance()->listeners().Append(new Watchdog(state));
    }
  }
  return RUN_ALL_TESTS();
}
