#include "rendezvous/relay/store_relay.h"

#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <spdlog/spdlog.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/connect.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <condition_variable>
#include <mutex>
#include <random>
#include <sstream>
#include <thread>
#include <unordered_set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "meshrun/v1/store.grpc.pb.h"
#include "rendezvous/client/endpoint_list.h"
#include "rendezvous/client/store_client.h"
#include "rendezvous/core/store_link_wire.h"
#include "rendezvous/server/store_backend.h"
#include "rendezvous/server/tcpstore_server.h"

namespace meshrun::rdzv {

namespace asio = boost::asio;
using asio::ip::tcp;
using meshrun::v1::StoreRequest;
using meshrun::v1::StoreRequestBatch;
using meshrun::v1::StoreResponse;
using meshrun::v1::StoreResponseBatch;

namespace {
// Reply bytes queued to workers by every connection together; past it a
// connection with replies of its own queued stops reading (as the daemon's
// StoreServiceOptions::max_queued_reply_bytes).
constexpr size_t kMaxQueuedReplyBytes = 512 << 20;

// This relay's part of its dedup ids (RelayCore): 64 random bits, so that no
// two relays of the daemon's life (restarted agents included) share one.
uint64_t RandomIdentity() {
  std::random_device device;
  return (static_cast<uint64_t>(device()) << 32) ^ device();
}
}  // namespace

// The StoreBackend of the relay's TCPStore front-end, and the owner of the
// upstream stream. Everything is under mu_: RelayCore is not thread-safe,
// and replies are handed to connections (whose Send only queues) under it,
// so a connection that ended gets none.
class StoreRelay::Backend final : public StoreBackend {
 public:
  explicit Backend(StoreRelayOptions options)
      : options_(std::move(options)),
        core_(options_.relay, RandomIdentity()),
        channel_(MakeStoreChannel(options_.daemon, /*own_connection=*/true,
                                  options_.security)),
        stub_(meshrun::v1::Store::NewStub(channel_)),
        use_link_(options_.transport == StoreRelayOptions::Transport::kLink ||
                  (options_.transport == StoreRelayOptions::Transport::kAuto &&
                   !options_.security.tls())) {}

