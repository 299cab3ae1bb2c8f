#include "agent/worker_group.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/io_context.hpp>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/support/child_process.h"

namespace meshrun::agent {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using SteadyClock = std::chrono::steady_clock;

constexpr seconds kDeadline{20};

// Everything written to `fd` so far (a memfd).
std::string Contents(int fd) {
  std::string result;
  char chunk[65536];
  off_t offset = 0;
  while (true) {
    ssize_t n = ::pread(fd, chunk, sizeof chunk, offset);
    if (n <= 0) break;
    result.append(chunk, static_cast<size_t>(n));
    offset += n;
  }
  return result;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

void WriteFile(const std::string& path, const std::string& text, mode_t mode = 0644) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << text;
  ::chmod(path.c_str(), mode);
}

// The non-empty lines of `text`.
std::vector<std::string> SplitLines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) lines.push_back(line);
  }
  return lines;
}

// The lines of `text` that start with `prefix`, without it.
std::vector<std::string> LinesOf(const std::string& text, const std::string& prefix) {
  std::vector<std::string> lines;
  for (const std::string& line : SplitLines(text)) {
    if (line.compare(0, prefix.size(), prefix) == 0)
      lines.push_back(line.substr(prefix.size()));
  }
  return lines;
}

// Waits until `pid` (any process, not only a child) has terminated, and reaps
// it if it is ours. pidfd readiness is the condition itself, no polling.
bool WaitGone(pid_t pid, milliseconds timeout) {
  int fd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (fd < 0) return errno == ESRCH;
  pollfd pfd{fd, POLLIN, 0};
  int ready;
  do {
    ready = ::poll(&pfd, 1, static_cast<int>(timeout.count()));
  } while (ready < 0 && errno == EINTR);
  ::close(fd);
  if (ready == 1) ::waitpid(pid, nullptr, WNOHANG);  // ours only as a subreaper
  return ready == 1;
}

bool Gone(pid_t pid) { return ::kill(pid, 0) == -1 && errno == ESRCH; }

// Shell code that starts `sleep` in a session of its own (so outside the
// worker's process group), prints its pid once it is there, and goes on.
std::string EscapedSleep(const std::string& fifo) {
  return absl::StrCat("mkfifo ", fifo, "; setsid sh -c 'echo $$ > ", fifo,
                      "; exec sleep 1000' & read pid < ", fifo, "; echo $pid; ");
}

WorkerSpec Shell(int local_rank, const std::string& script) {
  WorkerSpec spec;
  spec.local_rank = local_rank;
  spec.global_rank = 100 + local_rank;
  spec.argv = {"/bin/sh", "-c", script};
  spec.console_prefix = absl::StrCat("[default", local_rank, "]:");
  return spec;
}

class WorkerGroupTest : public ::testing::Test {
 protected:
  void SetUp() override {
    out_fd_ = ::memfd_create("console-out", MFD_CLOEXEC);
    err_fd_ = ::memfd_create("console-err", MFD_CLOEXEC);
    ASSERT_GE(out_fd_, 0);
    ASSERT_GE(err_fd_, 0);
    console_ = std::make_unique<ConsoleWriter>(out_fd_, err_fd_);
    std::string pattern =
        (std::filesystem::temp_directory_path() / "worker_group_test-XXXXXX");
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }

  void TearDown() override {
    group_.reset();
    for (pid_t pid : workers_started_) EXPECT_TRUE(Gone(pid)) << "worker " << pid;
    for (pid_t pid : others_)
      EXPECT_TRUE(WaitGone(pid, seconds(10))) << "process " << pid;
    ::close(out_fd_);
    ::close(err_fd_);
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }

  WorkerGroup& MakeGroup(WorkerGroupOptions options = {}) {
    options.console = console_.get();
    group_ = std::make_unique<WorkerGroup>(
        io_,
        [this](const WorkerExit& exit) {
          exits_.push_back(exit);
          if (on_exit_) on_exit_(exit);
        },
        options);
    return *group_;
  }

  absl::Status Start(std::vector<WorkerSpec> specs) {
    absl::Status status = group_->Start(std::move(specs));
    for (pid_t pid : group_->pids()) workers_started_.push_back(pid);
    return status;
  }

  // Runs io_ until `condition` holds or the deadline passes.
  bool RunUntil(const std::function<bool()>& condition, seconds timeout = kDeadline) {
    const auto deadline = SteadyClock::now() + timeout;
    while (!condition()) {
      if (SteadyClock::now() >= deadline) return false;
      if (io_.run_one_until(deadline) == 0 && io_.stopped()) io_.restart();
    }
    return true;
  }

  bool RunUntilExits(size_t count) {
    return RunUntil([&] { return exits_.size() >= count; });
  }

