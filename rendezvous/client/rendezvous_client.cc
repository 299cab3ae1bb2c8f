#include "rendezvous/client/rendezvous_client.h"

#include <grpcpp/grpcpp.h>

namespace meshrun::rdzv {

namespace v1 = meshrun::v1;

absl::Status FromGrpc(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      status.error_message());
}

// Reads the Join stream into a queue until it ends.
class RendezvousClient::JoinSession::Reactor final
    : public grpc::ClientReadReactor<v1::RendezvousEvent> {
 public:
  Reactor(v1::Rendezvous::Stub* stub, const v1::JoinRequest& request)
      : request_(request) {
    stub->async()->Join(&context_, &request_, this);
    StartRead(&event_);
    StartCall();
  }

  ~Reactor() override {
    context_.TryCancel();
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return done_; });
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // OnDone follows with the status
    {
      std::lock_guard<std::mutex> lock(mu_);
      events_.push_back(std::move(event_));
    }
    cv_.notify_all();
    event_.Clear();
    StartRead(&event_);
  }

  void OnDone(const grpc::Status& status) override {
    // Notify under the lock: once done_ is seen the destructor may return
    // and free cv_, so a notify after unlocking could touch freed memory.
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
    final_status_ = FromGrpc(status);
    cv_.notify_all();
  }

  absl::StatusOr<v1::RendezvousEvent> Next(std::chrono::milliseconds timeout) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, timeout, [this] { return !events_.empty() || done_; }))
      return absl::DeadlineExceededError("no rendezvous event within " +
                                         std::to_string(timeout.count()) + " ms");
    if (events_.empty()) {
      if (final_status_.ok()) return absl::CancelledError("rendezvous stream ended");
      return final_status_;
    }
    v1::RendezvousEvent event = std::move(events_.front());
    events_.pop_front();
    return event;
  }

  void Cancel() { context_.TryCancel(); }

 private:
  grpc::ClientContext context_;
  const v1::JoinRequest request_;
  v1::RendezvousEvent event_;  // owned by the read loop
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<v1::RendezvousEvent> events_;  // guarded by mu_
  bool done_ = false;                       // guarded by mu_
  absl::Status final_status_;               // guarded by mu_
};

RendezvousClient::JoinSession::~JoinSession() = default;

absl::StatusOr<v1::RendezvousEvent> RendezvousClient::JoinSession::Next(
    std::chrono::milliseconds timeout) {
  return reactor_->Next(timeout);
}

void RendezvousClient::JoinSession::Cancel() { reactor_->Cancel(); }

RendezvousClient::RendezvousClient(std::shared_ptr<grpc::Channel> channel)
    : stub_(v1::Rendezvous::NewStub(std::move(channel))) {}

RendezvousClient::CallContext RendezvousClient::MakeContext(
    std::chrono::milliseconds wait) {
  CallContext context(new grpc::ClientContext(), ContextDone{this});
  std::lock_guard<std::mutex> lock(calls_mu_);
  // After CancelCalls a call must not start a wait of its own.
  context->set_deadline(
      std::chrono::system_clock::now() +
      (cancelled_ ? std::chrono::milliseconds(0) : call_timeout_ + wait));
  calls_.insert(context.get());
  return context;
}

void RendezvousClient::ContextDone::operator()(grpc::ClientContext* context) const {
  {
    std::lock_guard<std::mutex> lock(client->calls_mu_);
    client->calls_.erase(context);
  }
  delete context;
}

void RendezvousClient::CancelCalls() {
  std::lock_guard<std::mutex> lock(calls_mu_);
  cancelled_ = true;
  for (grpc::ClientContext* context : calls_) context->TryCancel();
}

std::unique_ptr<RendezvousClient::JoinSession> RendezvousClient::Join(
    const v1::JoinRequest& request) {
  std::unique_ptr<JoinSession> session(new JoinSession());
  session->reactor_ = std::make_unique<JoinSession::Reactor>(stub_.get(), request);
  return session;
}

