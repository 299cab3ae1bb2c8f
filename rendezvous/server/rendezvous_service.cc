#include "rendezvous/server/rendezvous_service.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <deque>
#include <limits>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "rendezvous/core/health_summary.h"
#include "rendezvous/core/request_validation.h"
#include "rendezvous/core/state_codec.h"
#include "rendezvous/server/grpc_status.h"
#include "rendezvous/status/status_proto.h"

namespace meshrun::rdzv {

namespace v1 = meshrun::v1;

namespace {

// The step times the run's nodes sent last, of every rank, in one list.
std::vector<RankStepTime> EveryRank(
    const std::map<std::string, std::vector<RankStepTime>>& by_node) {
  std::vector<RankStepTime> every;
  for (const auto& [node_id, ranks] : by_node)
    every.insert(every.end(), ranks.begin(), ranks.end());
  return every;
}

grpc::ServerUnaryReactor* Done(grpc::CallbackServerContext* context,
                               const absl::Status& status) {
  auto* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpc(status));
  return reactor;
}

Outcome FromProto(v1::RunOutcome outcome) {
  switch (outcome) {
    case v1::OUTCOME_SUCCEEDED:
      return Outcome::kSucceeded;
    case v1::OUTCOME_FAILED:
      return Outcome::kFailed;
    default:
      return Outcome::kAborted;
  }
}

v1::RunOutcome ToProto(Outcome outcome) {
  switch (outcome) {
    case Outcome::kSucceeded:
      return v1::OUTCOME_SUCCEEDED;
    case Outcome::kFailed:
      return v1::OUTCOME_FAILED;
    case Outcome::kAborted:
      return v1::OUTCOME_ABORTED;
  }
  return v1::OUTCOME_UNSPECIFIED;
}

v1::ReformReason ToProto(ReformReason reason) {
  switch (reason) {
    case ReformReason::kNodesWaiting:
      return v1::REFORM_NODES_WAITING;
    case ReformReason::kNodeExpired:
      return v1::REFORM_NODE_EXPIRED;
    case ReformReason::kNodeLeft:
      return v1::REFORM_NODE_LEFT;
    case ReformReason::kWorkerFailure:
      return v1::REFORM_WORKER_FAILURE;
  }
  return v1::REFORM_UNSPECIFIED;
}

RunOptions FromProto(const v1::RunConfig& config) {
  RunOptions options;
  options.min_nodes = config.min_nodes();
  options.max_nodes = config.max_nodes();
  options.max_restarts = config.max_restarts();
  // Zero means "the default" for the timeouts, as in torchrun's rdzv-conf.
  if (config.last_call_timeout_ms() > 0 || config.min_nodes() == config.max_nodes())
    options.last_call_timeout = Millis(config.last_call_timeout_ms());
  if (config.join_timeout_ms() > 0)
    options.join_timeout = Millis(config.join_timeout_ms());
  if (config.keep_alive_interval_ms() > 0)
    options.keep_alive_interval = Millis(config.keep_alive_interval_ms());
  if (config.keep_alive_max_attempt() > 0)
    options.keep_alive_max_attempt = config.keep_alive_max_attempt();
  options.uniform_nproc = config.uniform_nproc();
  options.replica_size = config.replica_size();
  return options;
}

v1::RendezvousEvent ToProto(const NodeEvent& event) {
  v1::RendezvousEvent out;
  switch (event.kind) {
    case NodeEvent::Kind::kWaiting:
      out.mutable_waiting()->set_round(event.round);
      break;
    case NodeEvent::Kind::kAssigned: {
      const Assignment& a = event.assignment;
      auto* m = out.mutable_assigned();
      m->set_round(a.round);
      m->set_group_rank(a.group_rank);
      m->set_group_world_size(a.group_world_size);
      m->set_rank_base(a.rank_base);
      m->set_world_size(a.world_size);
      m->set_restart_count(a.restart_count);
      m->set_store_prefix(a.store_prefix);
      m->set_admission_epoch(a.admission_epoch);
      for (const ParticipantView& p : a.participants) {
        auto* q = m->add_participants();
        q->set_node_id(p.node_id);
        q->set_host(p.host);
        q->set_group_rank(p.group_rank);
        q->set_nproc(p.nproc);
        q->set_rank_base(p.rank_base);
        q->set_master_port(p.master_port);
      }
      if (a.roster && !a.roster->empty()) {
        m->set_master_host(a.roster->front().host);
        m->set_master_port(a.roster->front().master_port);
      }
      break;
    }
    case NodeEvent::Kind::kReform:
      out.mutable_reform()->set_next_round(event.round);
      out.mutable_reform()->set_reason(ToProto(event.reason));
      out.mutable_reform()->set_detail(event.detail);
      break;
    case NodeEvent::Kind::kClosed:
      out.mutable_closed()->set_outcome(ToProto(event.outcome));
      out.mutable_closed()->set_reason(event.detail);
      break;
    case NodeEvent::Kind::kJoinTimeout:
      out.mutable_closed()->set_outcome(v1::OUTCOME_ABORTED);
      out.mutable_closed()->set_reason(event.detail.empty()
                                           ? "not enough nodes joined within join_timeout"
                                           : event.detail);
      break;
  }
  return out;
}

bool IsTerminal(NodeEvent::Kind kind) {
  return kind == NodeEvent::Kind::kClosed || kind == NodeEvent::Kind::kJoinTimeout;
}

}  // namespace

