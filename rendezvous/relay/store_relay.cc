#include "rendezvous/relay/store_relay.h"

#include <grpcpp/grpcpp.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <unordered_set>
#include <utility>
#include <vector>

#include "meshrun/v1/store.grpc.pb.h"
#include "rendezvous/client/store_client.h"
#include "rendezvous/server/store_backend.h"
#include "rendezvous/server/tcpstore_server.h"

namespace meshrun::rdzv {

using meshrun::v1::StoreRequest;
using meshrun::v1::StoreRequestBatch;
using meshrun::v1::StoreResponse;
using meshrun::v1::StoreResponseBatch;

namespace {
// Reply bytes queued to workers by every connection together; past it a
// connection with replies of its own queued stops reading (as the daemon's
// StoreServiceOptions::max_queued_reply_bytes).
constexpr size_t kMaxQueuedReplyBytes = 512 << 20;
}  // namespace

// The StoreBackend of the relay's TCPStore front-end, and the owner of the
// upstream stream. Everything is under mu_: RelayCore is not thread-safe,
// and replies are handed to connections (whose Send only queues) under it,
// so a connection that ended gets none.
class StoreRelay::Backend final : public StoreBackend {
 public:
  explicit Backend(StoreRelayOptions options)
      : options_(std::move(options)),
        core_(options_.relay),
        channel_(MakeStoreChannel(options_.daemon, /*own_connection=*/true,
                                  options_.security)),
        stub_(meshrun::v1::Store::NewStub(channel_)) {}