  std::string Out() const { return Contents(out_fd_); }
  std::string Err() const { return Contents(err_fd_); }

  // The one exit reported for `local_rank`; when there is none or several, a
  // test failure and an exit with code -99.
  WorkerExit ExitOf(int local_rank) const {
    std::vector<WorkerExit> found;
    for (const WorkerExit& exit : exits_) {
      if (exit.local_rank == local_rank) found.push_back(exit);
    }
    if (found.size() == 1) return found[0];
    ADD_FAILURE() << found.size() << " exits for local rank " << local_rank;
    WorkerExit none;
    none.exit_code = -99;
    return none;
  }

  boost::asio::io_context io_;
  int out_fd_ = -1;
  int err_fd_ = -1;
  std::unique_ptr<ConsoleWriter> console_;
  std::string dir_;
  std::unique_ptr<WorkerGroup> group_;
  std::vector<WorkerExit> exits_;
  std::function<void(const WorkerExit&)> on_exit_;
  std::vector<pid_t> workers_started_;
  std::vector<pid_t> others_;  // grandchildren etc., checked with WaitGone
};

TEST_F(WorkerGroupTest, ReportsExitCodesAndSignals) {
  MakeGroup();
  const auto before = std::chrono::system_clock::now();
  ASSERT_TRUE(Start({Shell(0, "exit 0"), Shell(1, "exit 3"), Shell(2, "kill -KILL $$"),
                     Shell(3, "kill -TERM $$")})
                  .ok());
  const std::vector<pid_t> pids = group_->pids();
  ASSERT_EQ(pids.size(), 4u);
  ASSERT_TRUE(RunUntilExits(4));
  EXPECT_EQ(group_->live(), 0u);
  EXPECT_TRUE(group_->pids().empty());

  const int expected_code[] = {0, 3, -1, -1};
  const int expected_signal[] = {0, 0, SIGKILL, SIGTERM};
  for (int rank = 0; rank < 4; ++rank) {
    const WorkerExit exit = ExitOf(rank);
    EXPECT_EQ(exit.global_rank, 100 + rank);
    EXPECT_EQ(exit.pid, pids[rank]);
    EXPECT_EQ(exit.exit_code, expected_code[rank]) << rank;
    EXPECT_EQ(exit.signal, expected_signal[rank]) << rank;
    EXPECT_GE(exit.when, before);
    EXPECT_LE(exit.when, std::chrono::system_clock::now());
  }
}

TEST_F(WorkerGroupTest, SignalWorkerReachesOnlyItsOwnUnreapedWorkers) {
  MakeGroup();
  ASSERT_TRUE(Start({Shell(0, "exec sleep 60"), Shell(1, "exec sleep 60")}).ok());
  const std::vector<pid_t> pids = group_->pids();
  ASSERT_EQ(pids.size(), 2u);
  EXPECT_EQ(group_->SignalWorker(::getpid(), SIGKILL), std::nullopt);  // not a worker
  EXPECT_EQ(group_->SignalWorker(pids[1], SIGKILL), 1);
  ASSERT_TRUE(RunUntilExits(1));
  EXPECT_EQ(ExitOf(1).signal, SIGKILL);
  EXPECT_EQ(group_->SignalWorker(pids[1], SIGKILL), std::nullopt);  // reaped
  EXPECT_EQ(group_->live(), 1u);
  EXPECT_EQ(group_->SignalWorker(pids[0], SIGTERM), 0);
  ASSERT_TRUE(RunUntilExits(2));
  EXPECT_EQ(ExitOf(0).signal, SIGTERM);
}

TEST_F(WorkerGroupTest, ConsoleLinesArePrefixedPerStream) {
  MakeGroup();
  ASSERT_TRUE(Start({Shell(0, "echo hello; printf world; echo oops >&2"),
                     Shell(1, "printf 'a\\n\\nb\\n'")})
                  .ok());
  ASSERT_TRUE(RunUntilExits(2));
  EXPECT_EQ(LinesOf(Out(), "[default0]:"), (std::vector<std::string>{"hello", "world"}));
  EXPECT_EQ(LinesOf(Err(), "[default0]:"), (std::vector<std::string>{"oops"}));
  // An empty line is still a (prefixed) line.
  EXPECT_NE(Out().find("[default1]:a\n[default1]:\n[default1]:b\n"), std::string::npos)
      << Out();
  EXPECT_EQ(LinesOf(Err(), "[default1]:").size(), 0u);
  // Every console line carries a prefix; the partial last line got its '\n'.
  for (const std::string& text : {Out(), Err()}) {
    ASSERT_FALSE(text.empty());
    EXPECT_EQ(text.back(), '\n');
    for (const std::string& line : SplitLines(text))
      EXPECT_EQ(line.substr(0, 8), "[default") << line;
  }
}

