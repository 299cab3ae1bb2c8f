#include "rendezvous/server/quorum_server.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdlib>
#include <utility>

#include "absl/strings/numbers.h"
#include "rendezvous/server/grpc_status.h"

namespace meshrun::rdzv {

namespace v1 = meshrun::v1;

namespace {

uint64_t FirstId() {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count();
  return static_cast<uint64_t>(ms) << 12;
}

uint64_t SplitCommitFromEnvironment() {
  const char* value = std::getenv("MESHRUN_TEST_HOOK_SPLIT_COMMIT");
  uint64_t n = 0;
  if (value == nullptr || !absl::SimpleAtoi(value, &n)) return 0;
  spdlog::warn(
      "test hook MESHRUN_TEST_HOOK_SPLIT_COMMIT={}: the answers of committed "
      "step {} will be held back from all but one voter",
      n, n);
  return n;
}

RdzvTime DeadlineIn(uint32_t timeout_ms) {
  return RdzvClock::now() + std::chrono::milliseconds(timeout_ms);
}

}  // namespace

QuorumServer::QuorumServer()
    : next_first_id_(FirstId()), split_commit_(SplitCommitFromEnvironment()) {
  timer_ = std::make_unique<DeadlineTimer>(
      [this](DeadlineTimer::TimePoint now) { return Tick(now); });
}

QuorumServer::~QuorumServer() {
  timer_.reset();
  CancelAll();
}

ReplicaQuorum& QuorumServer::RunLocked(const std::string& run_id, uint64_t round,
                                       std::vector<QuorumAnswer>* answers) {
  Run& run = runs_[run_id];
  if (!run.quorum || run.round != round) {
    if (run.quorum) {
      run.quorum->CancelAll(answers);
      next_first_id_ = run.quorum->next_id();
    }
    run.round = round;
    run.quorum = std::make_unique<ReplicaQuorum>(next_first_id_);
  }
  return *run.quorum;
}

void QuorumServer::Quorum(grpc::ServerUnaryReactor* reactor,
                          const v1::QuorumRequest& request, uint64_t round,
                          v1::QuorumReply* reply) {
  QuorumArrival arrival;
  arrival.replica = request.replica();
  arrival.member = request.member();
  arrival.replica_size = request.replica_size();
  arrival.num_replicas = request.num_replicas();
  arrival.committed_steps = request.committed_steps();
  arrival.incarnation = request.incarnation();
  arrival.finished = request.finished();
  arrival.admission = request.admission_epoch();
  Park({reactor, reply, nullptr, request.run_id()}, request.run_id(), round,
       [&](ReplicaQuorum& quorum, QuorumWaiter waiter,
           std::vector<QuorumAnswer>* answers) {
         absl::Status arrived =
             quorum.Arrive(arrival, waiter, DeadlineIn(request.timeout_ms()), answers);
         if (arrived.ok())
           runs_[request.run_id()].stragglers.Arrived(arrival.replica, RdzvClock::now());
         return arrived;
       });
}

void QuorumServer::Commit(grpc::ServerUnaryReactor* reactor,
                          const v1::CommitRequest& request, uint64_t round,
                          v1::CommitReply* reply) {
  Park({reactor, nullptr, reply, request.run_id(), {request.replica(), request.member()}},
       request.run_id(), round,
       [&](ReplicaQuorum& quorum, QuorumWaiter waiter,
           std::vector<QuorumAnswer>* answers) {
         return quorum.Vote(request.quorum_id(), request.replica(), request.member(),
                            request.ok(), request.admission_epoch(), waiter,
                            DeadlineIn(request.timeout_ms()), answers);
       });
}

void QuorumServer::Park(
    const Parked& parked, const std::string& run_id, uint64_t round,
    const std::function<absl::Status(ReplicaQuorum&, QuorumWaiter,
                                     std::vector<QuorumAnswer>*)>& call) {
  Finishes finishes;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const QuorumWaiter waiter = next_waiter_++;
    parked_[waiter] = parked;
    std::vector<QuorumAnswer> answers;
    absl::Status status = call(RunLocked(run_id, round, &answers), waiter, &answers);
    if (!status.ok()) answers.push_back({waiter, status});
    DeliverLocked(answers, &finishes);
    PokeLocked();
  }
  Finish(finishes);
}

void QuorumServer::ReplicaFailed(const std::string& run_id, uint32_t replica,
                                 ReplicaQuorum::Loss loss) {
  Finishes finishes;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = runs_.find(run_id);
    if (it == runs_.end()) return;  // not a fault-tolerant run (yet)
    std::vector<QuorumAnswer> answers;
    it->second.quorum->ReplicaFailed(replica, loss, &answers);
    DeliverLocked(answers, &finishes);
  }
  Finish(finishes);
}

void QuorumServer::DropRun(const std::string& run_id) {
  Finishes finishes;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = runs_.find(run_id);
    if (it == runs_.end()) return;
    std::vector<QuorumAnswer> answers;
    it->second.quorum->CancelAll(&answers);
    runs_.erase(it);
    DeliverLocked(answers, &finishes);
  }
  Finish(finishes);
}

void QuorumServer::CancelAll() {
  Finishes finishes;
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<QuorumAnswer> answers;
    for (auto& [run_id, run] : runs_) run.quorum->CancelAll(&answers);
    DeliverLocked(answers, &finishes);
    for (grpc::ServerUnaryReactor* reactor : held_reactors_) {
      finishes.emplace_back(
          reactor, grpc::Status(grpc::StatusCode::UNAVAILABLE, "the daemon is stopping"));
    }
    held_reactors_.clear();
  }
  Finish(finishes);
}

