#pragma once

// Supervision of one node's local workers: fork/exec, exit detection on
// SIGCHLD, output pipes to the console and log files, and stopping with a
// grace period. Event-driven on a Boost.Asio io_context; nothing polls.
//
// Each worker is the leader of its own process group, so a signal reaches
// everything it started (data loader processes, shells' children), and dies
// with the agent (PR_SET_PDEATHSIG = SIGKILL): a SIGKILLed agent leaves no
// running workers behind.
//
// When a worker ends, what it left running ends with it: its process group is
// SIGKILLed, and where the agent can create cgroups (cgroup v2, writable: root,
// or a delegated subtree) each worker runs in a cgroup of its own, killed
// too, which also catches processes that left the group (setsid). A group is
// signalled only while its leader is unreaped (running or a zombie), so its
// id cannot have been reused by an unrelated group.

#include <sys/types.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/signal_set.hpp>
#include <boost/asio/steady_timer.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "agent/hang_detector.h"
#include "agent/log_sink.h"

namespace meshrun::agent {

// The paths execvp would try for `file` with `env`'s PATH (else this
// process's, else glibc's default): `file` itself when it has a slash.
std::vector<std::string> ExecCandidates(const std::string& file,
                                        const std::map<std::string, std::string>& env);

struct WorkerSpec {
  int local_rank = 0;
  int global_rank = 0;
  // argv[0] without a '/' is looked up in the worker's PATH (the agent's,
  // unless `env` sets one), like execvp. The arguments reach the worker
  // byte for byte; no shell is involved.
  std::vector<std::string> argv;
  // Set on top of the agent's own environment.
  std::map<std::string, std::string> env;
  // Put before every console line of the streams below that have it set,
  // e.g. "[default0]:"; rendered by the caller. torchrun 2 prefixes only
  // tee'd streams (-t): a stream that only reaches the console reads as the
  // worker wrote it.
  std::string console_prefix;
  bool prefix_stdout = true;
  bool prefix_stderr = true;
  // Console: line by line, through the group's ConsoleWriter.
  bool stdout_to_console = true;
  bool stderr_to_console = true;
  // Raw bytes; created with parent directories and appended to. A stream on
  // neither the console nor a file goes to /dev/null.
  std::optional<std::string> stdout_file;
  std::optional<std::string> stderr_file;
  // Console lines matching a filter are copied here too (null: none); see
  // LineCopy. Shared by the workers of an attempt.
  std::shared_ptr<LineCopy> stdout_copy;
  std::shared_ptr<LineCopy> stderr_copy;
  // Where Yama restricts ptrace to ancestors (ptrace_scope 1), the process
  // the worker lets trace it and its descendants (PR_SET_PTRACER): the
  // agent's stack dump helper (agent/dump_helper.h), never the agent itself,
  // whose descendants include the other workers. 0: none.
  pid_t ptracer = 0;
};

struct WorkerExit {
  int local_rank = 0;
  int global_rank = 0;
  pid_t pid = 0;
  int exit_code = 0;  // -1 if killed by a signal or the status is unknown
  int signal = 0;     // 0 if it exited
  // False when someone else reaped the worker (SIGCHLD ignored, a stray
  // waitpid(-1)): how it ended cannot be known, and it counts as a failure.
  bool status_known = true;
  bool failed() const { return !status_known || signal != 0 || exit_code != 0; }
  // When the agent reaped it (before its output was drained).
  std::chrono::system_clock::time_point when;
};

struct WorkerGroupOptions {
  // How long a worker's exit may wait for its output pipes to reach EOF. A
  // process that escaped the worker's group and cgroup (setsid, without
  // cgroups) can hold them open forever; after this the pipes are closed
  // (that process gets SIGPIPE on its next write) and the exit is reported,
  // also during a Stop.
  std::chrono::milliseconds output_drain_timeout{1000};
  // Console for the workers' prefixed lines; null means
  // ConsoleWriter::Default(). Must outlive the group.
  ConsoleWriter* console = nullptr;
  // kAuto: a cgroup per worker where possible (see the top of this file),
  // unless the environment has MESHRUN_CGROUPS=off.
  enum class Cgroups { kAuto, kOff };
  Cgroups cgroups = Cgroups::kAuto;
  // Whether the constructor logs how workers are contained (cgroups or not):
  // once per agent is enough when it has several groups.
  bool log_setup = true;
  // Tests: behave as on a kernel where close_range(CLOSE_RANGE_CLOEXEC) fails
  // (before 5.11).
  bool simulate_no_close_range_cloexec = false;
};

// A set of worker processes started together.
//
// Thread-compatible: every method, and the constructor and destructor, must
// be called on the thread that runs `io`, and all callbacks run there. That
// thread must also outlive the workers: PR_SET_PDEATHSIG fires when the
// *thread* that forked a worker exits, not the process, so a worker forked
// from a short-lived thread would be killed with it.
//
// A worker is "live" from Start until its exit is reported: it is running,
// or it has exited and its output is still being drained.
//
// Exits come from SIGCHLD through an Asio signal_set; the group then
// waitpid()s its own pids only. So the agent must not set SIGCHLD to
// SIG_IGN nor reap with waitpid(-1). The handler gets SA_RESTART, so worker
// exits do not fail blocking calls on the agent's other threads with EINTR.
class WorkerGroup {
 public:
  // `io` must outlive the group. `on_exit` runs once per worker, after all of
  // the worker's output reached the console and files (or after the bounded
  // drain, see WorkerGroupOptions). Callbacks may call the group's methods
  // but must not destroy it.
  WorkerGroup(boost::asio::io_context& io, std::function<void(const WorkerExit&)> on_exit,
              WorkerGroupOptions options = {});
  // Kills (SIGKILL to each running worker's process group and cgroup) and
  // reaps the live workers without reporting them, and removes the cgroups. Blocks only
  // until the kernel tears them down.
  ~WorkerGroup();
  WorkerGroup(const WorkerGroup&) = delete;
  WorkerGroup& operator=(const WorkerGroup&) = delete;