TEST_F(WorkerGroupTest, StreamsGoToFilesRawAndAppended) {
  MakeGroup();
  const std::string out_file = dir_ + "/logs/attempt_0/0/stdout.log";
  const std::string err_file = dir_ + "/logs/attempt_0/0/stderr.log";
  WriteFile(err_file, "earlier\n");
  WorkerSpec teed = Shell(0, "echo out1; printf out2; echo err1 >&2");
  teed.stdout_to_console = false;
  teed.stdout_file = out_file;
  teed.stderr_file = err_file;  // and the console
  WorkerSpec silent = Shell(1, "echo nowhere; echo nowhere >&2; exit 4");
  silent.stdout_to_console = false;
  silent.stderr_to_console = false;
  ASSERT_TRUE(Start({teed, silent}).ok());
  ASSERT_TRUE(RunUntilExits(2));

  EXPECT_EQ(ReadFile(out_file), "out1\nout2");
  EXPECT_EQ(ReadFile(err_file), "earlier\nerr1\n");
  EXPECT_EQ(Out(), "");
  EXPECT_EQ(Err(), "[default0]:err1\n");
  EXPECT_EQ(ExitOf(1).exit_code, 4);
}

TEST_F(WorkerGroupTest, EnvironmentIsSetOnTopOfTheAgents) {
  ::setenv("MESHRUN_WG_INHERITED", "from-agent", 1);
  ::setenv("MESHRUN_WG_OVERRIDDEN", "agent", 1);
  MakeGroup();
  WorkerSpec spec =
      Shell(0,
            "printf '%s|%s|%s\\n' \"$MESHRUN_WG_INHERITED\" \"$MESHRUN_WG_OVERRIDDEN\" "
            "\"$MESHRUN_WG_NEW\"; env | grep -c '^MESHRUN_WG_OVERRIDDEN='");
  spec.env = {{"MESHRUN_WG_OVERRIDDEN", "worker"}, {"MESHRUN_WG_NEW", "a b=c 'd'"}};
  ASSERT_TRUE(Start({spec}).ok());
  ASSERT_TRUE(RunUntilExits(1));
  ::unsetenv("MESHRUN_WG_INHERITED");
  ::unsetenv("MESHRUN_WG_OVERRIDDEN");
  EXPECT_EQ(LinesOf(Out(), "[default0]:"),
            (std::vector<std::string>{"from-agent|worker|a b=c 'd'", "1"}));
}

TEST_F(WorkerGroupTest, ArgvIsPassedUntouched) {
  MakeGroup();
  WorkerSpec spec;
  spec.console_prefix = "[default0]:";
  spec.argv = {
      "/bin/sh",   "-c",          "for a in \"$@\"; do printf '<%s>\\n' \"$a\"; done",
      "argv0",     "a b",         "",
      "'single'",  "\"double\"",  "$HOME",
      "*",         "back\\slash", "  padded  ",
      "two\nlines"};
  ASSERT_TRUE(Start({spec}).ok());
  ASSERT_TRUE(RunUntilExits(1));
  EXPECT_EQ(LinesOf(Out(), "[default0]:"),
            (std::vector<std::string>{"<a b>", "<>", "<'single'>", "<\"double\">",
                                      "<$HOME>", "<*>", "<back\\slash>", "<  padded  >",
                                      "<two", "lines>"}));
  EXPECT_EQ(ExitOf(0).exit_code, 0);
}

TEST_F(WorkerGroupTest, ProgramIsLookedUpInTheWorkersPath) {
  MakeGroup();
  WriteFile(dir_ + "/denied/meshrun-wg-tool", "#!/bin/sh\necho wrong one\n", 0644);
  WriteFile(dir_ + "/bin/meshrun-wg-tool", "#!/bin/sh\necho tool \"$@\"\n", 0755);

  WorkerSpec from_agent_path = Shell(0, "");
  from_agent_path.argv = {"sh", "-c", "echo via-path"};
  WorkerSpec from_worker_path = Shell(1, "");
  from_worker_path.argv = {"meshrun-wg-tool", "x y"};
  // As execvp: a non-executable match is skipped for a later executable one.
  from_worker_path.env = {{"PATH", dir_ + "/denied:" + dir_ + "/bin:/usr/bin:/bin"}};
  ASSERT_TRUE(Start({from_agent_path, from_worker_path}).ok());
  ASSERT_TRUE(RunUntilExits(2));
  EXPECT_EQ(LinesOf(Out(), "[default0]:"), (std::vector<std::string>{"via-path"}));
  EXPECT_EQ(LinesOf(Out(), "[default1]:"), (std::vector<std::string>{"tool x y"}));
  EXPECT_EQ(Err(), "");
}

