#pragma once

// gRPC adapter of the replica quorum (rendezvous/core/replica_quorum.h): one
// ReplicaQuorum per run, the Quorum and Commit calls parked until their
// answer, and the timer that feeds the cores their deadlines. The
// Rendezvous service forwards those two calls here after checking the run,
// and reports replica failures its agents send.
//
// Thread-safe; one mutex of its own, so a parked quorum never holds up the
// rendezvous state machine.
//
// Test hook: with MESHRUN_TEST_HOOK_SPLIT_COMMIT=<n> in the daemon's
// environment, the n-th step that commits (with several voters) is answered
// to its first voter (the lowest replica, then member) only; the other
// voters' answers are held back until the daemon stops, as if it died
// between two answers (the test kills it there). Never set it outside tests.

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "meshrun/v1/rendezvous.grpc.pb.h"
#include "rendezvous/core/replica_quorum.h"
#include "rendezvous/core/straggler_tracker.h"
#include "rendezvous/server/deadline_timer.h"

namespace meshrun::rdzv {

class QuorumServer {
 public:
  QuorumServer();
  ~QuorumServer();  // answers every parked call UNAVAILABLE

  // Answer through `reactor` (now, or when the quorum forms or the step is
  // decided). `round` is the run's current round: a run that re-formed
  // (restart scope job) starts its quorum afresh, its old callers answered.
  // REQUIRES: the request was validated and names a run in progress.
  void Quorum(grpc::ServerUnaryReactor* reactor,
              const meshrun::v1::QuorumRequest& request, uint64_t round,
              meshrun::v1::QuorumReply* reply);
  void Commit(grpc::ServerUnaryReactor* reactor,
              const meshrun::v1::CommitRequest& request, uint64_t round,
              meshrun::v1::CommitReply* reply);

  void ReplicaFailed(const std::string& run_id, uint32_t replica,
                     ReplicaQuorum::Loss loss);
  // The run is over or forgotten: its parked calls are answered, its state dropped.
  void DropRun(const std::string& run_id);
  // The daemon is stopping: every parked call is answered UNAVAILABLE.
  void CancelAll();

  // Calls parked now, by run: workers waiting for a step's quorum to form,
  // and for a step's commit decision (metrics).
  struct Waiting {
    size_t quorum = 0;
    size_t commit = 0;
  };
  std::map<std::string, Waiting> WaitingByRun();
  // Each run's replica groups by their lag at the step quorum, slowest first
  // (rendezvous/core/straggler_tracker.h).
  std::map<std::string, std::vector<ReplicaLag>> LagsByRun();

 private:
  struct Parked {
    grpc::ServerUnaryReactor* reactor;
    meshrun::v1::QuorumReply* quorum_reply;  // one of these two
    meshrun::v1::CommitReply* commit_reply;
    std::string run_id;
    std::pair<uint32_t, uint32_t> voter{};  // replica, member (commit calls)
  };
  // The calls to finish, filled under mu_ and finished outside it.
  using Finishes = std::vector<std::pair<grpc::ServerUnaryReactor*, grpc::Status>>;

  struct Run {
    uint64_t round = 0;
    std::unique_ptr<ReplicaQuorum> quorum;
    // Kept across rounds: a slow machine stays slow.
    StragglerTracker stragglers;
    uint64_t last_formed = 0;  // the last quorum it was told of
  };
  // Parks the caller and runs `call` (Arrive or Vote) on the run's quorum of
  // `round`; answers whoever that answers.
  void Park(const Parked& parked, const std::string& run_id, uint64_t round,
            const std::function<absl::Status(ReplicaQuorum&, QuorumWaiter,
                                             std::vector<QuorumAnswer>*)>& call);
  // The run's quorum of `round` (a new one when the round changed).
  ReplicaQuorum& RunLocked(const std::string& run_id, uint64_t round,
                           std::vector<QuorumAnswer>* answers);
  void DeliverLocked(std::vector<QuorumAnswer>& answers, Finishes* finishes);
  // A quorum formed: its participants' lags are kept (and a persistent
  // straggler logged).
  void NoteFormedLocked(const std::string& run_id, const QuorumFormed& formed);
  // The test hook (above): holds back (takes out of parked_) the answers of
  // all but the first voter of the n-th committed step in `answers`.
  void SplitCommitLocked(std::vector<QuorumAnswer>& answers);
  void PokeLocked();
  std::optional<DeadlineTimer::TimePoint> Tick(DeadlineTimer::TimePoint now);
  static void Finish(Finishes& finishes);

  // Ids start from the daemon's start time (ms since the epoch, x 4096), so
  // they do not repeat after a restart (replica_quorum.h).
  std::mutex mu_;
  uint64_t next_first_id_;                 // guarded by mu_
  std::map<std::string, Run> runs_;        // guarded by mu_
  std::map<QuorumWaiter, Parked> parked_;  // guarded by mu_
  QuorumWaiter next_waiter_ = 1;           // guarded by mu_
  // The test hook's step (0: off), the steps committed so far, and the
  // calls it holds back (answered UNAVAILABLE when the daemon stops).
  const uint64_t split_commit_;
  uint64_t commits_seen_ = 0;                             // guarded by mu_
  std::vector<grpc::ServerUnaryReactor*> held_reactors_;  // guarded by mu_
  std::unique_ptr<DeadlineTimer> timer_;
};

}  // namespace meshrun::rdzv