  void Start() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      OpenStreamLocked();
    }
    reconnector_ = std::thread([this] { ReconnectLoop(); });
  }

  // Ends the stream and waits for gRPC to be done with it.
  void Stop() {
    std::unique_lock<std::mutex> lock(mu_);
    if (stopping_) return;
    stopping_ = true;
    if (stream_ != nullptr) stream_->context.TryCancel();
    changed_.notify_all();
    changed_.wait(lock, [this] { return stream_ == nullptr; });
    lock.unlock();
    if (reconnector_.joinable()) reconnector_.join();
  }

  void SetNamespace(std::string ns) {
    std::lock_guard<std::mutex> lock(ns_mu_);
    ns_ = std::move(ns);
  }
  absl::StatusOr<std::string> Namespace() {
    std::lock_guard<std::mutex> lock(ns_mu_);
    if (ns_.empty()) return absl::UnavailableError("the agent has no round yet");
    return ns_;
  }

  RelayStats Stats() {
    std::lock_guard<std::mutex> lock(mu_);
    return core_.stats();
  }
  uint64_t streams_opened() {
    std::lock_guard<std::mutex> lock(mu_);
    return streams_opened_;
  }

  // StoreBackend.
  void OpenSession() override {}
  void Handle(StoreReplySink* session, const StoreRequest& request) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (std::optional<StoreResponse> refusal = core_.Submit(session, request)) {
      session->Send(std::move(*refusal));
      return;
    }
    WriteLocked();
  }
  void CancelWaits(StoreReplySink* session) override {
    std::lock_guard<std::mutex> lock(mu_);
    core_.CancelWaits(session);
  }
  void EndSession(StoreReplySink* session) override {
    std::lock_guard<std::mutex> lock(mu_);
    core_.EndSession(session);
    paused_.erase(session);
  }
  bool Busy(StoreReplySink* session) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (core_.pending(session) < options_.relay.pause_session_at) return false;
    paused_.insert(session);
    return true;
  }
  void AddQueuedReplyBytes(size_t bytes) override {
    queued_reply_bytes_.fetch_add(bytes);
  }
  void SubtractQueuedReplyBytes(size_t bytes) override {
    queued_reply_bytes_.fetch_sub(bytes);
  }
  bool OverReplyBounds(size_t own, size_t own_max) const override {
    return own > own_max ||
           (own > 0 && queued_reply_bytes_.load() > kMaxQueuedReplyBytes);
  }

 private:
  // One BatchSession call; replaced by a new one when it ends.
  class Stream final
      : public grpc::ClientBidiReactor<StoreRequestBatch, StoreResponseBatch> {
   public:
    explicit Stream(Backend* backend) : backend_(backend) {
      // Wait for the daemon (a restart, a slow start) instead of failing.
      context.set_wait_for_ready(true);
      backend_->stub_->async()->BatchSession(&context, this);
      StartRead(&in_);
      StartCall();
    }
    void OnWriteDone(bool ok) override { backend_->AfterWrite(ok); }
    void OnReadDone(bool ok) override {
      if (!ok) return;  // OnDone follows
      backend_->OnReplies(in_);
      in_.Clear();
      StartRead(&in_);
    }
    void OnDone(const grpc::Status& status) override {
      // Gone before the backend hears of it: Stop() returns only after
      // that, and the channel may go with the relay then.
      Backend* const backend = backend_;
      const Stream* const self = this;
      const grpc::Status ended = status;
      delete this;
      backend->OnStreamDone(self, ended);
    }

    grpc::ClientContext context;
    StoreRequestBatch out;  // the batch being written

   private:
    Backend* const backend_;
    StoreResponseBatch in_;
  };

  // REQUIRES: mu_ held, no stream.
  void OpenStreamLocked() {
    ++streams_opened_;
    answered_ = false;
    writing_ = false;
    stream_ = new Stream(this);
    WriteLocked();
  }

  // REQUIRES: mu_ held. Writes the next batch unless one is in flight.
  void WriteLocked() {
    if (stream_ == nullptr || writing_) return;
    stream_->out.Clear();
    if (!core_.TakeBatch(&stream_->out)) return;
    writing_ = true;
    stream_->StartWrite(&stream_->out);
  }

  void AfterWrite(bool ok) {
    std::lock_guard<std::mutex> lock(mu_);
    writing_ = false;
    core_.WriteDone(ok);
    if (ok) WriteLocked();  // else the stream is ending: OnDone follows
  }

  void OnReplies(const StoreResponseBatch& batch) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!answered_) {
      answered_ = true;
      if (streams_opened_ > 1)
        spdlog::info("store relay: reconnected to {}", options_.daemon);
      reconnect_delay_ = options_.min_reconnect_delay;
    }
    deliveries_.clear();
    for (const StoreResponse& reply : batch.responses())
      core_.OnReply(reply, &deliveries_);
    Deliver();
  }

  void OnStreamDone(const Stream* stream, const grpc::Status& status) {
    std::lock_guard<std::mutex> lock(mu_);
    if (stream_ == stream) stream_ = nullptr;
    writing_ = false;
    deliveries_.clear();
    core_.OnStreamLost(&deliveries_);
    Deliver();
    if (!stopping_) {
      spdlog::warn("store relay: the stream to {} ended ({}: {}); reconnecting",
                   options_.daemon, static_cast<int>(status.error_code()),
                   status.error_message());
      // A stream that never got an answer (refused, or the daemon went at
      // once) is retried after a growing delay, not in a tight loop.
      delay_next_ = !answered_;
    }
    changed_.notify_all();
  }

  // REQUIRES: mu_ held.
  void Deliver() {
    for (RelayDelivery& d : deliveries_) {
      d.session->Send(std::move(d.reply));
      if (paused_.count(d.session) > 0 &&
          core_.pending(d.session) <= options_.relay.pause_session_at / 2) {
        paused_.erase(d.session);
        d.session->Resume();
      }
    }
    deliveries_.clear();
  }

  void ReconnectLoop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      changed_.wait(lock, [this] { return stopping_ || stream_ == nullptr; });
      if (stopping_) return;
      if (delay_next_) {
        const auto delay = reconnect_delay_;
        reconnect_delay_ = std::min(options_.max_reconnect_delay, 2 * reconnect_delay_);
        changed_.wait_for(lock, delay, [this] { return stopping_; });
        if (stopping_) return;
      }
      OpenStreamLocked();
    }
  }

  const StoreRelayOptions options_;
  std::mutex ns_mu_;
  std::string ns_;  // guarded by ns_mu_
  std::mutex mu_;
  std::condition_variable changed_;  // stream_ or stopping_ changed
  RelayCore core_;                   // guarded by mu_
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<meshrun::v1::Store::Stub> stub_;
  Stream* stream_ = nullptr;  // guarded by mu_; deletes itself in OnDone
  bool writing_ = false;      // guarded by mu_
  bool answered_ = false;     // the stream has had a reply; guarded by mu_
  bool delay_next_ = false;   // guarded by mu_
  bool stopping_ = false;     // guarded by mu_
  uint64_t streams_opened_ = 0;
  std::chrono::milliseconds reconnect_delay_ = options_.min_reconnect_delay;
  std::vector<RelayDelivery> deliveries_;  // guarded by mu_ (reused)
  // Sessions Busy() stopped, to Resume() as their replies come.
  std::unordered_set<StoreReplySink*> paused_;  // guarded by mu_
  std::atomic<size_t> queued_reply_bytes_{0};
  std::thread reconnector_;
};

absl::StatusOr<std::unique_ptr<StoreRelay>> StoreRelay::Start(StoreRelayOptions options) {
  std::unique_ptr<StoreRelay> relay(new StoreRelay());
  relay->backend_ = std::make_shared<Backend>(options);
  TcpStoreServerOptions front;
  front.host = options.host;
  front.port = options.port;
  front.limits = options.limits;
  front.handshake_timeout = options.handshake_timeout;
  front.namespace_for = [backend = relay->backend_.get()](const std::string& /*peer*/) {
    return backend->Namespace();
  };
  // No gRPC here: a gRPC client belongs at the daemon.
  auto served = TcpStoreServer::Start(std::move(front), *relay->backend_);
  if (!served.ok()) return served.status();
  relay->front_ = std::move(*served);
  relay->backend_->Start();
  return relay;
}

StoreRelay::~StoreRelay() { Stop(); }

int StoreRelay::port() const { return front_->port(); }

void StoreRelay::SetNamespace(std::string ns) { backend_->SetNamespace(std::move(ns)); }

void StoreRelay::Stop() {
  // Connections first: once they are closed, no request reaches the backend.
  if (front_) front_->Stop();
  if (backend_) backend_->Stop();
}

RelayStats StoreRelay::Stats() { return backend_->Stats(); }

uint64_t StoreRelay::streams_opened() { return backend_->streams_opened(); }

}  // namespace meshrun::rdzv