TEST_F(WorkerGroupTest, ExecFailureIsReportedLikeAShell) {
  MakeGroup();
  WriteFile(dir_ + "/not-executable", "#!/bin/sh\necho no\n", 0644);
  WorkerSpec not_found = Shell(0, "");
  not_found.argv = {"meshrun-no-such-program", "arg"};
  WorkerSpec missing_path = Shell(1, "");
  missing_path.argv = {dir_ + "/missing"};
  WorkerSpec denied = Shell(2, "");
  denied.argv = {dir_ + "/not-executable"};
  WorkerSpec fine = Shell(3, "echo still-started");
  ASSERT_TRUE(Start({not_found, missing_path, denied, fine}).ok());
  ASSERT_TRUE(RunUntilExits(4));

  EXPECT_EQ(ExitOf(0).exit_code, 127);
  EXPECT_EQ(ExitOf(1).exit_code, 127);
  EXPECT_EQ(ExitOf(2).exit_code, 126);
  EXPECT_EQ(ExitOf(3).exit_code, 0);
  const std::string err = Err();
  EXPECT_NE(
      err.find("[default0]:meshrun: cannot execute 'meshrun-no-such-program': No such "
               "file or directory\n"),
      std::string::npos)
      << err;
  EXPECT_NE(err.find(absl::StrCat("[default1]:meshrun: cannot execute '", dir_,
                                  "/missing': No such file or directory\n")),
            std::string::npos)
      << err;
  EXPECT_NE(err.find(absl::StrCat("[default2]:meshrun: cannot execute '", dir_,
                                  "/not-executable': Permission denied\n")),
            std::string::npos)
      << err;
  EXPECT_EQ(LinesOf(Out(), "[default3]:"), (std::vector<std::string>{"still-started"}));
}

TEST_F(WorkerGroupTest, StopEscalatesToSigkillAfterGrace) {
  MakeGroup();
  ASSERT_TRUE(Start({Shell(0, "trap '' TERM; echo ready; sleep 100"),
                     Shell(1, "echo ready; exec sleep 100")})
                  .ok());
  ASSERT_TRUE(RunUntil([&] { return LinesOf(Out(), "[default").size() == 2; }));

  bool done = false;
  size_t exits_at_done = 0;
  const auto stop_at = SteadyClock::now();
  SteadyClock::time_point done_at;
  group_->Stop(SIGTERM, milliseconds(500), [&] {
    done = true;
    exits_at_done = exits_.size();
    done_at = SteadyClock::now();
  });
  EXPECT_FALSE(done);  // posted, never run from inside Stop
  ASSERT_TRUE(RunUntil([&] { return done; }));
  EXPECT_EQ(exits_at_done, 2u);
  EXPECT_GE(done_at - stop_at, milliseconds(500));
  EXPECT_EQ(ExitOf(0).signal, SIGKILL);
  EXPECT_EQ(ExitOf(0).exit_code, -1);
  EXPECT_EQ(ExitOf(1).signal, SIGTERM);
  EXPECT_EQ(group_->live(), 0u);
}

TEST_F(WorkerGroupTest, StopKillsTheWholeProcessGroup) {
  MakeGroup();
  // Rank 0's background child ignores SIGTERM (it prints its pid only once
  // it does) and keeps the output pipes open after its parent died; rank 1's
  // obeys.
  ASSERT_TRUE(
      Start({Shell(0, "(trap '' TERM; exec sh -c 'echo $$; exec sleep 100') & wait"),
             Shell(1, "sleep 100 & echo $!; wait")})
          .ok());
  ASSERT_TRUE(RunUntil([&] { return LinesOf(Out(), "[default").size() == 2; }));
  for (int rank = 0; rank < 2; ++rank) {
    auto lines = LinesOf(Out(), absl::StrCat("[default", rank, "]:"));
    ASSERT_EQ(lines.size(), 1u);
    pid_t grandchild = std::stoi(lines[0]);
    ASSERT_EQ(::kill(grandchild, 0), 0);
    others_.push_back(grandchild);
  }

  bool done = false;
  const auto stop_at = SteadyClock::now();
  group_->Stop(SIGTERM, milliseconds(300), [&] { done = true; });
  ASSERT_TRUE(RunUntil([&] { return done; }));
  // The grandchild that ignores SIGTERM ended with its worker: the stop did
  // not wait for the grace period.
  EXPECT_LT(SteadyClock::now() - stop_at, milliseconds(300));
  EXPECT_EQ(ExitOf(0).signal, SIGTERM);
  EXPECT_EQ(ExitOf(1).signal, SIGTERM);
  for (pid_t pid : others_) EXPECT_TRUE(WaitGone(pid, seconds(10))) << pid;
}

