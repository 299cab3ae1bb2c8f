#pragma once

// gRPC adapter of the Rendezvous service: proto <-> RendezvousState, and the
// push of each NodeEvent on the addressed node's Join stream. A Join stream
// that breaks (agent killed, connection lost) counts as the node leaving, so
// survivors re-form at once instead of waiting for the lease to run out;
// streams that end because the daemon is shutting down do not (see
// BeginShutdown).
//
// Thread-safe; one mutex serialises the state machine.

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "meshrun/v1/rendezvous.grpc.pb.h"
#include "rendezvous/core/rendezvous_state.h"
#include "rendezvous/core/step_times.h"
#include "rendezvous/core/tcpstore_owner.h"
#include "rendezvous/persist/state_log.h"
#include "rendezvous/server/deadline_timer.h"
#include "rendezvous/server/quorum_server.h"
#include "rendezvous/status/metrics.h"
#include "rendezvous/status/run_status.h"

namespace meshrun::rdzv {

struct RendezvousServiceOptions {
  // A closed run stays queryable (and its id taken) this long, then the
  // daemon forgets it, so a long-lived daemon's memory stays flat.
  std::chrono::seconds closed_run_retention{3600};
  // Called with the ids of forgotten runs (outside the service's lock), e.g.
  // to drop their store namespaces.
  std::function<void(const std::vector<std::string>&)> on_runs_forgotten;
  // The daemon speaks the TCPStore protocol: a round assignment then says
  // whether its run is the one served (RoundAssignment.serves_tcpstore).
  bool serves_tcpstore = false;
  // The run pinned to the TCPStore endpoint (DaemonOptions::tcpstore_run).
  std::string tcpstore_run;
  // Adds what the service does not know to each status snapshot (the
  // daemon's etcd leadership). Called without the service's lock.
  std::function<void(StatusSnapshot*)> annotate_status;
};

class RendezvousService final : public meshrun::v1::Rendezvous::CallbackService {
 public:
  explicit RendezvousService(RendezvousServiceOptions options = {});
  ~RendezvousService() override;

  grpc::ServerWriteReactor<meshrun::v1::RendezvousEvent>* Join(
      grpc::CallbackServerContext* context,
      const meshrun::v1::JoinRequest* request) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* context,
                                      const meshrun::v1::HeartbeatRequest* request,
                                      meshrun::v1::HeartbeatReply* reply) override;
  grpc::ServerUnaryReactor* ReportFailure(grpc::CallbackServerContext* context,
                                          const meshrun::v1::FailureReport* request,
                                          meshrun::v1::FailureReply* reply) override;
  grpc::ServerUnaryReactor* ReportSuccess(grpc::CallbackServerContext* context,
                                          const meshrun::v1::SuccessReport* request,
                                          meshrun::v1::Empty* reply) override;
  grpc::ServerUnaryReactor* Leave(grpc::CallbackServerContext* context,
                                  const meshrun::v1::LeaveRequest* request,
                                  meshrun::v1::Empty* reply) override;
  grpc::ServerUnaryReactor* Close(grpc::CallbackServerContext* context,
                                  const meshrun::v1::CloseRequest* request,
                                  meshrun::v1::Empty* reply) override;

  // --state-dir: changed runs are logged by the log's flusher (CollectChanges),
  // one record per run per flush, so a burst of joins costs one write. Events
  // are pushed without waiting for the disk: a crash within that window loses
  // the newest membership change, and agents that were told of it find their
  // round unknown and rejoin (see the agent). REQUIRES: before serving; `log`
  // must remain live while the service is.
  void set_state_log(StateLog* log);
  void CollectChanges(StateLog& log);
  // Runs `fn` on the state under the service's lock (restore, snapshots).
  void WithState(const std::function<void(RendezvousState&)>& fn);
  // Re-arms the timer after a restore gave every node a lease.
  void Restored();
  // The daemon is stopping: from now on the state no longer changes by
  // itself. Streams the server cancels are not departures and timers do not
  // run (nobody can heartbeat), so what the last flush persists is the run
  // as it was, and agents resume into it after a restart. Calls still
  // served (a real Leave) change it as usual. Call before shutting the
  // server down.
  void BeginShutdown();
  grpc::ServerUnaryReactor* ReportHealth(grpc::CallbackServerContext* context,
                                         const meshrun::v1::HealthReport* request,
                                         meshrun::v1::Empty* reply) override;
  grpc::ServerUnaryReactor* ReportWorkerExits(
      grpc::CallbackServerContext* context, const meshrun::v1::WorkerExitsReport* request,
      meshrun::v1::Empty* reply) override;
  grpc::ServerUnaryReactor* Status(grpc::CallbackServerContext* context,
                                   const meshrun::v1::StatusRequest* request,
                                   meshrun::v1::StatusReply* reply) override;
  // Fault-tolerant replicas' step quorum and commit vote (QuorumServer),
  // for runs in progress.
  grpc::ServerUnaryReactor* Quorum(grpc::CallbackServerContext* context,
                                   const meshrun::v1::QuorumRequest* request,
                                   meshrun::v1::QuorumReply* reply) override;
  grpc::ServerUnaryReactor* Commit(grpc::CallbackServerContext* context,
                                   const meshrun::v1::CommitRequest* request,
                                   meshrun::v1::CommitReply* reply) override;

