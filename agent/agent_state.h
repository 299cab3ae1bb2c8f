#pragma once

// The elastic agent's decisions as a pure state machine: events in (round
// assigned, re-form, run closed, a worker exited, workers stopped, a signal),
// actions out (start or stop the workers, report to the daemon, exit). No
// processes, sockets or clocks; the Agent adapter performs the actions.
//
// Restart policy lives in the daemon (one job-global budget), so the agent's
// job is sequencing: a local failure stops the local workers and is
// reported; whatever the daemon decides arrives as a re-form or a close.
//
// Restart scope "replica" (meshrun --restart-scope=replica): the local
// workers form replica groups of `replica_size` consecutive local ranks. A
// failure stops only its group and is reported with the group; the daemon's
// verdict (ReplicaVerdict) restarts that group in the same round once it has
// stopped, or, when the budget is spent, stops everything (the daemon
// closes the run). Re-forms, signals and a lost daemon stop every local
// worker, as in scope "job".
//
// Thread-safety: none; the owner serialises all calls.

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace meshrun::agent {

struct RoundInfo {
  uint64_t round = 0;
  uint32_t group_rank = 0;
  uint32_t group_world_size = 0;
  uint32_t rank_base = 0;
  uint32_t world_size = 0;
  uint32_t restart_count = 0;
  std::string store_prefix;
  uint64_t admission_epoch = 0;  // this node's admission into its slot
  // The daemon's port serves this run's store to stock TCPStore clients.
  bool serves_tcpstore = false;
};

// One worker's end. `signal` is 0 for a normal exit.
struct ExitInfo {
  int local_rank = 0;
  int global_rank = 0;
  int exit_code = 0;
  int signal = 0;
  bool failed() const { return signal != 0 || exit_code != 0; }
  // Shell convention: the code, or 128 + the signal.
  int status_code() const { return signal != 0 ? 128 + signal : exit_code; }
};

enum class RunEnd { kSucceeded, kFailed, kAborted };

namespace event {
struct Assigned {
  RoundInfo round;
};
struct Reform {
  uint64_t next_round;
  std::string reason;
};
struct Closed {
  RunEnd outcome;
  std::string reason;
};
struct WorkerExited {
  ExitInfo exit;
};
struct WorkersStopped {};
struct Signal {
  int number;
};
// The Join stream ended without a close and cannot be re-opened (a refused
// join, a closed run).
struct RendezvousLost {
  std::string reason;
};
// The daemon answered that it does not know this node in its round (it
// restarted without --state-dir, or the others re-formed without this node
// while it was cut off). The workers of that round must stop; the adapter
// joins afresh, and the assignment it gets starts the next ones.
struct RoundLost {
  std::string reason;
};
// No successful heartbeat for the agent's lease (the reconnect grace): the
// daemon is gone or this node is cut off from it. The others re-form without
// this node, so its workers must not train on.
struct LeaseExpired {
  std::string reason;
};
// Restart scope "replica": every worker of the replica group that a
// StopReplica stopped has ended.
struct ReplicaStopped {
  uint32_t replica;
};
// Restart scope "replica": the daemon's answer to the failure report of
// `replica` in `round`.
struct ReplicaVerdict {
  uint64_t round;
  uint32_t replica;
  bool will_restart;
  uint32_t restart_count;  // the run's, the restarted workers' new count
};
// A health check failed before a restart round (agent/health_check.h): the
// node stops its workers, leaves the run and exits kUnhealthyExitCode.
struct Unhealthy {
  std::string summary;
};
}  // namespace event

using Event =
    std::variant<event::Assigned, event::Reform, event::Closed, event::WorkerExited,
                 event::WorkersStopped, event::Signal, event::RendezvousLost,
                 event::RoundLost, event::LeaseExpired, event::ReplicaStopped,
                 event::ReplicaVerdict, event::Unhealthy>;

// meshrun's exit code when it gave up on an unreachable daemon after its
// lease (sysexits' EX_TEMPFAIL: the job may be retried).
inline constexpr int kLeaseExpiredExitCode = 75;
// meshrun's exit code when a health check kept this node out of the run
// (sysexits' EX_UNAVAILABLE: nothing of the run failed here).
inline constexpr int kUnhealthyExitCode = 69;

namespace action {
struct StartWorkers {
  RoundInfo round;
};
struct StopWorkers {
  int signal;
};
struct ForwardSignal {
  int number;
};
struct ReportFailure {
  uint64_t round;
  ExitInfo exit;
  // Restart scope "replica": the failed worker's replica group (global id)
  // and how often it had been restarted in this round.
  std::optional<uint32_t> replica = std::nullopt;
  uint32_t replica_restarts = 0;
};
// Restart scope "replica": stop the running workers of one replica group.
// `group` is its index among this node's groups (local ranks
// [group * replica_size, (group + 1) * replica_size)); `replica` its global id.
struct StopReplica {
  uint32_t replica;
  int group;
  int signal;
};
// Restart scope "replica": start one replica group's workers again in
// `round` (whose restart_count is the run's new count).
struct StartReplica {
  RoundInfo round;
  uint32_t replica;
  int group;
  uint32_t restarts;  // MESHRUN_REPLICA_RESTARTS
};
struct ReportSuccess {
  uint64_t round;
};
struct LeaveRun {};
struct Exit {
  int code;
  std::string summary;
};
}  // namespace action

using Action =
    std::variant<action::StartWorkers, action::StopWorkers, action::ForwardSignal,
                 action::ReportFailure, action::ReportSuccess, action::LeaveRun,
                 action::Exit, action::StopReplica, action::StartReplica>;

class AgentState {
 public:
  // `nproc`: local workers per round. `replica_size`: workers per replica
  // group in restart scope "replica", 0 for scope "job". REQUIRES: nproc is
  // a multiple of a non-zero replica_size.
  explicit AgentState(int nproc, int replica_size = 0);

  std::vector<Action> Step(const Event& event);

  enum class Phase {
    kJoining,    // waiting for a round assignment
    kRunning,    // workers alive
    kStopping,   // stopping workers; then start the next round or exit
    kSucceeded,  // local workers all succeeded; waiting for the run to close
    kExited,
  };
  Phase phase() const { return phase_; }
  // This node's failure that a failed run's end is about: the first of the
  // current round; with restart scope replica, the latest (each group's
  // failure spends the budget on its own, and the last one spent it). Its
  // code is the exit code when the run fails.
  const std::optional<ExitInfo>& failure() const { return failure_; }
  // The round whose workers run or finished on this node: the round a
  // reconnecting agent resumes. nullopt while joining or stopping.
  std::optional<uint64_t> resumable_round() const;

 private:
  std::vector<Action> OnAssigned(const RoundInfo& round);
  std::vector<Action> OnWorkerExited(const ExitInfo& exit);
  std::vector<Action> OnReplicaWorkerExited(const ExitInfo& exit);
  std::vector<Action> OnReplicaStopped(uint32_t replica);
  std::vector<Action> OnReplicaVerdict(const event::ReplicaVerdict& verdict);
  // Starts the group again once it has stopped and the daemon said so.
  std::vector<Action> MaybeRestartReplica(int group);
  // This node's group index of a global replica id, or -1.
  int LocalGroup(uint32_t replica) const;
  uint32_t ReplicaId(int group) const;
  std::vector<Action> OnStopped();
  std::vector<Action> BeginStop(int signal);
  // Stops the workers (if any) and exits with `code`.
  std::vector<Action> GiveUp(int code, std::string summary);
  std::vector<Action> ExitNow(int code, std::string summary);

  const int nproc_;
  Phase phase_ = Phase::kJoining;
  std::optional<RoundInfo> current_;
  // An assignment that arrived while workers were still stopping.
  std::optional<RoundInfo> next_;
  // What to do once the workers are stopped, if not starting the next round.
  std::optional<action::Exit> exit_after_stop_;
  int live_workers_ = 0;
  int succeeded_workers_ = 0;
  bool failure_reported_this_round_ = false;
  std::optional<ExitInfo> failure_;

  // Restart scope "replica" only.
  const int replica_size_;
  struct Replica {
    enum class State { kRunning, kStopping, kStopped };
    State state = State::kRunning;
    uint32_t restarts = 0;  // in the current round
    bool awaiting_verdict = false;
    // The run's restart count the daemon gave for the pending restart.
    std::optional<uint32_t> restart_count;
  };
  std::vector<Replica> replicas_;     // by local group
  std::vector<bool> rank_succeeded_;  // by local rank, latest incarnation
};

const char* ToString(AgentState::Phase phase);

}  // namespace meshrun::agent