TEST_F(WorkerGroupTest, WorkersDieWithTheAgent) {
  // Orphans come to us, so we can reap the worker and see how it died.
  ASSERT_EQ(::prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
  pid_t worker = 0;
  {
    testing::ChildProcess agent({MESHRUN_PDEATHSIG_HELPER});
    auto line = agent.ReadLine(kDeadline);
    ASSERT_TRUE(line.has_value());
    worker = std::stoi(*line);
    ASSERT_GT(worker, 0);
    ASSERT_EQ(::kill(worker, 0), 0) << "worker not running";
    int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, worker, 0));
    ASSERT_GE(pidfd, 0);

    agent.Signal(SIGKILL);
    ASSERT_TRUE(agent.Wait(kDeadline).has_value());
    pollfd pfd{pidfd, POLLIN, 0};
    int ready;
    do {
      ready = ::poll(&pfd, 1, static_cast<int>(milliseconds(kDeadline).count()));
    } while (ready < 0 && errno == EINTR);
    ::close(pidfd);
    ASSERT_EQ(ready, 1) << "worker " << worker << " outlived its agent";
  }
  int status = 0;
  pid_t reaped;
  do {
    reaped = ::waitpid(worker, &status, 0);
  } while (reaped < 0 && errno == EINTR);
  ASSERT_EQ(::prctl(PR_SET_CHILD_SUBREAPER, 0), 0);
  ASSERT_EQ(reaped, worker);
  EXPECT_TRUE(WIFSIGNALED(status));
  EXPECT_EQ(WTERMSIG(status), SIGKILL);
  EXPECT_TRUE(Gone(worker));
}

TEST_F(WorkerGroupTest, ExitIsReportedAfterAllOutput) {
  MakeGroup();
  std::vector<WorkerSpec> specs;
  for (int rank = 0; rank < 4; ++rank)
    specs.push_back(Shell(rank, "seq 1 20000; printf 'last words' >&2; exit 5"));
  std::map<int, std::pair<std::string, std::string>> seen_at_exit;
  on_exit_ = [&](const WorkerExit& exit) {
    seen_at_exit[exit.local_rank] = {Out(), Err()};
  };
  ASSERT_TRUE(Start(specs).ok());
  ASSERT_TRUE(RunUntilExits(4));
  for (int rank = 0; rank < 4; ++rank) {
    const std::string prefix = absl::StrCat("[default", rank, "]:");
    const auto& [out, err] = seen_at_exit[rank];
    auto lines = LinesOf(out, prefix);
    ASSERT_EQ(lines.size(), 20000u) << rank;
    EXPECT_EQ(lines.back(), "20000");
    EXPECT_EQ(LinesOf(err, prefix), (std::vector<std::string>{"last words"}));
    EXPECT_EQ(ExitOf(rank).exit_code, 5);
  }
}

TEST_F(WorkerGroupTest, DrainIsBoundedWhenABackgroundProcessHoldsTheOutput) {
  WorkerGroupOptions options;
  options.output_drain_timeout = milliseconds(300);
  // Without cgroups, a process that left the worker's group (setsid) survives
  // it and keeps the output open.
  options.cgroups = WorkerGroupOptions::Cgroups::kOff;
  MakeGroup(options);
  SteadyClock::time_point exit_seen;
  on_exit_ = [&](const WorkerExit&) { exit_seen = SteadyClock::now(); };
  const auto start = SteadyClock::now();
  ASSERT_TRUE(Start({Shell(0, EscapedSleep(dir_ + "/fifo") + "echo bye")}).ok());
  ASSERT_TRUE(RunUntilExits(1));
  EXPECT_GE(exit_seen - start, milliseconds(300));
  EXPECT_LT(exit_seen - start, seconds(10));
  EXPECT_EQ(ExitOf(0).exit_code, 0);
  auto lines = LinesOf(Out(), "[default0]:");
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[1], "bye");
  pid_t escaped = std::stoi(lines[0]);
  ASSERT_EQ(::kill(escaped, 0), 0);
  ::kill(escaped, SIGKILL);
  others_.push_back(escaped);
}

// Issue 19 item 11: what a worker leaves in its process group ends with it,
// after a success as after a failure.
TEST_F(WorkerGroupTest, BackgroundChildrenEndWithTheirWorker) {
  WorkerGroupOptions options;
  options.cgroups = WorkerGroupOptions::Cgroups::kOff;  // the process group alone
  MakeGroup(options);
  ASSERT_TRUE(Start({Shell(0, "sleep 1000 & echo $!; exit 0"),
                     Shell(1, "sleep 1000 & echo $!; exit 3")})
                  .ok());
  ASSERT_TRUE(RunUntilExits(2));
  EXPECT_EQ(ExitOf(0).exit_code, 0);
  EXPECT_EQ(ExitOf(1).exit_code, 3);
  for (int rank = 0; rank < 2; ++rank) {
    auto lines = LinesOf(Out(), absl::StrCat("[default", rank, "]:"));
    ASSERT_EQ(lines.size(), 1u) << Out();
    pid_t background = std::stoi(lines[0]);
    others_.push_back(background);
    EXPECT_TRUE(WaitGone(background, seconds(5))) << "rank " << rank;
  }
}