  // `loop`: where the link's I/O runs (the front-end's thread); it must run
  // until Stop() returned.
  void Start(asio::io_context& loop) {
    io_ = &loop;
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
    if (stream_ != nullptr) stream_->Cancel();
    changed_.notify_all();
    changed_.wait(lock, [this] { return stream_ == nullptr && detached_ == 0; });
    lock.unlock();
    if (reconnector_.joinable()) reconnector_.join();
  }
  bool using_link() {
    std::lock_guard<std::mutex> lock(mu_);
    return use_link_;
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
  // The stream to the daemon: a gRPC call or a store link. Replaced by a new
  // one when it ends. It calls back AfterWrite, OnReplies, OnReady (the
  // link, once welcomed) and, last, OnStreamDone.
  class Upstream {
   public:
    virtual ~Upstream() = default;
    // REQUIRES: backend mu_ held, ready, no write in flight. Writes `out`.
    virtual void WriteOut() = 0;
    // Ends the stream (OnStreamDone follows). REQUIRES: backend mu_ held.
    virtual void Cancel() = 0;
    meshrun::v1::StoreRequestBatch out;  // the batch being written
    bool ready = false;                  // guarded by the backend's mu_
  };

  // How a stream ended, for the choice of the next one's transport.
  enum class LinkEnd {
    kNotALink,  // a gRPC stream
    kEnded,     // a link that was welcomed, or never connected
    // Connected, not welcomed: answered in another protocol (a daemon whose
    // port gRPC owns), or closed without a byte (that too, or a daemon
    // stopping or starting).
    kRefused,
    kClosedUnanswered,
  };
  // Links closed unanswered in a row before the relay takes gRPC.
  static constexpr int kUnansweredLinksBeforeGrpc = 5;
  static constexpr uint32_t kMaxWelcomeBytes = 64 << 10;

  // A Store.BatchSession call.
  class GrpcStream final
      : public Upstream,
        public grpc::ClientBidiReactor<StoreRequestBatch, StoreResponseBatch> {
   public:
    explicit GrpcStream(Backend* backend) : backend_(backend) {
      ready = true;  // gRPC holds writes until the call starts
      // Wait for the daemon (a restart, a slow start) instead of failing.
      context_.set_wait_for_ready(true);
      backend_->stub_->async()->BatchSession(&context_, this);
      // Workers' requests start writes from outside the reactions: without
      // a hold, gRPC may finish the call (and run OnDone) while the backend
      // still writes to it. Removed once the backend no longer can.
      AddHold();
      StartRead(&in_);
      StartCall();
    }
    void WriteOut() override { StartWrite(&out); }
    void Cancel() override { context_.TryCancel(); }
    void OnWriteDone(bool ok) override { backend_->AfterWrite(ok); }
    void OnReadDone(bool ok) override {
      if (!ok) {
        // The call is ending (a read is always outstanding until then).
        backend_->Detach(this);
        RemoveHold();  // OnDone follows, once a write in flight is done
        return;
      }
      backend_->OnReplies(in_);
      in_.Clear();
      StartRead(&in_);
    }
    void OnDone(const grpc::Status& status) override {
      // gRPC is done with the call; no worker's request reaches it (detached
      // in OnReadDone). Gone before the backend hears it ended: Stop()
      // returns only after that, and the channel may go with the relay then.
      Backend* const backend = backend_;
      if (backend->options_.grpc_stream_done_for_test)
        backend->options_.grpc_stream_done_for_test();
      const Upstream* const self = this;
      const std::string why =
          absl::StrCat("gRPC status ", status.error_code(), ": ", status.error_message());
      delete this;
      backend->OnStreamDone(self, why, LinkEnd::kNotALink);
    }

   private:
    Backend* const backend_;
    grpc::ClientContext context_;
    StoreResponseBatch in_;
  };

  // A store link (store_link_wire.h) on the relay's own I/O thread.
  class LinkStream final : public Upstream,
                           public std::enable_shared_from_this<LinkStream> {
   public:
    LinkStream(Backend* backend, asio::io_context& io)
        : backend_(backend), socket_(io), resolver_(io), connect_timer_(io) {}

    // Resolves the daemon's endpoint (every replica's, in the list's order),
    // then connects to the first address that takes the connection.
    void Begin() {
      ++in_flight_;
      entries_ = SplitEndpointList(backend_->options_.daemon);
      ResolveEntry(0);
    }
    void WriteOut() override {
      // Framed here, under the backend's lock, as `out` is.
      wbuf_.clear();
      link::AppendFrame(out, &wbuf_);
      ++in_flight_;  // now: the read side may end before the write starts
      asio::post(socket_.get_executor(), [self = shared_from_this()] {
        asio::async_write(self->socket_, asio::buffer(self->wbuf_),
                          [self](boost::system::error_code ec, size_t) {
                            self->backend_->AfterWrite(!ec);
                            if (ec) return self->Failed("write: " + ec.message());
                            self->Done();
                          });
      });
    }

    void Cancel() override {
      asio::post(socket_.get_executor(),
                 [self = shared_from_this()] { self->Failed("stopped"); });
    }

   private:
    static std::pair<std::string, std::string> SplitHostPort(
        const std::string& endpoint) {
      const size_t colon = endpoint.rfind(':');
      std::string host = endpoint.substr(0, colon);
      if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
        host = host.substr(1, host.size() - 2);
      return {host, colon == std::string::npos ? "" : endpoint.substr(colon + 1)};
    }

    void ResolveEntry(size_t entry) {
      if (!why_.empty()) return;  // stopped meanwhile (Failed ended the read side)
      if (entry == entries_.size()) {
        if (addresses_.empty())
          return Failed("cannot resolve the daemon: " + last_error_);
        return ConnectTo(0);
      }
      auto [host, port] = SplitHostPort(entries_[entry]);
      resolver_.async_resolve(
          host, port,
          [self = shared_from_this(), entry](boost::system::error_code ec,
                                             tcp::resolver::results_type found) {
            if (ec) {
              self->last_error_ = self->entries_[entry] + ": " + ec.message();
            } else {
              for (const auto& result : found)
                self->addresses_.push_back(result.endpoint());
            }
            self->ResolveEntry(entry + 1);
          });
    }

    // One address after the other. With a list of replicas, a connect that
    // hangs (a host gone silent) gives way to the next address after
    // StoreRelayOptions::connect_timeout, and the link is kept alive by TCP
    // keep-alive, so that a silent host is left for the next replica.
    void ConnectTo(size_t index) {
      if (!why_.empty()) return;  // stopped meanwhile (Failed ended the read side)
      if (index == addresses_.size()) return Failed("cannot connect: " + last_error_);
      const bool replicas = entries_.size() > 1;
      boost::system::error_code ignored;
      socket_.close(ignored);
      timed_out_ = false;
      if (replicas) {
        connect_timer_.expires_after(backend_->options_.connect_timeout);
        connect_timer_.async_wait(
            [self = shared_from_this()](boost::system::error_code ec) {
              if (ec) return;  // cancelled: the connect ended first
              self->timed_out_ = true;
              boost::system::error_code ignored_close;
              self->socket_.close(ignored_close);
            });
      }
      socket_.async_connect(addresses_[index], [self = shared_from_this(), index,
                                                replicas](boost::system::error_code ec) {
        self->connect_timer_.cancel();
        if (!self->why_.empty()) return;  // stopped meanwhile
        if (ec) {
          std::ostringstream where;
          where << self->addresses_[index];
          self->last_error_ =
              where.str() + ": " + (self->timed_out_ ? "timed out" : ec.message());
          return self->ConnectTo(index + 1);
        }
        self->connected_ = true;
        boost::system::error_code ignored_option;
        self->socket_.set_option(tcp::no_delay(true), ignored_option);
        if (replicas) self->KeepAlive();
        self->SendHello();
      });
    }

    // A dead peer host is noticed within about 11 s, idle or not.
    void KeepAlive() {
      const int fd = socket_.native_handle();
      const int on = 1, idle_s = 5, interval_s = 2, probes = 3;
      const unsigned int user_timeout_ms = 11000;
      setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof on);
      setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle_s, sizeof idle_s);
      setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval_s, sizeof interval_s);
      setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof probes);
      setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout_ms,
                 sizeof user_timeout_ms);
    }

    void SendHello() {
      meshrun::v1::StoreLinkHello hello;
      hello.set_token(backend_->options_.security.token);
      hello_ = std::string(link::kMagic);
      link::AppendFrame(hello, &hello_);
      asio::async_write(
          socket_, asio::buffer(hello_),
          [self = shared_from_this()](boost::system::error_code ec, size_t) {
            if (ec) return self->Failed("hello: " + ec.message());
            self->ReadFrame();  // the welcome
          });
    }

    void ReadFrame() {
      header_.resize(link::kHeaderBytes);
      asio::async_read(
          socket_, asio::buffer(header_),
          [self = shared_from_this()](boost::system::error_code ec, size_t n) {
            self->received_ += n;
            if (ec)
              return self->Failed(self->welcomed_ ? "the daemon closed the link"
                                                  : "the daemon took no link");
            const uint32_t length = link::FrameLength(self->header_.data());
            // A welcome is a few bytes: more is another protocol (gRPC's
            // settings frame) answering on the port.
            if (!self->welcomed_ && length > kMaxWelcomeBytes)
              return self->Failed("the daemon's port answered in another protocol");
            self->body_.resize(length);
            asio::async_read(self->socket_, asio::buffer(self->body_),
                             [self](boost::system::error_code body_ec, size_t body_n) {
                               self->received_ += body_n;
                               if (body_ec)
                                 return self->Failed("read: " + body_ec.message());
                               self->OnFrame();
                             });
          });
    }

    void OnFrame() {
      if (!welcomed_) {
        meshrun::v1::StoreLinkWelcome welcome;
        if (!welcome.ParseFromString(body_) || !welcome.error().empty())
          return Failed("the daemon refused the link: " + welcome.error());
        welcomed_ = true;
        backend_->OnReady(this);
        return ReadFrame();
      }
      StoreResponseBatch batch;
      if (!batch.ParseFromString(body_)) return Failed("a malformed reply frame");
      backend_->OnReplies(batch);
      ReadFrame();
    }

    // The read side (or the connect) ended: close, and once no write is in
    // flight either, tell the backend.
    void Failed(const std::string& why) {
      if (why_.empty()) why_ = why;
      boost::system::error_code ignored;
      socket_.close(ignored);
      resolver_.cancel();
      connect_timer_.cancel();
      Done();
    }
    void Done() {
      if (--in_flight_ > 0 || done_) return;
      done_ = true;
      // The backend holds no reference to this after OnStreamDone. Bytes
      // that were no welcome mean the port speaks another protocol; a close
      // with none may be a daemon going down or coming up.
      const LinkEnd end = !connected_ || welcomed_ ? LinkEnd::kEnded
                          : received_ > 0          ? LinkEnd::kRefused
                                                   : LinkEnd::kClosedUnanswered;
      backend_->OnStreamDone(this, why_, end);
    }

    Backend* const backend_;
    tcp::socket socket_;
    tcp::resolver resolver_;
    asio::steady_timer connect_timer_;
    // I/O thread only: the daemon's endpoints and their addresses, in order.
    std::vector<std::string> entries_;
    std::vector<tcp::endpoint> addresses_;
    std::string last_error_;
    bool timed_out_ = false;
    // The read side (connect, then reads) and a write; the link is done at 0.
    std::atomic<int> in_flight_{0};
    // I/O thread only.
    bool connected_ = false;
    size_t received_ = 0;  // bytes read
    bool welcomed_ = false;
    bool done_ = false;
    std::string why_;
    std::string hello_;
    std::string header_;
    std::string body_;
    std::string wbuf_;  // written under the backend's lock, sent on the I/O thread
  };

  // REQUIRES: mu_ held, no stream.
  void OpenStreamLocked() {
    ++streams_opened_;
    answered_ = false;
    writing_ = false;
    if (use_link_) {
      auto stream = std::make_shared<LinkStream>(this, *io_);
      link_stream_ = stream;  // keeps it until OnStreamDone
      stream_ = stream.get();
      stream->Begin();
    } else {
      stream_ = new GrpcStream(this);  // deletes itself in OnDone
    }
    WriteLocked();
  }

  // The link was welcomed: requests may go.
  void OnReady(Upstream* stream) {
    std::lock_guard<std::mutex> lock(mu_);
    if (stream != stream_) return;
    stream->ready = true;
    OnAnsweredLocked();
    WriteLocked();
  }

  // REQUIRES: mu_ held.
  void OnAnsweredLocked() {
    if (answered_) return;
    answered_ = true;
    if (streams_opened_ > 1)
      spdlog::info("store relay: reconnected to {} ({})", options_.daemon,
                   use_link_ ? "store link" : "gRPC");
    reconnect_delay_ = options_.min_reconnect_delay;
  }

  // REQUIRES: mu_ held. Writes the next batch unless one is in flight.
  void WriteLocked() {
    if (stream_ == nullptr || !stream_->ready || writing_) return;
    stream_->out.Clear();
    if (!core_.TakeBatch(&stream_->out)) return;
    writing_ = true;
    stream_->WriteOut();
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
    // Requests held back by the dedup window (RelayLimits) may go now.
    WriteLocked();
  }

  // The gRPC stream is ending: nothing may start a write on it from now on
  // (a write in flight may still complete). OnStreamDone follows; no other
  // stream opens before it.
  void Detach(const Upstream* stream) {
    std::lock_guard<std::mutex> lock(mu_);
    if (stream_ == stream) stream_ = nullptr;
    ++detached_;
  }

  void OnStreamDone(const Upstream* stream, const std::string& why, LinkEnd end) {
    std::shared_ptr<LinkStream> finished;
    std::lock_guard<std::mutex> lock(mu_);
    if (stream_ == stream) stream_ = nullptr;
    if (end == LinkEnd::kNotALink) --detached_;
    if (link_stream_.get() == stream) finished = std::move(link_stream_);
    writing_ = false;
    deliveries_.clear();
    core_.OnStreamLost(&deliveries_);
    Deliver();
    const bool automatic = options_.transport == StoreRelayOptions::Transport::kAuto;
    if (end == LinkEnd::kClosedUnanswered) {
      ++unanswered_links_;
    } else if (end != LinkEnd::kNotALink) {
      unanswered_links_ = 0;
    }
    if (!stopping_) {
      if (automatic && use_link_ &&
          (end == LinkEnd::kRefused || unanswered_links_ >= kUnansweredLinksBeforeGrpc)) {
        spdlog::info("store relay: {} takes no store link ({}); using gRPC",
                     options_.daemon, why);
        use_link_ = false;
        unanswered_links_ = 0;
      } else {
        // A gRPC stream that worked and ended (the daemon restarting, say):
        // the next daemon may take a link again.
        if (automatic && end == LinkEnd::kNotALink && answered_ &&
            !options_.security.tls())
          use_link_ = true;
        spdlog::warn("store relay: the stream to {} ended ({}); reconnecting",
                     options_.daemon, why);
      }
      // A stream that never got an answer (refused, or the daemon went at
      // once) is retried after a growing delay, not in a tight loop.
      delay_next_ = !answered_;
    }
    changed_.notify_all();
    // `finished` (the link) goes here, after the lock: its socket is closed.
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
      changed_.wait(
          lock, [this] { return stopping_ || (stream_ == nullptr && detached_ == 0); });
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
  std::condition_variable changed_;  // stream_, detached_ or stopping_ changed
  RelayCore core_;                   // guarded by mu_
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<meshrun::v1::Store::Stub> stub_;
  asio::io_context* io_ = nullptr;  // the store link's (Start)
  bool use_link_;                   // guarded by mu_
  int unanswered_links_ = 0;        // in a row; guarded by mu_
  Upstream* stream_ = nullptr;      // guarded by mu_
  // gRPC streams detached, whose OnStreamDone has not come; guarded by mu_.
  int detached_ = 0;
  std::shared_ptr<LinkStream> link_stream_;  // guarded by mu_; the link stream_ is
  bool writing_ = false;                     // guarded by mu_
  bool answered_ = false;                    // the stream has had a reply; guarded by mu_
  bool delay_next_ = false;                  // guarded by mu_
  bool stopping_ = false;                    // guarded by mu_
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
  // One thread: the workers' queries, their trip upstream and the replies
  // all run there, with no hand-off between threads.
  front.io_threads = 1;
  // No gRPC here: a gRPC client belongs at the daemon.
  auto served = TcpStoreServer::Start(std::move(front), *relay->backend_);
  if (!served.ok()) return served.status();
  relay->front_ = std::move(*served);
  relay->backend_->Start(relay->front_->loop());
  return relay;
}

StoreRelay::~StoreRelay() { Stop(); }

int StoreRelay::port() const { return front_->port(); }

void StoreRelay::SetNamespace(std::string ns) { backend_->SetNamespace(std::move(ns)); }

void StoreRelay::Stop() {
  if (!backend_ || stopped_) return;
  // The stream first, while the loop its link runs on still runs; requests
  // that come meanwhile wait in the core, and go with their connections.
  backend_->Stop();
  if (front_) front_->Stop();
  stopped_ = true;
  const RelayStats stats = backend_->Stats();
  if (stats.requests == 0) return;
  spdlog::info(
      "store relay: {} requests from workers ({} answered with another's), {} sent to "
      "the daemon in {} messages; {} connections to it, {} requests sent again, {} lost "
      "in flight",
      stats.requests, stats.joined, stats.sent, stats.batches, backend_->streams_opened(),
      stats.repeated, stats.failed_in_flight);
}

RelayStats StoreRelay::Stats() { return backend_->Stats(); }

uint64_t StoreRelay::streams_opened() { return backend_->streams_opened(); }

bool StoreRelay::using_link() { return backend_->using_link(); }

}  // namespace meshrun::rdzv
