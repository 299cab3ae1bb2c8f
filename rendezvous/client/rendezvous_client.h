#pragma once

// Client of the daemon's Rendezvous service, for agents and tests. A
// JoinSession holds the node's Join stream open and queues the events the
// daemon pushes; the unary calls report heartbeats, failures and departures.
//
// Thread-safe.

#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "meshrun/v1/rendezvous.grpc.pb.h"

namespace meshrun::rdzv {

class RendezvousClient {
 public:
  // `channel` must remain live while the client and its sessions are.
  explicit RendezvousClient(std::shared_ptr<grpc::Channel> channel);

  class JoinSession {
   public:
    ~JoinSession();  // cancels the stream (the daemon sees the node leave)
    // The next pushed event, or DEADLINE_EXCEEDED after `timeout`. Once the
    // stream has ended and every event was taken: the stream's final status
    // (OK after a terminal event, else why it broke, e.g. a refused join).
    absl::StatusOr<meshrun::v1::RendezvousEvent> Next(std::chrono::milliseconds timeout);
    // Cancels the stream now.
    void Cancel();

   private:
    friend class RendezvousClient;
    class Reactor;
    JoinSession() = default;
    std::unique_ptr<Reactor> reactor_;
  };

  std::unique_ptr<JoinSession> Join(const meshrun::v1::JoinRequest& request);
  // `step_times`: this node's ranks' reported step times, if any.
  absl::StatusOr<meshrun::v1::HeartbeatReply> Heartbeat(
      const std::string& run_id, const std::string& node_id,
      const std::vector<meshrun::v1::RankStepTime>& step_times = {});
  absl::StatusOr<meshrun::v1::FailureReply> ReportFailure(const std::string& run_id,
                                                          const std::string& node_id,
                                                          uint64_t round,
                                                          const std::string& detail);
  absl::Status ReportSuccess(const std::string& run_id, const std::string& node_id,
                             uint64_t round);
  absl::Status Leave(const std::string& run_id, const std::string& node_id);
  absl::Status Close(const std::string& run_id, meshrun::v1::RunOutcome outcome,
                     const std::string& reason);
  // A failure report with every field (root cause as data included).
  absl::StatusOr<meshrun::v1::FailureReply> ReportFailure(
      const meshrun::v1::FailureReport& request);
  absl::Status ReportWorkerExits(const meshrun::v1::WorkerExitsReport& request);
  absl::Status ReportHealth(const meshrun::v1::HealthReport& request);
  absl::StatusOr<meshrun::v1::StatusReply> Status(
      const meshrun::v1::StatusRequest& request);
  // Fault-tolerant replicas: these wait on the daemon up to the request's
  // timeout_ms, and the call's deadline is that plus the call timeout.
  absl::StatusOr<meshrun::v1::QuorumReply> Quorum(
      const meshrun::v1::QuorumRequest& request);
  absl::StatusOr<meshrun::v1::CommitReply> Commit(
      const meshrun::v1::CommitRequest& request);

  // Deadline of every unary call.
  void set_call_timeout(std::chrono::milliseconds timeout) { call_timeout_ = timeout; }

  // Ends every unary call under way now (CANCELLED), and every later one at
  // once (DEADLINE_EXCEEDED): for an owner that must stop without waiting
  // out call deadlines on a daemon that does not answer.
  void CancelCalls();

 private:
  // Unregisters a call's context when the call is over.
  struct ContextDone {
    RendezvousClient* client;
    void operator()(grpc::ClientContext* context) const;
  };
  using CallContext = std::unique_ptr<grpc::ClientContext, ContextDone>;
  // The call's deadline: the call timeout plus `wait` (a wait on the daemon).
  CallContext MakeContext(std::chrono::milliseconds wait = {});

  std::unique_ptr<meshrun::v1::Rendezvous::Stub> stub_;
  std::chrono::milliseconds call_timeout_{10000};
  std::mutex calls_mu_;
  std::set<grpc::ClientContext*> calls_;  // guarded by calls_mu_
  bool cancelled_ = false;                // guarded by calls_mu_
};

// Converts a gRPC status to an absl one (same codes).
absl::Status FromGrpc(const grpc::Status& status);

}  // namespace meshrun::rdzv