// Issue 19 item 11: with cgroups, also what escaped the group.
TEST_F(WorkerGroupTest, EscapedChildrenEndWithTheirWorkerInACgroup) {
  MakeGroup();
  if (!group_->uses_cgroups())
    GTEST_SKIP() << "cannot create cgroups here (needs cgroup v2, writable)";
  SteadyClock::time_point exit_seen;
  on_exit_ = [&](const WorkerExit&) { exit_seen = SteadyClock::now(); };
  const auto start = SteadyClock::now();
  ASSERT_TRUE(Start({Shell(0, EscapedSleep(dir_ + "/fifo") + "exit 0")}).ok());
  ASSERT_TRUE(RunUntilExits(1));
  auto lines = LinesOf(Out(), "[default0]:");
  ASSERT_EQ(lines.size(), 1u) << Out();
  pid_t escaped = std::stoi(lines[0]);
  others_.push_back(escaped);
  EXPECT_TRUE(WaitGone(escaped, seconds(5)));
  // Killed, so its end closed the output: no drain timeout was waited for.
  EXPECT_LT(exit_seen - start, milliseconds(900));
}

// Issue 19 item 12: a stop does not wait out its grace period for output a
// process outside the worker's group holds open; the drain bound applies.
TEST_F(WorkerGroupTest, StopDoesNotWaitForOutputHeldByAnEscapedProcess) {
  WorkerGroupOptions options;
  options.output_drain_timeout = milliseconds(300);
  options.cgroups = WorkerGroupOptions::Cgroups::kOff;
  MakeGroup(options);
  ASSERT_TRUE(Start({Shell(0, EscapedSleep(dir_ + "/fifo") + "exec sleep 100")}).ok());
  ASSERT_TRUE(RunUntil([&] { return !LinesOf(Out(), "[default0]:").empty(); }));
  others_.push_back(std::stoi(LinesOf(Out(), "[default0]:")[0]));
  bool done = false;
  const auto stop_at = SteadyClock::now();
  group_->Stop(SIGTERM, seconds(30), [&] { done = true; });
  ASSERT_TRUE(RunUntil([&] { return done; }));
  EXPECT_LT(SteadyClock::now() - stop_at, seconds(5));
  EXPECT_EQ(ExitOf(0).signal, SIGTERM);
  ::kill(others_.back(), SIGKILL);
}

// Issue 19 item 9: once a worker is reaped, its group id is free for reuse,
// and a stop must not signal whatever group has it now. The kernel is made
// to reuse it (ns_last_pid, root only).
TEST_F(WorkerGroupTest, StopNeverSignalsAReusedGroupId) {
  WorkerGroupOptions options;
  options.output_drain_timeout = milliseconds(1500);  // the worker stays live
  options.cgroups = WorkerGroupOptions::Cgroups::kOff;
  MakeGroup(options);
  ASSERT_TRUE(Start({Shell(0, EscapedSleep(dir_ + "/fifo") + "exit 0")}).ok());
  const pid_t worker = group_->pids().at(0);
  ASSERT_TRUE(RunUntil([&] { return !LinesOf(Out(), "[default0]:").empty(); }));
  others_.push_back(std::stoi(LinesOf(Out(), "[default0]:")[0]));
  // Reaped (its /proc entry is gone), but live while the escaped sleep holds
  // its output.
  ASSERT_TRUE(RunUntil([&] { return Gone(worker); }));
  ASSERT_EQ(group_->live(), 1u);

  // A process of ours that leads a group with the worker's old id.
  pid_t impostor = -1;
  for (int attempt = 0; attempt < 20 && impostor != worker; ++attempt) {
    if (impostor > 0) {
      ::kill(impostor, SIGKILL);
      ::waitpid(impostor, nullptr, 0);
    }
    std::ofstream last("/proc/sys/kernel/ns_last_pid");
    if (!(last << worker - 1 << std::flush)) GTEST_SKIP() << "ns_last_pid not writable";
    last.close();
    impostor = ::fork();
    if (impostor == 0) {
      ::setpgid(0, 0);
      ::pause();
      ::_exit(0);
    }
    ASSERT_GT(impostor, 0);
  }
  if (impostor != worker) {
    ::kill(impostor, SIGKILL);
    ::waitpid(impostor, nullptr, 0);
    ::kill(others_.back(), SIGKILL);
    // On a busy machine another process took the pid: it is not the worker's.
    workers_started_.erase(
        std::remove(workers_started_.begin(), workers_started_.end(), worker),
        workers_started_.end());
    GTEST_SKIP() << "the kernel did not hand out pid " << worker << " again";
  }
  ::setpgid(impostor, impostor);  // in case the child has not run yet

  bool done = false;
  group_->Stop(SIGTERM, milliseconds(100), [&] { done = true; });
  ASSERT_TRUE(RunUntil([&] { return done; }));
  int status = 0;
  EXPECT_EQ(::waitpid(impostor, &status, WNOHANG), 0)
      << "group " << impostor << " was signalled: " << status;
  ::kill(impostor, SIGKILL);
  ::waitpid(impostor, nullptr, 0);
  ::kill(others_.back(), SIGKILL);
}