  // Spawns one worker per spec, in order. Returns once every worker has
  // exec'd (or failed to): a worker whose program cannot be executed is
  // reported through on_exit with 127 (not found) or 126 (any other exec
  // error), like a shell, after the line "meshrun: cannot execute 'x':
  // <reason>" on its stderr. Errors (bad spec, log file, fork or pipe
  // failure) leave no worker started. FailedPrecondition unless live() == 0
  // and no Stop is under way (start the next workers from Stop's `done`).
  absl::Status Start(std::vector<WorkerSpec> specs);

  // Sends `signal` to the process group of every worker still running, then
  // SIGKILL to those (and their cgroups) still running after `grace`. A
  // worker that exited is not waited for beyond output_drain_timeout. `done` runs on `io`
  // after the last exit has been reported, always posted, never from inside Stop (also
  // when nothing is live); the group may be destroyed from within it. Calling Stop again
  // while stopping sends the new signal, moves the SIGKILL deadline earlier if the new
  // grace ends sooner, and adds its `done`.
  void Stop(int signal, std::chrono::milliseconds grace, std::function<void()> done);

  // Forwards `signal` to the process group of every worker still running.
  void Signal(int signal);
  // Sends `signal` to the worker process `pid` alone, if it is one of this
  // group's and unreaped (so the pid cannot belong to another process by
  // now); returns its local rank, else nullopt.
  std::optional<int> SignalWorker(pid_t pid, int signal);

  size_t live() const { return workers_.size(); }
  // Between Stop and its `done`.
  bool stopping() const { return stopping_; }
  // Whether each worker runs in a cgroup of its own (decided at construction).
  bool uses_cgroups() const { return !cgroup_parent_.empty(); }
  std::vector<pid_t> pids() const;  // of the live workers, in start order
  // What each running (unreaped) worker has done so far, for --hang-timeout:
  // the CPU time of the worker and everything it started (its cgroup's
  // cpu.stat; without cgroups, the processes of its process group and the
  // children they reaped, from /proc) and the bytes it wrote to its piped
  // streams. Reads /proc or /sys: a few microseconds a worker.
  std::vector<WorkerProgress> Progress() const;
  // The local rank of the running worker `pid`, else nullopt.
  std::optional<int> LocalRankOf(pid_t pid) const;
  // Its global rank, else nullopt.
  std::optional<int> GlobalRankOf(pid_t pid) const;

 private:
  struct Worker;
  struct Pipe;

  void WaitForSigchld();
  void Reap();
  void OnReaped(const std::shared_ptr<Worker>& worker);
  void ReadPipe(const std::shared_ptr<Worker>& worker, Pipe* pipe);
  void OnPipeClosed(const std::shared_ptr<Worker>& worker);
  void StartDrainTimer(const std::shared_ptr<Worker>& worker);
  void ArmGraceTimer(std::chrono::steady_clock::time_point deadline);
  void OnGraceExpired();
  void Finish(const std::shared_ptr<Worker>& worker);
  void MaybeFinishStop();
  // REQUIRES: for either, the worker is unreaped (see the top of the file).
  void KillGroup(const Worker& worker, int signal);
  void EndLeftovers(const Worker& worker);
  void RemoveCgroups();

  boost::asio::io_context& io_;
  const std::function<void(const WorkerExit&)> on_exit_;
  const WorkerGroupOptions options_;
  ConsoleWriter* const console_;
  boost::asio::signal_set sigchld_;
  boost::asio::steady_timer grace_timer_;
  std::vector<std::shared_ptr<Worker>> workers_;  // live, in start order
  bool stopping_ = false;
  bool grace_expired_ = false;
  std::chrono::steady_clock::time_point grace_deadline_;
  uint64_t grace_generation_ = 0;  // tells a stale grace timer expiry apart
  std::vector<std::function<void()>> stop_done_;
  // This group's cgroup directory (the workers' cgroups are under it), or
  // empty without cgroups.
  std::string cgroup_parent_;
  uint64_t next_cgroup_ = 0;
  // Cgroups of ended workers not removed yet (a killed process was still
  // being torn down); retried on later exits and at destruction.
  std::vector<std::string> cgroups_to_remove_;
  // Handlers hold a weak_ptr to this, so ones still queued after the group
  // is destroyed do nothing.
  std::shared_ptr<WorkerGroup*> self_;
};

}  // namespace meshrun::agent