// One node's Join stream: events are queued and written one at a time; a
// terminal event (closed, join timeout) ends the stream once written. With a
// state log, a held stream writes nothing until the state its events report
// is durable (Hold, then Release from the log's flusher), so an agent never
// acts on a round that a daemon restarted from that state (or the next
// leader on etcd) would not know. gRPC calls are made outside mu_, since a
// reaction may run inline.
class RendezvousService::JoinStream final
    : public grpc::ServerWriteReactor<v1::RendezvousEvent> {
 public:
  JoinStream(RendezvousService* service, NodeKey node)
      : service_(service), node_(std::move(node)) {}

  // REQUIRES: the service's mu_ held and this stream registered (alive).
  void Push(v1::RendezvousEvent event, bool terminal) {
    v1::RendezvousEvent* to_write = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (finish_requested_) return;
      events_.push_back(std::move(event));
      finish_requested_ = terminal;
      to_write = NextWriteLocked();
    }
    if (to_write) StartWrite(to_write);
  }

  // Until the matching Release(), events queued are not written (and the
  // stream does not finish). REQUIRES: the service's mu_ held and this
  // stream registered (alive).
  void Hold() {
    std::lock_guard<std::mutex> lock(mu_);
    ++holds_;
  }
  void Release() {
    v1::RendezvousEvent* to_write = nullptr;
    bool finish;
    {
      std::lock_guard<std::mutex> lock(mu_);
      --holds_;
      to_write = NextWriteLocked();
      finish = ShouldFinishLocked();
    }
    if (to_write) StartWrite(to_write);
    if (finish) Finish(final_status_);
  }

  // Ends the stream after the queued events (replaced by a newer join, left,
  // refused, or cancelled).
  void End(const grpc::Status& status) {
    bool finish;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!finish_requested_) final_status_ = status;
      finish_requested_ = true;
      finish = ShouldFinishLocked();
    }
    if (finish) Finish(final_status_);
  }

  void OnWriteDone(bool ok) override {
    v1::RendezvousEvent* next = nullptr;
    bool finish;
    {
      std::lock_guard<std::mutex> lock(mu_);
      events_.pop_front();
      if (ok && !events_.empty()) {
        next = &events_.front();
      } else {
        writing_ = false;
        if (!ok) events_.clear();
      }
      finish = ShouldFinishLocked();
    }
    if (next) StartWrite(next);
    if (finish) Finish(final_status_);
  }

  void OnCancel() override { service_->StreamBroken(node_, this); }

  void OnDone() override { delete this; }

 private:
  // The event to start writing now, if any. REQUIRES: mu_ held.
  v1::RendezvousEvent* NextWriteLocked() {
    if (writing_ || holds_ > 0 || events_.empty()) return nullptr;
    writing_ = true;
    return &events_.front();
  }
  // REQUIRES: mu_ held. True exactly once: when the caller must Finish().
  bool ShouldFinishLocked() {
    if (finished_ || !finish_requested_ || writing_ || holds_ > 0) return false;
    finished_ = true;
    return true;
  }

  RendezvousService* const service_;
  const NodeKey node_;
  std::mutex mu_;
  std::deque<v1::RendezvousEvent> events_;        // guarded by mu_
  bool writing_ = false;                          // guarded by mu_
  int holds_ = 0;                                 // guarded by mu_
  bool finish_requested_ = false;                 // guarded by mu_
  bool finished_ = false;                         // guarded by mu_
  grpc::Status final_status_ = grpc::Status::OK;  // guarded by mu_ until finished_
};

RendezvousService::RendezvousService(RendezvousServiceOptions options)
    : options_(std::move(options)),
      tcpstore_owner_(options_.tcpstore_run),
      next_sweep_(DeadlineTimer::TimePoint::max()) {
  timer_ = std::make_unique<DeadlineTimer>(
      [this](DeadlineTimer::TimePoint now) { return Tick(now); });
}

RendezvousService::~RendezvousService() { timer_.reset(); }