absl::StatusOr<v1::HeartbeatReply> RendezvousClient::Heartbeat(
    const std::string& run_id, const std::string& node_id,
    const std::vector<v1::RankStepTime>& step_times) {
  v1::HeartbeatRequest request;
  request.set_run_id(run_id);
  request.set_node_id(node_id);
  for (const v1::RankStepTime& step : step_times) *request.add_step_times() = step;
  v1::HeartbeatReply reply;
  auto context = MakeContext();
  grpc::Status status = stub_->Heartbeat(context.get(), request, &reply);
  if (!status.ok()) return FromGrpc(status);
  return reply;
}

absl::StatusOr<v1::FailureReply> RendezvousClient::ReportFailure(
    const std::string& run_id, const std::string& node_id, uint64_t round,
    const std::string& detail) {
  v1::FailureReport request;
  request.set_run_id(run_id);
  request.set_node_id(node_id);
  request.set_round(round);
  request.set_detail(detail);
  v1::FailureReply reply;
  auto context = MakeContext();
  grpc::Status status = stub_->ReportFailure(context.get(), request, &reply);
  if (!status.ok()) return FromGrpc(status);
  return reply;
}

absl::Status RendezvousClient::ReportSuccess(const std::string& run_id,
                                             const std::string& node_id, uint64_t round) {
  v1::SuccessReport request;
  request.set_run_id(run_id);
  request.set_node_id(node_id);
  request.set_round(round);
  v1::Empty reply;
  auto context = MakeContext();
  return FromGrpc(stub_->ReportSuccess(context.get(), request, &reply));
}

absl::Status RendezvousClient::Leave(const std::string& run_id,
                                     const std::string& node_id) {
  v1::LeaveRequest request;
  request.set_run_id(run_id);
  request.set_node_id(node_id);
  v1::Empty reply;
  auto context = MakeContext();
  return FromGrpc(stub_->Leave(context.get(), request, &reply));
}

absl::Status RendezvousClient::Close(const std::string& run_id, v1::RunOutcome outcome,
                                     const std::string& reason) {
  v1::CloseRequest request;
  request.set_run_id(run_id);
  request.set_outcome(outcome);
  request.set_reason(reason);
  v1::Empty reply;
  auto context = MakeContext();
  return FromGrpc(stub_->Close(context.get(), request, &reply));
}

absl::StatusOr<v1::FailureReply> RendezvousClient::ReportFailure(
    const v1::FailureReport& request) {
  v1::FailureReply reply;
  auto context = MakeContext();
  grpc::Status status = stub_->ReportFailure(context.get(), request, &reply);
  if (!status.ok()) return FromGrpc(status);
  return reply;
}

absl::Status RendezvousClient::ReportWorkerExits(const v1::WorkerExitsReport& request) {
  v1::Empty reply;
  auto context = MakeContext();
  return FromGrpc(stub_->ReportWorkerExits(context.get(), request, &reply));
}

absl::Status RendezvousClient::ReportHealth(const v1::HealthReport& request) {
  v1::Empty reply;
  auto context = MakeContext();
  return FromGrpc(stub_->ReportHealth(context.get(), request, &reply));
}

absl::StatusOr<v1::StatusReply> RendezvousClient::Status(
    const v1::StatusRequest& request) {
  v1::StatusReply reply;
  auto context = MakeContext();
  grpc::Status status = stub_->Status(context.get(), request, &reply);
  if (!status.ok()) return FromGrpc(status);
  return reply;
}

absl::StatusOr<v1::QuorumReply> RendezvousClient::Quorum(
    const v1::QuorumRequest& request) {
  v1::QuorumReply reply;
  auto context = MakeContext(std::chrono::milliseconds(request.timeout_ms()));
  grpc::Status status = stub_->Quorum(context.get(), request, &reply);
  if (!status.ok()) return FromGrpc(status);
  return reply;
}

absl::StatusOr<v1::CommitReply> RendezvousClient::Commit(
    const v1::CommitRequest& request) {
  v1::CommitReply reply;
  auto context = MakeContext(std::chrono::milliseconds(request.timeout_ms()));
  grpc::Status status = stub_->Commit(context.get(), request, &reply);
  if (!status.ok()) return FromGrpc(status);
  return reply;
}

}  // namespace meshrun::rdzv
