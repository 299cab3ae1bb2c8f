#include "agent/agent_state.h"

#include <signal.h>

#include <utility>

namespace meshrun::agent {

namespace {
template <class... Ts>
struct Overloaded : Ts... {
  using Ts::operator()...;
};
template <class... Ts>
Overloaded(Ts...) -> Overloaded<Ts...>;

bool StopsTheAgent(int signal_number) {
  return signal_number == SIGTERM || signal_number == SIGINT || signal_number == SIGHUP ||
         signal_number == SIGQUIT;
}
}  // namespace

const char* ToString(AgentState::Phase phase) {
  switch (phase) {
    case AgentState::Phase::kJoining:
      return "joining";
    case AgentState::Phase::kRunning:
      return "running";
    case AgentState::Phase::kStopping:
      return "stopping";
    case AgentState::Phase::kSucceeded:
      return "succeeded";
    case AgentState::Phase::kExited:
      return "exited";
  }
  return "?";
}

AgentState::AgentState(int nproc, int replica_size)
    : nproc_(nproc), replica_size_(replica_size) {}

std::vector<Action> AgentState::Step(const Event& event) {
  if (phase_ == Phase::kExited) return {};
  return std::visit(
      Overloaded{
          [&](const event::Assigned& e) { return OnAssigned(e.round); },
          [&](const event::Reform&) -> std::vector<Action> {
            if (phase_ == Phase::kRunning) return BeginStop(SIGTERM);
            // Succeeded workers are gone already; the whole world restarts
            // together, so this node runs the next round too.
            if (phase_ == Phase::kSucceeded) phase_ = Phase::kJoining;
            return {};
          },
          [&](const event::Closed& e) -> std::vector<Action> {
            int code = 0;
            std::string summary;
            switch (e.outcome) {
              case RunEnd::kSucceeded:
                summary =
                    e.reason.empty() ? "run succeeded" : "run succeeded: " + e.reason;
                break;
              case RunEnd::kFailed:
                code = failure_ ? failure_->status_code() : 1;
                if (code == 0) code = 1;
                // The daemon's reason is the run's first failure, wherever it was.
                summary = "run failed\n" + std::string(60, '=') +
                          "\nRoot Cause (first observed failure):\n" + e.reason +
                          std::string(60, '=');
                break;
              case RunEnd::kAborted:
                code = 1;
                summary = "run aborted: " + e.reason;
                break;
            }
            if (phase_ == Phase::kRunning || phase_ == Phase::kStopping) {
              exit_after_stop_ = action::Exit{code, summary};
              return BeginStop(SIGTERM);
            }
            return ExitNow(code, std::move(summary));
          },
          [&](const event::WorkerExited& e) { return OnWorkerExited(e.exit); },
          [&](const event::WorkersStopped&) { return OnStopped(); },
          [&](const event::Signal& e) -> std::vector<Action> {
            if (!StopsTheAgent(e.number)) return {action::ForwardSignal{e.number}};
            std::string summary = "stopped by signal " + std::to_string(e.number);
            if (phase_ == Phase::kRunning || phase_ == Phase::kStopping) {
              exit_after_stop_ = action::Exit{128 + e.number, summary};
              // The workers get the same signal first, then SIGKILL after the
              // grace (again if a stop was under way: the user's signal
              // wins); telling the daemon comes second, since it may be slow
              // or away and the grace is the workers'.
              phase_ = Phase::kStopping;
              return {action::StopWorkers{e.number}, action::LeaveRun{}};
            }
            std::vector<Action> actions{action::LeaveRun{}};
            auto exit = ExitNow(128 + e.number, summary);
            actions.insert(actions.end(), exit.begin(), exit.end());
            return actions;
          },
          [&](const event::Unhealthy& e) -> std::vector<Action> {
            if (phase_ == Phase::kRunning || phase_ == Phase::kStopping) {
              exit_after_stop_ = action::Exit{kUnhealthyExitCode, e.summary};
              phase_ = Phase::kStopping;
              return {action::StopWorkers{SIGTERM}, action::LeaveRun{}};
            }
            std::vector<Action> actions{action::LeaveRun{}};
            auto exit = ExitNow(kUnhealthyExitCode, e.summary);
            actions.insert(actions.end(), exit.begin(), exit.end());
            return actions;
          },
          [&](const event::RendezvousLost& e) {
            return GiveUp(1, "lost the rendezvous: " + e.reason);
          },
          [&](const event::LeaseExpired& e) {
            return GiveUp(kLeaseExpiredExitCode, e.reason);
          },
          [&](const event::RoundLost&) -> std::vector<Action> {
            // Like a re-form, but decided by this node: its round is gone.
            if (phase_ == Phase::kRunning) return BeginStop(SIGTERM);
            if (phase_ == Phase::kSucceeded) phase_ = Phase::kJoining;
            return {};
          },
          [&](const event::ReplicaStopped& e) { return OnReplicaStopped(e.replica); },
          [&](const event::ReplicaVerdict& e) { return OnReplicaVerdict(e); },
      },
      event);
}

std::vector<Action> AgentState::OnAssigned(const RoundInfo& round) {
  switch (phase_) {
    case Phase::kJoining:
    case Phase::kSucceeded:
      // A re-sent assignment of the round we finished (the agent reconnected):
      // report the success again, since the first report may have been lost
      // with the daemon. The daemon counts it once.
      if (current_ && round.round == current_->round && phase_ == Phase::kSucceeded)
        return {action::ReportSuccess{round.round}};
      current_ = round;
      phase_ = Phase::kRunning;
      live_workers_ = nproc_;
      succeeded_workers_ = 0;
      failure_reported_this_round_ = false;
      failure_.reset();  // an earlier round's, restarted: not what ends the run
      if (replica_size_ > 0) {
        replicas_.assign(static_cast<size_t>(nproc_ / replica_size_), Replica{});
        rank_succeeded_.assign(static_cast<size_t>(nproc_), false);
      }
      return {action::StartWorkers{round}};
    case Phase::kStopping:
      next_ = round;
      return {};
    case Phase::kRunning:
      if (current_ && round.round == current_->round) return {};  // re-sent
      // A newer round without a re-form first: restart into it.
      next_ = round;
      return BeginStop(SIGTERM);
    case Phase::kExited:
      return {};
  }
  return {};
}

std::vector<Action> AgentState::OnWorkerExited(const ExitInfo& exit) {
  if (live_workers_ > 0) --live_workers_;
  if (phase_ != Phase::kRunning) return {};  // expected during a stop
  if (replica_size_ > 0) return OnReplicaWorkerExited(exit);
  if (exit.failed()) {
    if (!failure_) failure_ = exit;
    std::vector<Action> actions = BeginStop(SIGTERM);
    if (!failure_reported_this_round_) {
      failure_reported_this_round_ = true;
      actions.push_back(action::ReportFailure{current_->round, exit});
    }
    return actions;
  }
  if (++succeeded_workers_ == nproc_) {
    phase_ = Phase::kSucceeded;
    return {action::ReportSuccess{current_->round}};
  }
  return {};
}

std::vector<Action> AgentState::OnReplicaWorkerExited(const ExitInfo& exit) {
  const int group = exit.local_rank / replica_size_;
  if (exit.local_rank < 0 || group >= static_cast<int>(replicas_.size())) return {};
  Replica& replica = replicas_[group];
  // Its group is being stopped: expected, the failure is reported already.
  if (replica.state != Replica::State::kRunning) return {};
  if (!exit.failed()) {
    rank_succeeded_[exit.local_rank] = true;
    for (bool succeeded : rank_succeeded_)
      if (!succeeded) return {};
    phase_ = Phase::kSucceeded;
    return {action::ReportSuccess{current_->round}};
  }
  failure_ = exit;
  replica.state = Replica::State::kStopping;
  replica.awaiting_verdict = true;
  replica.restart_count.reset();
  // The whole group starts again, also members that had finished.
  for (int rank = group * replica_size_; rank < (group + 1) * replica_size_; ++rank)
    rank_succeeded_[rank] = false;
  const uint32_t id = ReplicaId(group);
  return {action::StopReplica{id, group, SIGTERM},
          action::ReportFailure{current_->round, exit, id, replica.restarts}};
}

std::vector<Action> AgentState::OnReplicaStopped(uint32_t replica) {
  if (phase_ != Phase::kRunning || replica_size_ == 0) return {};
  const int group = LocalGroup(replica);
  if (group < 0 || replicas_[group].state != Replica::State::kStopping) return {};
  replicas_[group].state = Replica::State::kStopped;
  return MaybeRestartReplica(group);
}

std::vector<Action> AgentState::OnReplicaVerdict(const event::ReplicaVerdict& verdict) {
  // A verdict on a round this node has left behind (a re-form, a close).
  if (phase_ != Phase::kRunning || replica_size_ == 0 || verdict.round != current_->round)
    return {};
  const int group = LocalGroup(verdict.replica);
  if (group < 0 || !replicas_[group].awaiting_verdict) return {};
  replicas_[group].awaiting_verdict = false;
  // The budget is spent and the daemon closes the run as failed; its close
  // brings the root cause, for the exit.
  if (!verdict.will_restart) return BeginStop(SIGTERM);
  replicas_[group].restart_count = verdict.restart_count;
  return MaybeRestartReplica(group);
}

std::vector<Action> AgentState::MaybeRestartReplica(int group) {
  Replica& replica = replicas_[group];
  if (replica.state != Replica::State::kStopped || replica.awaiting_verdict ||
      !replica.restart_count)
    return {};
  replica.state = Replica::State::kRunning;
  ++replica.restarts;
  live_workers_ += replica_size_;
  RoundInfo round = *current_;
  round.restart_count = *replica.restart_count;
  replica.restart_count.reset();
  return {action::StartReplica{round, ReplicaId(group), group, replica.restarts}};
}

int AgentState::LocalGroup(uint32_t replica) const {
  const uint32_t first = current_->rank_base / static_cast<uint32_t>(replica_size_);
  if (replica < first || replica - first >= replicas_.size()) return -1;
  return static_cast<int>(replica - first);
}

uint32_t AgentState::ReplicaId(int group) const {
  return current_->rank_base / static_cast<uint32_t>(replica_size_) +
         static_cast<uint32_t>(group);
}

std::vector<Action> AgentState::OnStopped() {
  if (phase_ != Phase::kStopping) return {};
  live_workers_ = 0;
  if (exit_after_stop_) {
    action::Exit exit = *exit_after_stop_;
    return ExitNow(exit.code, exit.summary);
  }
  phase_ = Phase::kJoining;
  if (next_) {
    RoundInfo round = *next_;
    next_.reset();
    return OnAssigned(round);
  }
  return {};
}

std::vector<Action> AgentState::GiveUp(int code, std::string summary) {
  // Already on the way out (a signal, a close): that reason stands.
  if (exit_after_stop_) return {};
  if (phase_ == Phase::kRunning || phase_ == Phase::kStopping) {
    exit_after_stop_ = action::Exit{code, std::move(summary)};
    return BeginStop(SIGTERM);
  }
  return ExitNow(code, std::move(summary));
}

std::optional<uint64_t> AgentState::resumable_round() const {
  if ((phase_ == Phase::kRunning || phase_ == Phase::kSucceeded) && current_)
    return current_->round;
  return std::nullopt;
}

std::vector<Action> AgentState::BeginStop(int signal) {
  if (phase_ == Phase::kStopping) return {};
  phase_ = Phase::kStopping;
  return {action::StopWorkers{signal}};
}

std::vector<Action> AgentState::ExitNow(int code, std::string summary) {
  phase_ = Phase::kExited;
  return {action::Exit{code, std::move(summary)}};
}

}  // namespace meshrun::agent