grpc::ServerWriteReactor<v1::RendezvousEvent>* RendezvousService::Join(
    grpc::CallbackServerContext* /*context*/, const v1::JoinRequest* request) {
  NodeKey key{request->run_id(), request->node_id()};
  auto* stream = new JoinStream(this, key);
  if (absl::Status invalid = ValidateJoin(*request, RequestLimits()); !invalid.ok()) {
    stream->End(ToGrpc(invalid));
    return stream;
  }
  NodeInfo node;
  node.node_id = request->node_id();
  node.host = request->host();
  node.nproc = request->nproc();
  node.node_rank_hint = request->node_rank_hint();
  node.master_port = request->master_port();
  node.resume_round = request->resume_round();

  std::vector<NodeEvent> events;
  std::lock_guard<std::mutex> lock(mu_);
  const bool was_closed = state_.IsClosed(request->run_id());
  absl::Status status = state_.Join(request->run_id(), node, FromProto(request->config()),
                                    RdzvClock::now(), &events);
  // A new incarnation began: the old one's failure and exits are not its.
  if (was_closed && !state_.IsClosed(request->run_id()))
    observed_.erase(request->run_id());
  if (!status.ok()) {
    stream->End(ToGrpc(status));
    return stream;
  }
  // A node that passed its health checks and joined is not unhealthy.
  if (auto run = observed_.find(request->run_id()); run != observed_.end())
    run->second.unhealthy.erase(request->node_id());
  auto it = streams_.find(key);
  if (it != streams_.end()) {
    it->second->End(grpc::Status(grpc::StatusCode::ABORTED,
                                 "replaced by a newer join of the same node"));
    it->second = stream;
  } else {
    streams_.emplace(key, stream);
  }
  DispatchLocked(events);
  PokeTimerLocked();
  return stream;
}

void RendezvousService::DispatchLocked(std::vector<NodeEvent>& events) {
  // Whatever call lost a node's slot, the step quorum stops waiting for its
  // replica groups at once.
  for (const LostReplicaGroup& lost : state_.TakeLostReplicaGroups())
    quorum_.ReplicaFailed(lost.run_id, lost.replica, ReplicaQuorum::Loss::kNodeLost);
  std::set<JoinStream*> held;
  for (const NodeEvent& event : events) {
    auto it = streams_.find({event.run_id, event.node_id});
    if (it == streams_.end()) continue;  // the node's stream is already gone
    bool terminal = IsTerminal(event.kind);
    v1::RendezvousEvent message = ToProto(event);
    if (message.has_assigned()) {
      message.mutable_assigned()->set_serves_tcpstore(
          options_.serves_tcpstore &&
          tcpstore_owner_.Claim(event.run_id, state_.LiveStorePrefixes()));
    }
    if (log_ && held.insert(it->second).second) it->second->Hold();
    it->second->Push(std::move(message), terminal);
    // Once a terminal event is queued the stream finishes by itself, so it
    // must not be reachable any more.
    if (terminal) streams_.erase(it);
  }
  if (held.empty()) return;
  // The events go out once the changes they report are durable (collected
  // by the log's flusher, which takes mu_ after this call releases it). A
  // held stream stays alive until its Release.
  log_->Poke();
  const StateLog::Mark mark = log_->Now();
  for (JoinStream* stream : held)
    log_->WhenDurable(mark, [stream] { stream->Release(); });
}

void RendezvousService::StreamBroken(const NodeKey& node, JoinStream* stream) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = streams_.find(node);
  if (it == streams_.end() || it->second != stream) {
    stream->End(grpc::Status::CANCELLED);
    return;
  }
  streams_.erase(it);
  stream->End(grpc::Status::CANCELLED);
  // A stream that broke (a reset, a cancel, the network) is not a node that
  // left: its agent keeps its workers running and re-opens the stream,
  // resuming its round, so the node stays until its lease runs out (its
  // heartbeats stop). Leaving is the Leave call; events meanwhile reach the
  // node when its stream is back (a resume re-sends its assignment).
}

std::optional<DeadlineTimer::TimePoint> RendezvousService::Tick(
    DeadlineTimer::TimePoint now) {
  std::vector<NodeEvent> events;
  std::vector<std::string> forgotten;
  std::optional<DeadlineTimer::TimePoint> next;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shutting_down_) return std::nullopt;
    state_.Tick(now, &events);
    DispatchLocked(events);
    if (log_) log_->Poke();
    // Closed runs are swept a few times per retention period (at most once
    // a minute), so one outlives its retention by at most that much.
    const auto sweep_every = std::min<DeadlineTimer::TimePoint::duration>(
        std::chrono::seconds(60),
        std::max<DeadlineTimer::TimePoint::duration>(std::chrono::seconds(1),
                                                     options_.closed_run_retention / 4));
    if (next_sweep_ == DeadlineTimer::TimePoint::max()) next_sweep_ = now + sweep_every;
    if (now >= next_sweep_) {
      forgotten = state_.ForgetClosedBefore(now - options_.closed_run_retention);
      for (const std::string& run_id : forgotten) {
        observed_.erase(run_id);
        quorum_.DropRun(run_id);
      }
      next_sweep_ = now + sweep_every;
    }
    next = state_.NextDeadline();
    if (!next || next_sweep_ < *next) next = next_sweep_;
  }
  if (!forgotten.empty() && options_.on_runs_forgotten)
    options_.on_runs_forgotten(forgotten);
  return next;
}