  // Every run (or the one named): the state machine's view plus the failure
  // causes and worker exits the agents reported.
  StatusSnapshot Snapshot(const std::string& run_id = {});
  // Runs, rounds, nodes, joins, heartbeats, restarts by cause, worker exits.
  void CollectMetrics(std::vector<MetricFamily>* out);

  std::optional<RunSummary> Summary(const std::string& run_id);
  std::vector<std::string> RunIds();
  // See RendezvousState::LiveStorePrefixes.
  std::map<std::string, std::string> LiveStorePrefixes();
  // The store namespace of a TCPStore client connecting now (TcpStoreOwner).
  absl::StatusOr<std::string> TcpStoreNamespace();

  class JoinStream;  // one node's event stream; defined in the .cc

 private:
  friend class JoinStream;
  using NodeKey = std::pair<std::string, std::string>;  // run id, node id

  // REQUIRES: mu_ held.
  // A keep-alive carried step times: kept, and a newly slow rank logged.
  void NoteStepTimesLocked(const meshrun::v1::HeartbeatRequest& request);
  // Snapshot() with the replica groups' lags read already (/metrics shows
  // them all). REQUIRES: mu_ not held.
  StatusSnapshot SnapshotWithLags(
      const std::string& run_id,
      const std::map<std::string, std::vector<ReplicaLag>>& lags);
  void DispatchLocked(std::vector<NodeEvent>& events);
  // The stream of `node` broke; REQUIRES: mu_ not held.
  void StreamBroken(const NodeKey& node, JoinStream* stream);
  std::optional<DeadlineTimer::TimePoint> Tick(DeadlineTimer::TimePoint now);
  void PokeTimerLocked();
  // A counted failure of replica group `replica` (restart scope replica): it
  // restarts alone, and the step quorum stops waiting for it. REQUIRES: mu_ held.
  void ReplicaFailedLocked(const std::string& run_id, uint32_t replica);
  // The round of `run_id` when it is in progress (NOT_FOUND, FAILED_PRECONDITION
  // otherwise). REQUIRES: mu_ not held.
  absl::StatusOr<uint64_t> RoundInProgress(const std::string& run_id);
  // The same, once RendezvousState::CheckAdmission accepts the caller.
  absl::StatusOr<uint64_t> RoundOfCaller(const std::string& run_id, uint64_t rank,
                                         uint64_t admission);

  const RendezvousServiceOptions options_;
  std::mutex mu_;
  RendezvousState state_;                   // guarded by mu_
  TcpStoreOwner tcpstore_owner_;            // guarded by mu_
  DeadlineTimer::TimePoint next_sweep_;     // guarded by mu_; forgetting closed runs
  bool shutting_down_ = false;              // guarded by mu_
  std::map<NodeKey, JoinStream*> streams_;  // guarded by mu_; entry => stream alive
  // What agents reported beyond the state machine's business, per run.
  struct Observed {
    std::optional<FailureStatusRecord> last_failure;
    std::map<std::string, NodeExitsRecord> exits;  // by node id: its latest round
    // Nodes kept out by a failed health check, by node id, until they join;
    // when each reported.
    std::map<std::string, std::pair<NodeStatusRecord, RdzvTime>> unhealthy;
    // The step times each node's ranks report, by node id (its latest
    // keep-alive), and the ranks logged as slow (logged again once they
    // were not for a while).
    std::map<std::string, std::vector<RankStepTime>> step_times;
    std::set<uint32_t> slow_logged;
  };
  std::map<std::string, Observed> observed_;  // guarded by mu_
  // Worker exits reported, by result: 0 success, 1 exit code, 2 signal.
  std::array<Counter, 3> worker_exits_;
  std::unique_ptr<DeadlineTimer> timer_;
  StateLog* log_ = nullptr;
  QuorumServer quorum_;  // its own lock; never called with mu_ held but from
                         // ReplicaFailedLocked and DispatchLocked (quorum_
                         // never calls back)
};

}  // namespace meshrun::rdzv