std::map<std::string, std::vector<ReplicaLag>> QuorumServer::LagsByRun() {
  std::lock_guard<std::mutex> lock(mu_);
  std::map<std::string, std::vector<ReplicaLag>> lags;
  for (const auto& [run_id, run] : runs_) lags[run_id] = run.stragglers.Lags();
  return lags;
}

void QuorumServer::NoteFormedLocked(const std::string& run_id,
                                    const QuorumFormed& formed) {
  auto it = runs_.find(run_id);
  // Every participant's waiter carries the same quorum: count it once.
  if (it == runs_.end() || it->second.last_formed == formed.quorum_id) return;
  it->second.last_formed = formed.quorum_id;
  if (std::optional<PersistentStraggler> straggler =
          it->second.stragglers.Formed(formed.participants)) {
    spdlog::warn(
        "run {}: replica group {} was the last to reach the step quorum at {} of the "
        "last "
        "{}, {:.1f} ms behind the first group on average: a straggler",
        run_id, straggler->replica, straggler->slowest_of_window,
        StragglerTracker::kWindow, straggler->mean_lag_ms);
  }
}

std::map<std::string, QuorumServer::Waiting> QuorumServer::WaitingByRun() {
  std::lock_guard<std::mutex> lock(mu_);
  std::map<std::string, Waiting> waiting;
  for (const auto& [waiter, parked] : parked_) {
    Waiting& run = waiting[parked.run_id];
    ++(parked.quorum_reply ? run.quorum : run.commit);
  }
  return waiting;
}

void QuorumServer::SplitCommitLocked(std::vector<QuorumAnswer>& answers) {
  // One decision at most commits per batch of answers (its voters'). The
  // held ones are taken out of parked_, so DeliverLocked skips them.
  std::vector<std::pair<std::pair<uint32_t, uint32_t>, QuorumWaiter>> voters;
  for (const QuorumAnswer& answer : answers) {
    auto* decision = std::get_if<CommitDecision>(&answer.result);
    auto it = parked_.find(answer.waiter);
    if (decision && decision->commit && it != parked_.end() && it->second.commit_reply)
      voters.emplace_back(it->second.voter, answer.waiter);
  }
  // A decision reaches its parked voters at once; a lone answer is a late
  // or repeated vote of a step decided before, not counted.
  if (voters.size() < 2 || ++commits_seen_ != split_commit_) return;
  std::sort(voters.begin(), voters.end());
  spdlog::warn("test hook: committed step {} answered to replica {} member {} only",
               commits_seen_, voters.front().first.first, voters.front().first.second);
  for (size_t i = 1; i < voters.size(); ++i) {
    auto it = parked_.find(voters[i].second);
    held_reactors_.push_back(it->second.reactor);
    parked_.erase(it);
  }
}

void QuorumServer::DeliverLocked(std::vector<QuorumAnswer>& answers, Finishes* finishes) {
  if (split_commit_ != 0) SplitCommitLocked(answers);
  for (QuorumAnswer& answer : answers) {
    auto it = parked_.find(answer.waiter);
    if (it == parked_.end()) continue;
    const Parked parked = it->second;
    parked_.erase(it);
    grpc::Status status = grpc::Status::OK;
    if (auto* formed = std::get_if<QuorumFormed>(&answer.result);
        formed && parked.quorum_reply) {
      NoteFormedLocked(parked.run_id, *formed);
      v1::QuorumReply& reply = *parked.quorum_reply;
      reply.set_quorum_id(formed->quorum_id);
      reply.set_group_id(formed->group_id);
      for (uint32_t r : formed->participants) reply.add_participants(r);
      reply.set_max_committed_steps(formed->max_committed_steps);
      reply.set_source_replica(formed->source_replica);
      reply.set_heal(formed->heal);
    } else if (auto* decision = std::get_if<CommitDecision>(&answer.result);
               decision && parked.commit_reply) {
      parked.commit_reply->set_commit(decision->commit);
      parked.commit_reply->set_reason(decision->reason);
    } else if (auto* error = std::get_if<absl::Status>(&answer.result)) {
      status = ToGrpc(*error);
    } else {
      status =
          grpc::Status(grpc::StatusCode::INTERNAL, "quorum: answer of the wrong kind");
    }
    finishes->emplace_back(parked.reactor, std::move(status));
  }
}

void QuorumServer::Finish(Finishes& finishes) {
  for (auto& [reactor, status] : finishes) reactor->Finish(status);
}

void QuorumServer::PokeLocked() {
  std::optional<RdzvTime> next;
  for (const auto& [run_id, run] : runs_) {
    auto deadline = run.quorum->NextDeadline();
    if (deadline && (!next || *deadline < *next)) next = deadline;
  }
  if (next) timer_->Poke(*next);
}

std::optional<DeadlineTimer::TimePoint> QuorumServer::Tick(DeadlineTimer::TimePoint now) {
  Finishes finishes;
  std::optional<RdzvTime> next;
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<QuorumAnswer> answers;
    for (auto& [run_id, run] : runs_) {
      run.quorum->Tick(now, &answers);
      auto deadline = run.quorum->NextDeadline();
      if (deadline && (!next || *deadline < *next)) next = deadline;
    }
    DeliverLocked(answers, &finishes);
  }
  Finish(finishes);
  return next;
}

}  // namespace meshrun::rdzv