void RendezvousService::PokeTimerLocked() {
  if (auto next = state_.NextDeadline()) timer_->Poke(*next);
  // Heartbeats change nothing that is persisted; a poke without changes
  // costs the flusher one empty pass.
  if (log_) log_->Poke();
}

void RendezvousService::set_state_log(StateLog* log) {
  std::lock_guard<std::mutex> lock(mu_);
  log_ = log;
  state_.set_track_changes(log != nullptr);
}

void RendezvousService::CollectChanges(StateLog& log) {
  std::lock_guard<std::mutex> lock(mu_);
  const RdzvTime now = RdzvClock::now();
  for (const std::string& run_id : state_.TakeChangedRuns()) {
    log.Append(codec::RunRecord(state_, run_id, now));
  }
}

void RendezvousService::WithState(const std::function<void(RendezvousState&)>& fn) {
  std::lock_guard<std::mutex> lock(mu_);
  fn(state_);
}

void RendezvousService::BeginShutdown() {
  std::lock_guard<std::mutex> lock(mu_);
  shutting_down_ = true;
  // Parked quorum calls would hold the server's shutdown up; their workers
  // retry against the restarted daemon.
  quorum_.CancelAll();
}

void RendezvousService::Restored() {
  std::lock_guard<std::mutex> lock(mu_);
  if (auto next = state_.NextDeadline()) timer_->Poke(*next);
}

grpc::ServerUnaryReactor* RendezvousService::Heartbeat(
    grpc::CallbackServerContext* context, const v1::HeartbeatRequest* request,
    v1::HeartbeatReply* reply) {
  if (absl::Status invalid = ValidateHeartbeat(*request, RequestLimits()); !invalid.ok())
    return Done(context, invalid);
  std::lock_guard<std::mutex> lock(mu_);
  auto status = state_.Heartbeat(request->run_id(), request->node_id(), RdzvClock::now());
  if (status.ok()) {
    reply->set_round(status->round);
    reply->set_restart_count(status->restart_count);
    reply->set_run_closed(status->closed);
    if (request->step_times_size() > 0) NoteStepTimesLocked(*request);
  }
  // Only the timer: a lease is not persisted, so the log has nothing to do.
  if (auto next = state_.NextDeadline()) timer_->Poke(*next);
  return Done(context, status.status());
}

void RendezvousService::NoteStepTimesLocked(const v1::HeartbeatRequest& request) {
  Observed& run = observed_[request.run_id()];
  std::vector<RankStepTime>& node = run.step_times[request.node_id()];
  node.clear();
  for (const v1::RankStepTime& step : request.step_times())
    node.push_back(
        {step.rank(), step.mean_seconds(), step.steps(), request.node_id(), ""});
  std::set<uint32_t> slow_now;
  for (const SlowRank& slow : SlowRanks(EveryRank(run.step_times))) {
    slow_now.insert(slow.rank.rank);
    if (run.slow_logged.count(slow.rank.rank) > 0) continue;
    spdlog::warn(
        "run {}: rank {} on node {} takes {:.1f} ms a step, {:.2f}x the median of the "
        "run's ranks: a straggler",
        request.run_id(), slow.rank.rank, slow.rank.node_id,
        slow.rank.mean_seconds * 1000, slow.times_median);
  }
  run.slow_logged = std::move(slow_now);
}

grpc::ServerUnaryReactor* RendezvousService::ReportFailure(
    grpc::CallbackServerContext* context, const v1::FailureReport* request,
    v1::FailureReply* reply) {
  if (absl::Status invalid = ValidateFailureReport(*request, RequestLimits());
      !invalid.ok())
    return Done(context, invalid);
  std::vector<NodeEvent> events;
  std::lock_guard<std::mutex> lock(mu_);
  auto verdict =
      request->has_replica()
          ? state_.ReportReplicaFailure(
                request->run_id(), request->node_id(), request->round(),
                request->replica(),
                request->has_replica_restarts()
                    ? std::optional<uint32_t>(request->replica_restarts())
                    : std::nullopt,
                request->detail(), RdzvClock::now(), &events)
          : state_.ReportFailure(request->run_id(), request->node_id(), request->round(),
                                 request->detail(), RdzvClock::now(), &events);
  if (verdict.ok()) {
    reply->set_will_restart(verdict->will_restart);
    reply->set_restart_count(verdict->restart_count);
  }
  if (verdict.ok() && verdict->counted) {
    FailureStatusRecord& failure = observed_[request->run_id()].last_failure.emplace();
    failure.round = request->round();
    failure.node_id = request->node_id();
    failure.host = request->cause().host();
    failure.detail = request->detail();
    if (request->has_cause()) failure.cause = FromProto(request->cause());
    if (request->has_replica())
      ReplicaFailedLocked(request->run_id(), request->replica());
  }
  DispatchLocked(events);
  PokeTimerLocked();
  return Done(context, verdict.status());
}