// Issue 19 item 9: a worker reaped by someone else has an unknown status,
// which is a failure, not a success.
TEST_F(WorkerGroupTest, UnknownStatusCountsAsAFailure) {
  MakeGroup();
  ASSERT_TRUE(Start({Shell(0, "exit 0")}).ok());
  const pid_t pid = group_->pids().at(0);
  int status = 0;
  pid_t reaped;
  do {
    reaped = ::waitpid(pid, &status, 0);  // before the group sees SIGCHLD
  } while (reaped < 0 && errno == EINTR);
  ASSERT_EQ(reaped, pid);
  ASSERT_TRUE(RunUntilExits(1));
  EXPECT_FALSE(ExitOf(0).status_known);
  EXPECT_TRUE(ExitOf(0).failed());
  EXPECT_NE(ExitOf(0).exit_code, 0);
}

// Issue 19 item 9: fds the agent opened without O_CLOEXEC never reach a
// worker, also where close_range(CLOSE_RANGE_CLOEXEC) fails (kernel < 5.11).
TEST_F(WorkerGroupTest, AgentFdsDoNotLeakIntoWorkers) {
  for (bool simulate_old_kernel : {false, true}) {
    SCOPED_TRACE(simulate_old_kernel ? "without close_range" : "with close_range");
    WorkerGroupOptions options;
    options.simulate_no_close_range_cloexec = simulate_old_kernel;
    MakeGroup(options);
    exits_.clear();
    int leaked = ::open("/dev/null", O_RDONLY);  // deliberately inheritable
    ASSERT_GE(leaked, 3);
    ASSERT_TRUE(Start({Shell(0, absl::StrCat("[ -e /proc/$$/fd/", leaked,
                                             " ] && exit 3; exit 0"))})
                    .ok());
    ASSERT_TRUE(RunUntilExits(1));
    ::close(leaked);
    EXPECT_EQ(ExitOf(0).exit_code, 0) << "fd " << leaked << " reached the worker";
  }
}

TEST_F(WorkerGroupTest, LinesOfManyWorkersNeverInterleave) {
  MakeGroup();
  constexpr int kWorkers = 16;
  constexpr int kLines = 1000;
  std::vector<WorkerSpec> specs;
  for (int rank = 0; rank < kWorkers; ++rank) {
    // awk writes in 4 KiB blocks, so lines reach the pipe cut in pieces.
    specs.push_back(Shell(
        rank, absl::StrCat("awk 'BEGIN { pad = sprintf(\"%150s\", \"\"); gsub(/ /, \"",
                           std::string(1, static_cast<char>('a' + rank)),
                           "\", pad); for (i = 0; i < ", kLines, "; i++) { printf \"o",
                           rank, "-%04d-%s\\n\", i, pad; ", "printf \"e", rank,
                           "-%04d-%s\\n\", i, pad > \"/dev/stderr\" } }'")));
  }
  ASSERT_TRUE(Start(specs).ok());
  ASSERT_TRUE(RunUntilExits(kWorkers));
  for (auto [text, tag] : {std::pair(Out(), 'o'), std::pair(Err(), 'e')}) {
    std::vector<int> next(kWorkers, 0);
    size_t count = 0;
    for (const std::string& line : SplitLines(text)) {
      ++count;
      int rank = -1;
      int index = -1;
      char pad[200] = {};
      ASSERT_EQ(std::sscanf(line.c_str(), "[default%d]:", &rank), 1) << line;
      ASSERT_TRUE(rank >= 0 && rank < kWorkers) << line;
      const std::string expected_head =
          absl::StrCat("[default", rank, "]:", std::string(1, tag), rank, "-");
      ASSERT_EQ(line.substr(0, expected_head.size()), expected_head) << line;
      std::string rest(line.substr(expected_head.size()));
      ASSERT_EQ(std::sscanf(rest.c_str(), "%4d-%199s", &index, pad), 2) << line;
      EXPECT_EQ(index, next[rank]) << line;
      next[rank] = index + 1;
      EXPECT_EQ(std::string(pad), std::string(150, static_cast<char>('a' + rank)))
          << line;
    }
    EXPECT_EQ(count, static_cast<size_t>(kWorkers * kLines));
    for (int rank = 0; rank < kWorkers; ++rank) EXPECT_EQ(next[rank], kLines) << rank;
  }
}