absl::StatusOr<uint64_t> RendezvousService::RoundInProgress(const std::string& run_id) {
  std::lock_guard<std::mutex> lock(mu_);
  std::optional<RunSummary> run = state_.Summary(run_id);
  if (!run)
    return absl::NotFoundError("run '" + run_id + "' is not known to this daemon");
  if (state_.IsClosed(run_id))
    return absl::FailedPreconditionError("run '" + run_id + "' has ended");
  return run->round;
}

absl::StatusOr<uint64_t> RendezvousService::RoundOfCaller(const std::string& run_id,
                                                          uint64_t rank,
                                                          uint64_t admission) {
  absl::StatusOr<uint64_t> round = RoundInProgress(run_id);
  if (!round.ok() || admission == 0) return round;
  // Checked again under the lock, with the round: the slot may have changed
  // hands in between.
  std::lock_guard<std::mutex> lock(mu_);
  absl::Status checked =
      state_.CheckAdmission(run_id,
                            static_cast<uint32_t>(std::min<uint64_t>(
                                rank, std::numeric_limits<uint32_t>::max())),
                            admission);
  if (!checked.ok()) {
    return absl::Status(checked.code(), absl::StrCat("quorum: ", checked.message()));
  }
  std::optional<RunSummary> run = state_.Summary(run_id);
  if (!run)
    return absl::NotFoundError("run '" + run_id + "' is not known to this daemon");
  return run->round;
}

void RendezvousService::ReplicaFailedLocked(const std::string& run_id, uint32_t replica) {
  quorum_.ReplicaFailed(run_id, replica, ReplicaQuorum::Loss::kRestarting);
}

grpc::ServerUnaryReactor* RendezvousService::Quorum(grpc::CallbackServerContext* context,
                                                    const v1::QuorumRequest* request,
                                                    v1::QuorumReply* reply) {
  if (absl::Status invalid = ValidateQuorumRequest(*request, RequestLimits());
      !invalid.ok())
    return Done(context, invalid);
  absl::StatusOr<uint64_t> round =
      RoundOfCaller(request->run_id(),
                    static_cast<uint64_t>(request->replica()) * request->replica_size() +
                        request->member(),
                    request->admission_epoch());
  if (!round.ok()) return Done(context, round.status());
  auto* reactor = context->DefaultReactor();
  quorum_.Quorum(reactor, *request, *round, reply);
  return reactor;
}

grpc::ServerUnaryReactor* RendezvousService::Commit(grpc::CallbackServerContext* context,
                                                    const v1::CommitRequest* request,
                                                    v1::CommitReply* reply) {
  if (absl::Status invalid = ValidateCommitRequest(*request, RequestLimits());
      !invalid.ok())
    return Done(context, invalid);
  absl::StatusOr<uint64_t> round = RoundInProgress(request->run_id());
  if (!round.ok()) return Done(context, round.status());
  auto* reactor = context->DefaultReactor();
  quorum_.Commit(reactor, *request, *round, reply);
  return reactor;
}

grpc::ServerUnaryReactor* RendezvousService::ReportSuccess(
    grpc::CallbackServerContext* context, const v1::SuccessReport* request,
    v1::Empty* /*reply*/) {
  if (absl::Status invalid = ValidateSuccessReport(*request, RequestLimits());
      !invalid.ok())
    return Done(context, invalid);
  std::vector<NodeEvent> events;
  std::lock_guard<std::mutex> lock(mu_);
  absl::Status status = state_.ReportSuccess(request->run_id(), request->node_id(),
                                             request->round(), RdzvClock::now(), &events);
  DispatchLocked(events);
  PokeTimerLocked();
  return Done(context, status);
}

grpc::ServerUnaryReactor* RendezvousService::Leave(grpc::CallbackServerContext* context,
                                                   const v1::LeaveRequest* request,
                                                   v1::Empty* /*reply*/) {
  if (absl::Status invalid = ValidateLeave(*request, RequestLimits()); !invalid.ok())
    return Done(context, invalid);
  std::vector<NodeEvent> events;
  std::lock_guard<std::mutex> lock(mu_);
  absl::Status status =
      state_.Leave(request->run_id(), request->node_id(), RdzvClock::now(), &events);
  DispatchLocked(events);
  // The leaver's own stream ends cleanly; it is no longer a member.
  auto it = streams_.find({request->run_id(), request->node_id()});
  if (status.ok() && it != streams_.end()) {
    it->second->End(grpc::Status::OK);
    streams_.erase(it);
  }
  PokeTimerLocked();
  return Done(context, status);
}

grpc::ServerUnaryReactor* RendezvousService::Close(grpc::CallbackServerContext* context,
                                                   const v1::CloseRequest* request,
                                                   v1::Empty* /*reply*/) {
  if (absl::Status invalid = ValidateClose(*request, RequestLimits()); !invalid.ok())
    return Done(context, invalid);
  std::vector<NodeEvent> events;
  std::lock_guard<std::mutex> lock(mu_);
  absl::Status status = state_.Close(request->run_id(), FromProto(request->outcome()),
                                     request->reason(), RdzvClock::now(), &events);
  DispatchLocked(events);
  PokeTimerLocked();
  return Done(context, status);
}

grpc::ServerUnaryReactor* RendezvousService::ReportWorkerExits(
    grpc::CallbackServerContext* context, const v1::WorkerExitsReport* request,
    v1::Empty* /*reply*/) {
  if (absl::Status invalid = ValidateWorkerExitsReport(*request, RequestLimits());
      !invalid.ok())
    return Done(context, invalid);
  std::lock_guard<std::mutex> lock(mu_);
  // Only runs and nodes the daemon knows, so a stray client cannot grow this.
  if (!state_.HasNode(request->run_id(), request->node_id())) {
    return Done(context,
                absl::NotFoundError("node " + request->node_id() +
                                    " is not enrolled in run " + request->run_id()));
  }
  NodeExitsRecord& record = observed_[request->run_id()].exits[request->node_id()];
  record.node_id = request->node_id();
  record.host = request->host();
  record.round = request->round();
  record.exits.clear();
  for (const v1::WorkerExit& exit : request->exits()) {
    record.exits.push_back(FromProto(exit));
    worker_exits_[exit.signal() != 0 ? 2 : exit.exit_code() != 0 ? 1 : 0].Inc();
  }
  return Done(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* RendezvousService::ReportHealth(
    grpc::CallbackServerContext* context, const v1::HealthReport* request,
    v1::Empty* /*reply*/) {
  if (absl::Status invalid = ValidateHealthReport(*request, RequestLimits());
      !invalid.ok())
    return Done(context, invalid);
  // At most this many unhealthy nodes shown per run: the latest reports.
  constexpr size_t kMaxUnhealthyPerRun = 64;
  std::lock_guard<std::mutex> lock(mu_);
  // Only runs the daemon knows, so a stray client cannot grow this.
  if (!state_.HasRun(request->run_id()))
    return Done(context,
                absl::NotFoundError("the daemon knows no run " + request->run_id()));
  auto& unhealthy = observed_[request->run_id()].unhealthy;
  NodeStatusRecord record;
  record.node_id = request->node_id();
  record.host = request->host();
  record.state = "unhealthy";
  record.health = HealthSummary(request->check(), request->outcome(), request->output());
  unhealthy[request->node_id()] = {record, RdzvClock::now()};
  while (unhealthy.size() > kMaxUnhealthyPerRun) {
    auto oldest = std::min_element(
        unhealthy.begin(), unhealthy.end(),
        [](auto& a, auto& b) { return a.second.second < b.second.second; });
    unhealthy.erase(oldest);
  }
  return Done(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* RendezvousService::Status(grpc::CallbackServerContext* context,
                                                    const v1::StatusRequest* request,
                                                    v1::StatusReply* reply) {
  if (absl::Status invalid = ValidateStatusRequest(*request, RequestLimits());
      !invalid.ok())
    return Done(context, invalid);
  StatusSnapshot snapshot = Snapshot(request->run_id());
  if (!request->run_id().empty() && snapshot.runs.empty()) {
    return Done(context,
                absl::NotFoundError("the daemon knows no run " + request->run_id()));
  }
  *reply = ToProto(snapshot);
  return Done(context, absl::OkStatus());
}

StatusSnapshot RendezvousService::Snapshot(const std::string& run_id) {
  // The quorum's lock before mu_ is taken (mu_ -> quorum_ is the order).
  StatusSnapshot snapshot = SnapshotWithLags(run_id, quorum_.LagsByRun());
  if (options_.annotate_status) options_.annotate_status(&snapshot);
  return snapshot;
}

StatusSnapshot RendezvousService::SnapshotWithLags(
    const std::string& run_id,
    const std::map<std::string, std::vector<ReplicaLag>>& lags) {
  StatusSnapshot snapshot;
  snapshot.now_unix_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                             std::chrono::system_clock::now().time_since_epoch())
                             .count();
  std::lock_guard<std::mutex> lock(mu_);
  const RdzvTime now = RdzvClock::now();
  snapshot.runs = state_.Status(now, run_id);
  for (RunStatusRecord& run : snapshot.runs) {
    // The status shows the slowest few; /metrics has every group.
    constexpr size_t kStragglersShown = 3;
    if (auto lag = lags.find(run.run_id); lag != lags.end()) {
      for (size_t i = 0; i < lag->second.size() && i < kStragglersShown; ++i) {
        const ReplicaLag& l = lag->second[i];
        run.stragglers.push_back(
            {l.replica, l.mean_lag_ms, l.last_lag_ms, l.quorums, l.slowest});
      }
    }
    auto it = observed_.find(run.run_id);
    if (it == observed_.end()) continue;
    for (const SlowRank& slow : SlowRanks(EveryRank(it->second.step_times))) {
      SlowRankRecord record{slow.rank.rank,         slow.rank.node_id, "",
                            slow.rank.mean_seconds, slow.times_median, slow.rank.steps};
      for (const NodeStatusRecord& node : run.nodes)
        if (node.node_id == record.node_id) record.host = node.host;
      run.slow_ranks.push_back(std::move(record));
    }
    run.last_failure = it->second.last_failure;
    for (const auto& [node_id, exits] : it->second.exits)
      run.worker_exits.push_back(exits);
    for (const auto& [node_id, reported] : it->second.unhealthy) {
      NodeStatusRecord node = reported.first;
      node.heartbeat_age_ms =
          std::chrono::duration_cast<std::chrono::milliseconds>(now - reported.second)
              .count();
      run.nodes.push_back(std::move(node));
    }
  }
  return snapshot;
}

void RendezvousService::CollectMetrics(std::vector<MetricFamily>* out) {
  // One read of the lags serves the status's stragglers and the gauges below.
  const std::map<std::string, std::vector<ReplicaLag>> lags = quorum_.LagsByRun();
  StatusSnapshot snapshot = SnapshotWithLags("", lags);
  RendezvousStats stats;
  size_t streams;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats = state_.stats();
    streams = streams_.size();
  }
  auto counter = [&](const char* name, const char* help, uint64_t value) {
    MetricFamily& family = out->emplace_back(name, help, "counter");
    family.Add({}, static_cast<double>(value));
  };
  std::map<std::string, int> by_state{{"gathering", 0}, {"active", 0}, {"closed", 0}};
  MetricFamily round{"meshrun_run_round", "The run's current round number.", "gauge"};
  MetricFamily restarts_used{"meshrun_run_restarts",
                             "Restarts the run has used of its --max-restarts budget.",
                             "gauge"};
  MetricFamily nodes{"meshrun_run_nodes", "Nodes known to the run, by state.", "gauge"};
  MetricFamily world{"meshrun_run_world_size", "Workers in the run's current round.",
                     "gauge"};
  for (const RunStatusRecord& run : snapshot.runs) {
    ++by_state[run.state];
    const Labels labels{{"run", run.run_id}};
    round.Add(labels, static_cast<double>(run.round));
    restarts_used.Add(labels, run.restart_count);
    world.Add(labels, run.world_size);
    std::map<std::string, int> node_states{{"participant", 0},
                                           {"gathering", 0},
                                           {"waiting", 0},
                                           {"succeeded", 0},
                                           {"unhealthy", 0}};
    for (const NodeStatusRecord& node : run.nodes) ++node_states[node.state];
    for (const auto& [state, n] : node_states)
      nodes.Add({{"run", run.run_id}, {"state", state}}, n);
  }
  MetricFamily runs{"meshrun_runs", "Runs the daemon knows, by state.", "gauge"};
  for (const auto& [state, n] : by_state) runs.Add({{"state", state}}, n);
  out->push_back(std::move(runs));
  out->push_back(std::move(round));
  out->push_back(std::move(restarts_used));
  out->push_back(std::move(nodes));
  out->push_back(std::move(world));

  counter("meshrun_runs_created_total", "Runs created (first join).", stats.runs_created);
  MetricFamily closed{"meshrun_runs_closed_total", "Runs closed, by outcome.", "counter"};
  for (Outcome outcome : {Outcome::kSucceeded, Outcome::kFailed, Outcome::kAborted})
    closed.Add({{"outcome", ToString(outcome)}},
               static_cast<double>(stats.runs_closed[static_cast<size_t>(outcome)]));
  out->push_back(std::move(closed));
  counter("meshrun_rounds_completed_total", "Rendezvous rounds completed (formed).",
          stats.rounds_completed);
  counter("meshrun_joins_total", "Joins accepted (re-joins included).", stats.joins);
  counter("meshrun_joins_refused_total",
          "Joins refused (bad request, closed run, option mismatch).",
          stats.joins_refused);
  counter("meshrun_join_timeouts_total",
          "Rounds that gathered too few nodes within join_timeout.", stats.join_timeouts);
  counter("meshrun_heartbeats_total", "Heartbeats received from enrolled nodes.",
          stats.heartbeats);
  counter("meshrun_heartbeats_late_total",
          "Heartbeats that came over 1.5 keep-alive intervals after the node's last "
          "contact.",
          stats.heartbeats_late);
  counter("meshrun_heartbeats_expired_total",
          "Leases that ran out (a node missed keep_alive_max_attempt heartbeats).",
          stats.leases_expired);
  MetricFamily restarts{"meshrun_restarts_total",
                        "Re-forms of a running round, by cause, and replica groups "
                        "restarted alone (replica failure; --restart-scope=replica); "
                        "only worker and replica failures count against "
                        "--max-restarts.",
                        "counter"};
  for (ReformReason reason : {ReformReason::kWorkerFailure, ReformReason::kNodeExpired,
                              ReformReason::kNodeLeft, ReformReason::kNodesWaiting})
    restarts.Add({{"cause", ToString(reason)}},
                 static_cast<double>(stats.reforms[static_cast<size_t>(reason)]));
  restarts.Add({{"cause", "replica failure"}},
               static_cast<double>(stats.replica_restarts));
  out->push_back(std::move(restarts));
  counter("meshrun_joins_into_active_round_total",
          "Nodes whose replica groups joined a running round without a re-form "
          "(--restart-scope=replica).",
          stats.joins_into_active_round);
  counter("meshrun_nodes_dropped_from_active_round_total",
          "Nodes lost (expired or left) whose replica groups dropped out of a running "
          "round without a re-form (--restart-scope=replica).",
          stats.nodes_dropped_from_active_round);
  counter("meshrun_failure_reports_total",
          "Worker-failure reports from agents (several nodes may report one failure).",
          stats.failure_reports);
  MetricFamily exits{"meshrun_worker_exits_total",
                     "Worker process exits reported by agents, by result.", "counter"};
  const char* kResults[] = {"success", "exit_code", "signal"};
  for (size_t i = 0; i < worker_exits_.size(); ++i)
    exits.Add({{"result", kResults[i]}}, static_cast<double>(worker_exits_[i].value()));
  out->push_back(std::move(exits));
  MetricFamily quorum{
      "meshrun_run_step_quorum_waiting",
      "Workers of the run's fault-tolerant replicas waiting now for a step's "
      "quorum to form (call=quorum) or for its commit decision "
      "(call=commit).",
      "gauge"};
  for (const auto& [run_id, waiting] : quorum_.WaitingByRun()) {
    quorum.Add({{"run", run_id}, {"call", "quorum"}},
               static_cast<double>(waiting.quorum));
    quorum.Add({{"run", run_id}, {"call", "commit"}},
               static_cast<double>(waiting.commit));
  }
  out->push_back(std::move(quorum));
  MetricFamily lag{"meshrun_replica_quorum_lag_seconds",
                   "How far each fault-tolerant replica group reaches the step quorum "
                   "behind the first group, mean over its last 100 quorums.",
                   "gauge"};
  MetricFamily last{"meshrun_replica_quorum_last_total",
                    "Step quorums each replica group was the last to reach.", "counter"};
  for (const auto& [run_id, groups] : lags) {
    for (const ReplicaLag& group : groups) {
      const Labels labels{{"run", run_id}, {"replica", std::to_string(group.replica)}};
      lag.Add(labels, group.mean_lag_ms / 1000.0);
      last.Add(labels, static_cast<double>(group.slowest));
    }
  }
  out->push_back(std::move(lag));
  out->push_back(std::move(last));
  MetricFamily step{
      "meshrun_rank_step_seconds",
      "Each rank's step time as its worker reports it "
      "(meshrun.heartbeat(step_seconds=...)), mean over its last 100 steps.",
      "gauge"};
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [run_id, run] : observed_) {
      for (const RankStepTime& rank : EveryRank(run.step_times))
        step.Add({{"run", run_id}, {"rank", std::to_string(rank.rank)}},
                 rank.mean_seconds);
    }
  }
  out->push_back(std::move(step));
  MetricFamily open{"meshrun_join_streams_open",
                    "Agents' Join streams open now (nodes connected).", "gauge"};
  open.Add({}, static_cast<double>(streams));
  out->push_back(std::move(open));
}

std::map<std::string, std::string> RendezvousService::LiveStorePrefixes() {
  std::lock_guard<std::mutex> lock(mu_);
  return state_.LiveStorePrefixes();
}

absl::StatusOr<std::string> RendezvousService::TcpStoreNamespace() {
  std::lock_guard<std::mutex> lock(mu_);
  return tcpstore_owner_.Namespace(state_.LiveStorePrefixes());
}

std::optional<RunSummary> RendezvousService::Summary(const std::string& run_id) {
  std::lock_guard<std::mutex> lock(mu_);
  return state_.Summary(run_id);
}

std::vector<std::string> RendezvousService::RunIds() {
  std::lock_guard<std::mutex> lock(mu_);
  return state_.RunIds();
}

}  // namespace meshrun::rdzv