TEST_F(WorkerGroupTest, SignalIsForwardedToRunningWorkers) {
  MakeGroup();
  // The signal also reaches the group's `sleep`, possibly before its exec,
  // when it still runs the shell's handler and would survive; so the trap
  // ends it explicitly, and the shell waits in `wait`, which a trap cuts short.
  ASSERT_TRUE(Start({Shell(0,
                           "trap 'echo got-usr1; kill $child; exit 7' USR1; "
                           "sleep 100 & child=$!; echo ready; wait")})
                  .ok());
  ASSERT_TRUE(RunUntil([&] { return !LinesOf(Out(), "[default0]:").empty(); }));
  group_->Signal(SIGUSR1);
  ASSERT_TRUE(RunUntilExits(1));
  EXPECT_EQ(ExitOf(0).exit_code, 7);
  EXPECT_EQ(LinesOf(Out(), "[default0]:"),
            (std::vector<std::string>{"ready", "got-usr1"}));
}

TEST_F(WorkerGroupTest, StopTwiceAndWithNothingLiveIsSafe) {
  MakeGroup();
  int idle_done = 0;
  group_->Stop(SIGTERM, seconds(1), [&] { ++idle_done; });
  EXPECT_EQ(idle_done, 0);
  ASSERT_TRUE(RunUntil([&] { return idle_done > 0; }));

  ASSERT_TRUE(Start({Shell(0, "exec sleep 100"),
                     Shell(1, "trap '' TERM; echo ready; exec sleep 100")})
                  .ok());
  ASSERT_TRUE(RunUntil([&] { return !LinesOf(Out(), "[default1]:").empty(); }));
  int first_done = 0;
  int second_done = 0;
  const auto stop_at = SteadyClock::now();
  group_->Stop(SIGTERM, seconds(60), [&] { ++first_done; });
  // A second Stop with a shorter grace moves the SIGKILL earlier.
  group_->Stop(SIGTERM, milliseconds(200), [&] { ++second_done; });
  EXPECT_FALSE(group_->Start({Shell(2, "true")}).ok());
  ASSERT_TRUE(RunUntil([&] { return first_done > 0 && second_done > 0; }));
  EXPECT_LT(SteadyClock::now() - stop_at, seconds(10));
  EXPECT_EQ(exits_.size(), 2u);
  EXPECT_EQ(ExitOf(0).signal, SIGTERM);
  EXPECT_EQ(ExitOf(1).signal, SIGKILL);

  // The group can be started again: the agent's restart.
  exits_.clear();
  ASSERT_TRUE(Start({Shell(0, "exit 2")}).ok());
  ASSERT_TRUE(RunUntilExits(1));
  EXPECT_EQ(ExitOf(0).exit_code, 2);
  io_.poll();
  EXPECT_EQ(first_done, 1);
  EXPECT_EQ(second_done, 1);
  EXPECT_EQ(idle_done, 1);
}

TEST_F(WorkerGroupTest, StartRejectsBadSpecsWithoutStartingAnything) {
  MakeGroup();
  WorkerSpec empty = Shell(0, "");
  empty.argv.clear();
  EXPECT_EQ(group_->Start({Shell(1, "exec sleep 100"), empty}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(group_->live(), 0u);

  WriteFile(dir_ + "/a-file", "x");
  WorkerSpec bad_log = Shell(1, "");
  bad_log.stdout_file = dir_ + "/a-file/stdout.log";
  EXPECT_FALSE(group_->Start({Shell(0, "exec sleep 100"), bad_log}).ok());
  EXPECT_EQ(group_->live(), 0u);

  ASSERT_TRUE(Start({Shell(0, "exec sleep 100")}).ok());
  EXPECT_EQ(group_->Start({Shell(1, "true")}).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(group_->live(), 1u);
}

TEST_F(WorkerGroupTest, DestructorKillsLiveWorkersWithoutCallbacks) {
  MakeGroup();
  ASSERT_TRUE(Start({Shell(0, "exec sleep 100"),
                     Shell(1, "trap '' TERM; echo hi; sleep 100"), Shell(2, "exit 0")})
                  .ok());
  ASSERT_TRUE(RunUntil([&] { return !LinesOf(Out(), "[default1]:").empty(); }));
  const std::vector<pid_t> pids = group_->pids();
  group_.reset();
  for (pid_t pid : pids) EXPECT_TRUE(Gone(pid)) << pid;
  const size_t exits_before = exits_.size();
  io_.poll();  // handlers queued before the destruction do nothing
  EXPECT_EQ(exits_.size(), exits_before);
}

}  // namespace
}  // namespace meshrun::agent
