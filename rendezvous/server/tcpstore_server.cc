#include "rendezvous/server/tcpstore_server.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/resource.h>

#include <algorithm>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <chrono>
#include <cstring>
#include <deque>
#include <iterator>
#include <limits>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "rendezvous/core/store_link_wire.h"
#include "rendezvous/server/fd_limit.h"

namespace meshrun::rdzv {

namespace asio = boost::asio;
using asio::ip::tcp;
using meshrun::v1::StoreRequest;
using meshrun::v1::StoreResponse;
using tcpstore::ParseResult;
using tcpstore::Query;
using tcpstore::QueryType;
using tcpstore::ScanResult;

namespace {

// Why a connection was closed by the daemon, for the metric.
enum class Refusal {
  kHandshake,
  kBadQuery,
  kStoreError,
  kNoNamespace,
  kGrpcOff,
  kLinkOff,
  kHandshakeTimeout,  // no first byte, or no VALIDATE, within handshake_timeout
  kConnectionCap,     // max_connections open
  kPeerCap,           // max_connections_per_peer open from its address
  kCount
};
const char* ToString(Refusal r) {
  static const char* const kNames[] = {
      "handshake", "bad_query",         "store_error",    "no_namespace", "grpc_off",
      "link_off",  "handshake_timeout", "connection_cap", "peer_cap"};
  static_assert(std::size(kNames) == static_cast<size_t>(Refusal::kCount));
  return kNames[static_cast<int>(r)];
}

// c10d waits have no timeout on the wire (its client gives up and sends
// cancel_wait), so a parked wait lasts until then, or its connection ends.
constexpr uint32_t kNoTimeoutMs = std::numeric_limits<uint32_t>::max();
// A connection's read buffer starts small (10,000 idle clients cost 40 MiB)
// and grows to the query it reads, doubling (so a query that comes in many
// reads is copied O(log n) times), up to WireLimits::max_query_bytes. Once
// the query is served, a buffer above kMaxIdleReadBuffer is given back.
constexpr size_t kMinReadBuffer = 4 << 10;
constexpr size_t kMaxIdleReadBuffer = 1 << 20;
// Cap refusals come in floods: logged once per interval, with a count.
constexpr std::chrono::seconds kRefusalLogInterval{10};

// The connection whose query this thread is running (see SendAll).
thread_local const void* tls_dispatching = nullptr;

}  // namespace

class TcpStoreServer::Impl : public std::enable_shared_from_this<TcpStoreServer::Impl> {
 public:
  // `io_threads` event loops, each run by one thread of its own (concurrency
  // hint 1: asio then skips the locking and wakeups a shared loop needs).
  Impl(TcpStoreServerOptions options, StoreBackend& store, int io_threads)
      : options_(std::move(options)),
        store_(store),
        ios_(MakeLoops(io_threads)),
        acceptor_(*ios_[0]),
        accept_retry_(*ios_[0]) {
    for (auto& io : ios_) work_.emplace_back(io->get_executor());
  }

  static std::vector<std::unique_ptr<asio::io_context>> MakeLoops(int n) {
    std::vector<std::unique_ptr<asio::io_context>> loops;
    for (int i = 0; i < n; ++i) loops.push_back(std::make_unique<asio::io_context>(1));
    return loops;
  }

  class Connection;

  absl::Status Bind() {
    boost::system::error_code ec;
    const auto address = asio::ip::make_address(options_.host, ec);
    if (ec) return absl::InvalidArgumentError("bad listen address " + options_.host);
    const tcp::endpoint endpoint(address, static_cast<uint16_t>(options_.port));
    acceptor_.open(endpoint.protocol(), ec);
    if (!ec) acceptor_.set_option(tcp::acceptor::reuse_address(true), ec);
    if (!ec) acceptor_.bind(endpoint, ec);
    if (!ec) acceptor_.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) {
      return absl::UnavailableError(absl::StrCat("cannot listen on ", options_.host, ":",
                                                 options_.port, ": ", ec.message()));
    }
    return absl::OkStatus();
  }
  int port() const { return acceptor_.local_endpoint().port(); }
  size_t loops() const { return ios_.size(); }
  asio::io_context& io(size_t i) { return *ios_[i]; }
  // After the loops' threads returned: runs what connections closing on one
  // loop posted to another that had already stopped, until nothing is left
  // (each handler holds the server, so one left behind would leak it).
  void Drain() {
    for (size_t ran = 1; ran > 0;) {
      ran = 0;
      for (auto& io : ios_) {
        io->restart();
        ran += io->poll();
      }
    }
  }

  void Accept() {
    // Connections are spread over the loops in turn; each stays on its loop,
    // so its reads, queries and writes run on one thread without handoffs.
    asio::io_context& loop = *ios_[next_loop_++ % ios_.size()];
    acceptor_.async_accept(
        loop.get_executor(),
        [self = shared_from_this()](boost::system::error_code ec, tcp::socket socket) {
          if (ec == asio::error::operation_aborted || self->stopping_) return;
          if (!ec) {
            if (std::exchange(self->accept_failing_, false))
              spdlog::info("tcpstore: accepting connections again");
            self->Admit(std::move(socket));
            self->Accept();
            return;
          }
          // Out of descriptors (EMFILE, ENFILE) or buffers: accepting again at
          // once would fail the same way and spin a core; the pending
          // connection waits in the backlog until one closes.
          if (!std::exchange(self->accept_failing_, true))
            spdlog::warn("tcpstore: accept failed: {}; retrying every {} ms",
                         ec.message(), kAcceptRetry.count());
          self->accept_retry_.expires_after(kAcceptRetry);
          self->accept_retry_.async_wait([self](boost::system::error_code wait_ec) {
            if (wait_ec || self->stopping_) return;
            self->Accept();
          });
        });
  }

  // A socket accepted and not yet classified: it counts against the caps
  // from here until it closes or is handed to gRPC.
  struct Unclassified {
    Unclassified(tcp::socket s, std::string from,
                 std::chrono::steady_clock::time_point by)
        : socket(std::move(s)),
          timer(socket.get_executor()),
          peer(std::move(from)),
          deadline(by) {}
    tcp::socket socket;
    asio::steady_timer timer;  // the handshake timeout
    std::string peer;          // its address, the per-peer count's key
    std::chrono::steady_clock::time_point deadline;  // for the first byte and VALIDATE
    bool classified = false;  // on its loop: the first byte came first
  };

  // Counts a new connection against the caps, or closes it at once.
  void Admit(tcp::socket socket) {
    boost::system::error_code ec;
    const auto remote = socket.remote_endpoint(ec);
    std::string peer = ec ? "unknown" : remote.address().to_string();
    std::optional<Refusal> refused;
    size_t open = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      size_t& from_peer = per_peer_[peer];
      if (admitted_ >= options_.max_connections) {
        refused = Refusal::kConnectionCap;
        open = admitted_;
      } else if (from_peer >= options_.max_connections_per_peer) {
        refused = Refusal::kPeerCap;
        open = from_peer;
      } else {
        ++admitted_;
        ++from_peer;
      }
      if (from_peer == 0) per_peer_.erase(peer);
    }
    if (refused) {
      Refuse(*refused);
      socket.close(ec);
      return LogCapRefusal(*refused, peer, open);
    }
    // Classified on the socket's own loop, which runs all its handlers.
    if (&socket.get_executor().context() == ios_[0].get())
      return Classify(std::move(socket), std::move(peer));
    auto executor = socket.get_executor();
    asio::post(executor, [self = shared_from_this(), socket = std::move(socket),
                          peer = std::move(peer)]() mutable {
      self->Classify(std::move(socket), std::move(peer));
    });
  }

  // Gives back a connection's place under the caps (it closed, or went to
  // gRPC). Any thread, without mu_ held.
  void Release(const std::string& peer) {
    std::lock_guard<std::mutex> lock(mu_);
    --admitted_;
    auto it = per_peer_.find(peer);
    if (it != per_peer_.end() && --it->second == 0) per_peer_.erase(it);
  }

  // On the accept path (one accept at a time): the first refusal of a
  // streak, then one line per kRefusalLogInterval with the count left out.
  void LogCapRefusal(Refusal why, const std::string& peer, size_t open) {
    const auto now = std::chrono::steady_clock::now();
    if (now - last_refusal_log_ < kRefusalLogInterval) {
      ++refusals_unlogged_;
      return;
    }
    const bool total = why == Refusal::kConnectionCap;
    spdlog::warn(
        "tcpstore: closing a new connection from {}: {} connections open{} (the limit, "
        "{}){}",
        peer, open, total ? "" : " from that address",
        total ? "--max-connections" : "--max-connections-per-peer",
        refusals_unlogged_ > 0
            ? absl::StrCat("; ", refusals_unlogged_, " more refused since the last line")
            : std::string());
    last_refusal_log_ = now;
    refusals_unlogged_ = 0;
  }

  // Waits for the first byte without taking it, then hands the socket to
  // gRPC or to a TCPStore connection; closes it if none comes in time.
  void Classify(tcp::socket socket, std::string peer) {
    auto pending = std::make_shared<Unclassified>(
        std::move(socket), peer,
        std::chrono::steady_clock::now() + options_.handshake_timeout);
    bool stopping = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping = stopping_;
      if (!stopping) classifying_.insert(pending);
    }
    if (stopping) return Release(peer);
    pending->timer.expires_at(pending->deadline);
    pending->timer.async_wait([self = shared_from_this(), weak = std::weak_ptr(pending)](
                                  boost::system::error_code ec) {
      auto silent = weak.lock();
      if (ec || !silent || silent->classified) return;
      spdlog::info(
          "tcpstore: a connection from {} sent nothing in {} ms; closing it "
          "(--handshake-timeout-ms)",
          silent->peer, self->options_.handshake_timeout.count());
      self->Refuse(Refusal::kHandshakeTimeout);
      boost::system::error_code close_ec;
      silent->socket.close(close_ec);  // ends the wait below
    });
    pending->socket.async_wait(
        tcp::socket::wait_read,
        [self = shared_from_this(), pending](boost::system::error_code ec) {
          pending->classified = true;
          pending->timer.cancel();
          {
            std::lock_guard<std::mutex> lock(self->mu_);
            self->classifying_.erase(pending);
          }
          const bool kept = !ec && !self->stopping_ && self->Route(*pending);
          if (!kept) self->Release(pending->peer);
        });
  }

  // With the first byte there: gRPC's connections go to gRPC, the rest are
  // TCPStore clients. True when a TCPStore connection took the socket (and
  // its place under the caps).
  bool Route(Unclassified& pending) {
    tcp::socket& socket = pending.socket;
    char first = 0;
    boost::system::error_code ec;
    const size_t n =
        socket.receive(asio::buffer(&first, 1), tcp::socket::message_peek, ec);
    if (ec || n == 0) return false;  // closed before a byte: nothing to serve
    if (first == link::kMagic[0]) {
      link_connections_.Inc();
      if (!options_.on_link_fd) {
        Refuse(Refusal::kLinkOff);
        return false;
      }
      const int fd = socket.release(ec);
      if (ec) return false;
      options_.on_link_fd(fd);
      return false;
    }
    if (first != 'P') {
      StartConnection(std::move(socket), pending.peer, pending.deadline);
      return true;
    }
    grpc_connections_.Inc();
    if (!options_.on_grpc_fd) {
      Refuse(Refusal::kGrpcOff);
      return false;
    }
    // gRPC sets no options on a socket it is handed: without NODELAY, Nagle
    // and delayed ACKs stall its replies ~40 ms. And its endpoints expect a
    // non-blocking fd; a blocking read would stall its poller thread.
    socket.set_option(tcp::no_delay(true), ec);
    const int fd = socket.release(ec);
    if (ec) return false;
    ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
    options_.on_grpc_fd(fd);
    return false;
  }

  void StartConnection(tcp::socket socket, const std::string& peer,
                       std::chrono::steady_clock::time_point handshake_deadline);
  void Forget(Connection* connection) {
    std::lock_guard<std::mutex> lock(mu_);
    connections_.erase(connection);
  }
  void Refuse(Refusal why) { refused_[static_cast<int>(why)].Inc(); }

  void Stop();
  void CollectMetrics(std::vector<MetricFamily>* out);

  const TcpStoreServerOptions options_;
  StoreBackend& store_;
  std::vector<std::unique_ptr<asio::io_context>> ios_;
  // Keep the loops running while they have no connection; reset by Stop().
  std::vector<asio::executor_work_guard<asio::io_context::executor_type>> work_;
  size_t next_loop_ = 0;  // the accept path's: the loop of the next connection
  tcp::acceptor acceptor_;
  static constexpr std::chrono::milliseconds kAcceptRetry{100};
  asio::steady_timer accept_retry_;  // paces accepts after a failed one
  bool accept_failing_ = false;      // logged once per streak of failures
  std::atomic<bool> stopping_{false};
  std::mutex mu_;
  std::unordered_map<Connection*, std::weak_ptr<Connection>>
      connections_;  // guarded by mu_
  // Accepted sockets whose first byte has not come yet.
  std::unordered_set<std::shared_ptr<Unclassified>> classifying_;  // guarded by mu_
  // Under the caps: sockets being classified and TCPStore connections, in
  // all and by peer address. Guarded by mu_.
  size_t admitted_ = 0;
  std::unordered_map<std::string, size_t> per_peer_;
  // LogCapRefusal's, on the accept path.
  std::chrono::steady_clock::time_point last_refusal_log_;  // none yet: the epoch
  size_t refusals_unlogged_ = 0;                            // since that line
  Counter tcpstore_connections_;
  Counter grpc_connections_;
  Counter link_connections_;
  Counter queries_;
  Counter refused_[static_cast<int>(Refusal::kCount)];
};

// One TCPStore client. Reads, parses and writes on its loop (one thread);
// replies come from the backend (Send) on any thread and are written in the
// order they come.
class TcpStoreServer::Impl::Connection final
    : public StoreReplySink,
      public std::enable_shared_from_this<TcpStoreServer::Impl::Connection> {
 public:
  // Takes `socket`'s place under the caps (at `peer`), given back when the
  // connection is destroyed.
  Connection(std::shared_ptr<Impl> server, tcp::socket socket, std::string peer,
             std::chrono::steady_clock::time_point handshake_deadline)
      : server_(std::move(server)),
        socket_(std::move(socket)),
        peer_(std::move(peer)),
        handshake_timer_(socket_.get_executor()),
        scanner_(server_->options_.limits) {
    boost::system::error_code ec;
    socket_.set_option(tcp::no_delay(true), ec);
    handshake_timer_.expires_at(handshake_deadline);
  }
  ~Connection() override { server_->Release(peer_); }

  void Start() {
    server_->store_.OpenSession();
    session_open_ = true;
    // Weak: a connection that closed goes away without waiting for it.
    handshake_timer_.async_wait([weak = weak_from_this()](boost::system::error_code ec) {
      auto self = weak.lock();
      if (ec || !self || self->validated_) return;
      self->Log("did not validate within {} ms; closing the connection",
                self->server_->options_.handshake_timeout.count());
      self->server_->Refuse(Refusal::kHandshakeTimeout);
      self->Close();
    });
    Read();
  }

  // From Stop(), any thread.
  void Shutdown() {
    asio::post(socket_.get_executor(), [self = shared_from_this()] { self->Close(); });
  }

  // StoreReplySink. Called with the backend's lock held, or not; never with
  // ours held by the caller.
  void Send(StoreResponse reply) override {
    std::vector<StoreResponse> one(1);
    one[0] = std::move(reply);
    SendAll(&one);
  }
  void SendAll(std::vector<StoreResponse>* replies) override {
    bool start_write = false;
    bool failed = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closed_) return;
      for (StoreResponse& reply : *replies) {
        auto awaited = awaiting_.find(reply.id());
        if (awaited == awaiting_.end()) continue;  // a cancelled wait
        const QueryType type = awaited->second;
        awaiting_.erase(awaited);
        if (reply.code() != meshrun::v1::STORE_OK) {
          spdlog::info("tcpstore client {}: {} refused: {}; closing the connection",
                       peer_, tcpstore::ToString(type), reply.error());
          failed = true;
          break;
        }
        std::string bytes = Encode(type, reply);
        if (bytes.empty()) continue;
        AddOutBytesLocked(bytes.size());
        out_.push_back(std::move(bytes));
      }
      if (!failed && !writing_ && !out_.empty()) start_write = writing_ = true;
    }
    if (failed) {
      server_->Refuse(Refusal::kStoreError);
      asio::post(socket_.get_executor(), [self = shared_from_this()] { self->Close(); });
      return;
    }
    if (!start_write) return;
    // A reply made while this connection's own query runs (most are) is
    // written by Process() once the queries buffered so far have run, all in
    // one write; any other is posted to its loop.
    if (tls_dispatching == this) {
      std::lock_guard<std::mutex> lock(mu_);
      writing_ = false;
      return;
    }
    asio::post(socket_.get_executor(),
               [self = shared_from_this()] { self->WriteNext(); });
  }
  // --state-dir: replies held for the log count against the bounds as if
  // queued (their protobuf size: about what they encode to).
  void Hold(const std::vector<StoreResponse>& replies) override {
    const size_t bytes = BytesOf(replies);
    std::lock_guard<std::mutex> lock(mu_);
    if (held_++ == 0) keepalive_ = shared_from_this();
    held_bytes_ += bytes;
    server_->store_.AddQueuedReplyBytes(bytes);
  }
  void SendHeld(std::vector<StoreResponse>* replies) override {
    const size_t bytes = BytesOf(*replies);
    SendAll(replies);
    std::shared_ptr<Connection> last;
    bool open;
    {
      std::lock_guard<std::mutex> lock(mu_);
      held_bytes_ -= bytes;
      server_->store_.SubtractQueuedReplyBytes(bytes);
      if (--held_ == 0) last = std::move(keepalive_);
      open = !closed_;
    }
    // Replies with no bytes (set, multi_set) start no write whose end would
    // resume the reading. Posted even when not paused (yet): Process() may be
    // between finding this connection over its bounds, counting these held
    // bytes, and setting paused_, and would then wait for a wake-up that
    // never comes. AfterDrain() is a no-op for a connection not paused.
    if (open)
      asio::post(socket_.get_executor(),
                 [self = shared_from_this()] { self->AfterDrain(); });
  }
  // Nothing to defer: a stock client's get waits first, then reads with
  // if_present, so no reply woken here carries values (waits and barriers
  // answer with a byte). The bounds apply to what it reads (Process).
  bool DeferIfOverBounds() override { return false; }
  void MarkDeferred() override {}
  size_t RoomBytes() override { return std::numeric_limits<size_t>::max(); }
  // c10d's client has at most one blocking query out at a time.
  size_t MaxParkedWaits() override { return server_->options_.max_parked_waits; }
  void Resume() override {
    asio::post(socket_.get_executor(),
               [self = shared_from_this()] { self->AfterDrain(); });
  }

 private:
  void Read() {
    if (closed_) return;
    MakeRoom();
    socket_.async_read_some(
        asio::buffer(in_.get() + in_end_, in_capacity_ - in_end_),
        [self = shared_from_this()](boost::system::error_code ec, size_t n) {
          self->in_end_ += n;
          if (ec) return self->Close();
          self->Process();
        });
  }

  // Moves the unparsed bytes (the start of one query: Process ran the whole
  // ones) to the front, and sizes the buffer for the rest of the query: its
  // exact size once the scanner knows it (a large value is read into place,
  // once), else double (never past the largest query, which the scanner
  // refuses from its lengths). A large buffer that is no longer needed is
  // given back.
  void MakeRoom() {
    const size_t pending = in_end_ - in_start_;
    const size_t want = std::max({kMinReadBuffer, need_, pending + kMinReadBuffer / 2});
    size_t capacity = in_capacity_;
    if (want > in_capacity_) {
      const size_t largest = server_->options_.limits.max_query_bytes;
      capacity = std::max(want, std::min(2 * in_capacity_, largest));
    } else if (in_capacity_ > kMaxIdleReadBuffer && want <= kMaxIdleReadBuffer) {
      capacity = want;
    }
    if (capacity != in_capacity_) {
      std::unique_ptr<char[]> resized(new char[capacity]);
      if (pending > 0) std::memcpy(resized.get(), in_.get() + in_start_, pending);
      in_ = std::move(resized);
      in_capacity_ = capacity;
    } else if (in_start_ > 0) {
      if (pending > 0) std::memmove(in_.get(), in_.get() + in_start_, pending);
    }
    in_start_ = 0;
    in_end_ = pending;
  }

  // Runs every whole query buffered, then reads on (unless paused by the
  // reply bound or closed).
  void Process() {
    while (!closed_) {
      const bool busy = validated_ && server_->store_.Busy(this);
      if (busy || OverReplyBound()) {
        // A pause for the backend has no read or write in flight to keep
        // this connection alive until Resume().
        if (busy) resume_keepalive_ = shared_from_this();
        paused_ = true;
        return StartWriting();  // resumes Process() once enough is written
      }
      const std::string_view pending(in_.get() + in_start_, in_end_ - in_start_);
      if (pending.size() < need_) break;
      // The scanner resumes where the last read left it; the query is parsed
      // once, whole.
      const ScanResult scan = scanner_.Scan(pending);
      if (scan.kind == ScanResult::Kind::kIncomplete) {
        need_ = scan.needed;
        break;
      }
      ParseResult parsed;
      if (scan.kind == ScanResult::Kind::kFrame) {
        parsed = tcpstore::ParseQuery(pending.substr(0, scan.frame_bytes),
                                      server_->options_.limits);
        if (parsed.kind != ParseResult::Kind::kQuery && parsed.error.empty())
          parsed.error = "the query's fields do not fill its frame";  // never expected
      } else {
        parsed.error = scan.error;
      }
      if (parsed.kind != ParseResult::Kind::kQuery) {
        Log("sent a bad query ({}); closing the connection", parsed.error);
        server_->Refuse(validated_ ? Refusal::kBadQuery : Refusal::kHandshake);
        return Close();
      }
      in_start_ += parsed.consumed;
      need_ = 1;
      scanner_.Reset();
      Dispatch(std::move(parsed.query));
    }
    if (closed_) return;
    StartWriting();
    Read();
  }

  bool OverReplyBound() {
    std::lock_guard<std::mutex> lock(mu_);
    return OverBoundsLocked();
  }

  // REQUIRES: mu_ held.
  bool OverBoundsLocked() const {
    return server_->store_.OverReplyBounds(out_bytes_ + held_bytes_,
                                           server_->options_.max_queued_reply_bytes);
  }

  // REQUIRES: mu_ held.
  void AddOutBytesLocked(size_t bytes) {
    out_bytes_ += bytes;
    server_->store_.AddQueuedReplyBytes(bytes);
  }
  void SubtractOutBytesLocked(size_t bytes) {
    out_bytes_ -= bytes;
    server_->store_.SubtractQueuedReplyBytes(bytes);
  }

  static size_t BytesOf(const std::vector<StoreResponse>& replies) {
    size_t bytes = 0;
    for (const StoreResponse& reply : replies) bytes += reply.ByteSizeLong();
    return bytes;
  }

  // On its loop, once replies drained: resumes reading if paused and now
  // within the bounds.
  void AfterDrain() {
    const std::shared_ptr<Connection> keep = std::move(resume_keepalive_);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closed_ || OverBoundsLocked()) return;
    }
    if (paused_.exchange(false)) Process();
  }

  void Dispatch(Query query) {
    server_->queries_.Inc();
    if (!validated_) {
      if (query.type != QueryType::kValidate ||
          static_cast<uint32_t>(query.number) != tcpstore::kValidationMagic) {
        Log("did not start with c10d's handshake; closing the connection");
        server_->Refuse(Refusal::kHandshake);
        return Close();
      }
      auto ns = server_->options_.namespace_for
                    ? server_->options_.namespace_for(peer_)
                    : absl::StatusOr<std::string>(std::string());
      if (!ns.ok()) {
        Log("has no store to use: {}; closing the connection",
            std::string(ns.status().message()));
        server_->Refuse(Refusal::kNoNamespace);
        return Close();
      }
      ns_ = *ns;
      validated_ = true;
      handshake_timer_.cancel();
      return;
    }
    StoreRequest request;
    switch (query.type) {
      case QueryType::kValidate:  // again: harmless, as in torch's server
        return;
      case QueryType::kPing: {
        std::string bytes;
        tcpstore::AppendU32(&bytes, static_cast<uint32_t>(query.number));
        return Write(std::move(bytes));
      }
      case QueryType::kCancelWait: {
        server_->store_.CancelWaits(this);
        {
          std::lock_guard<std::mutex> lock(mu_);
          for (auto it = awaiting_.begin(); it != awaiting_.end();) {
            const bool wait =
                it->second == QueryType::kWait || it->second == QueryType::kBarrier;
            it = wait ? awaiting_.erase(it) : std::next(it);
          }
        }
        std::string bytes;
        tcpstore::AppendU8(&bytes,
                           static_cast<uint8_t>(tcpstore::WaitResponse::kWaitCanceled));
        return Write(std::move(bytes));
      }
      case QueryType::kSet: {
        auto* op = request.mutable_set();
        op->set_key(std::move(query.keys[0]));
        op->set_value(std::move(query.values[0]));
        break;
      }
      case QueryType::kCompareSet: {
        auto* op = request.mutable_compare_set();
        op->set_key(std::move(query.keys[0]));
        op->set_expected(std::move(query.values[0]));
        op->set_desired(std::move(query.values[1]));
        break;
      }
      case QueryType::kGet: {
        auto* op = request.mutable_get();
        op->set_key(std::move(query.keys[0]));
        op->set_if_present(true);
        break;
      }
      case QueryType::kAdd: {
        auto* op = request.mutable_add();
        op->set_key(std::move(query.keys[0]));
        op->set_delta(query.number);
        break;
      }
      case QueryType::kCheck:
        // Set even with no keys: c10d answers those too.
        request.mutable_check();
        for (std::string& key : query.keys)
          request.mutable_check()->add_keys(std::move(key));
        break;
      case QueryType::kWait:
        // Set even with no keys: c10d answers those too.
        request.mutable_wait();
        for (std::string& key : query.keys)
          request.mutable_wait()->add_keys(std::move(key));
        request.set_timeout_ms(kNoTimeoutMs);
        break;
      case QueryType::kGetNumKeys:
        request.mutable_num_keys();
        break;
      case QueryType::kDeleteKey:
        request.mutable_delete_()->set_key(std::move(query.keys[0]));
        break;
      case QueryType::kAppend: {
        auto* op = request.mutable_append();
        op->set_key(std::move(query.keys[0]));
        op->set_value(std::move(query.values[0]));
        break;
      }
      case QueryType::kMultiGet: {
        auto* op = request.mutable_multi_get();
        for (std::string& key : query.keys) op->add_keys(std::move(key));
        op->set_if_present(true);
        break;
      }
      case QueryType::kMultiSet: {
        auto* op = request.mutable_multi_set();
        for (size_t i = 0; i < query.keys.size(); ++i) {
          auto* entry = op->add_entries();
          entry->set_key(std::move(query.keys[i]));
          entry->set_value(std::move(query.values[i]));
        }
        break;
      }
      case QueryType::kQueuePush: {
        auto* op = request.mutable_queue_push();
        op->set_key(std::move(query.keys[0]));
        op->set_value(std::move(query.values[0]));
        break;
      }
      case QueryType::kQueuePop:
        request.mutable_queue_pop()->set_key(std::move(query.keys[0]));
        break;
      case QueryType::kQueueLen:
        request.mutable_queue_len()->set_key(std::move(query.keys[0]));
        break;
      case QueryType::kListKeys:
        request.mutable_list_keys();
        break;
      case QueryType::kBarrier: {
        auto* op = request.mutable_barrier();
        op->set_key(std::move(query.keys[0]));
        op->set_world_size(query.number);
        request.set_timeout_ms(kNoTimeoutMs);
        break;
      }
    }
    request.set_id(next_id_++);
    request.set_ns(ns_);
    {
      std::lock_guard<std::mutex> lock(mu_);
      awaiting_[request.id()] = query.type;
    }
    tls_dispatching = this;
    server_->store_.Handle(this, request);
    tls_dispatching = nullptr;
  }

  // On its loop: writes what queued up, unless a write is in flight.
  void StartWriting() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (writing_ || out_.empty()) return;
      writing_ = true;
    }
    WriteNext();
  }

  // The reply bytes c10d's client reads for `type`; empty for queries it
  // expects no reply to.
  static std::string Encode(QueryType type, const StoreResponse& reply) {
    std::string out;
    auto value = [&](int i) -> std::string_view {
      return i < reply.values_size() ? std::string_view(reply.values(i))
                                     : std::string_view();
    };
    switch (type) {
      case QueryType::kCompareSet:
      case QueryType::kGet:
        tcpstore::AppendBytes(&out, value(0));
        break;
      case QueryType::kAdd:
      case QueryType::kGetNumKeys:
      case QueryType::kQueueLen:
        tcpstore::AppendI64(&out, reply.number());
        break;
      case QueryType::kDeleteKey:
        tcpstore::AppendI64(&out, reply.flag() ? 1 : 0);
        break;
      case QueryType::kCheck:
        tcpstore::AppendU8(&out, static_cast<uint8_t>(
                                     reply.flag() ? tcpstore::CheckResponse::kReady
                                                  : tcpstore::CheckResponse::kNotReady));
        break;
      case QueryType::kWait:
      case QueryType::kBarrier:
        tcpstore::AppendU8(&out,
                           static_cast<uint8_t>(tcpstore::WaitResponse::kStopWaiting));
        break;
      case QueryType::kMultiGet:
        for (const std::string& v : reply.values()) tcpstore::AppendBytes(&out, v);
        break;
      case QueryType::kQueuePop:
        tcpstore::AppendI64(&out, reply.number());
        if (reply.number() > 0) tcpstore::AppendBytes(&out, value(0));
        break;
      case QueryType::kListKeys:
        tcpstore::AppendI64(&out, reply.values_size());
        for (const std::string& key : reply.values()) tcpstore::AppendBytes(&out, key);
        break;
      default:  // set, append, multi_set, queue_push: no reply
        break;
    }
    return out;
  }

  // On its loop: a reply made here (ping, cancel_wait).
  void Write(std::string bytes) {
    bool start = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closed_) return;
      AddOutBytesLocked(bytes.size());
      out_.push_back(std::move(bytes));
      if (!writing_) start = writing_ = true;
    }
    if (start) WriteNext();
  }

  // On its loop, with writing_ set: writes everything queued, a batch at a
  // time (gathered), until the queue is empty.
  void WriteNext() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closed_ || out_.empty()) {
        writing_ = false;
        return;
      }
      while (!out_.empty() && batch_.size() < 64) {
        batch_bytes_ += out_.front().size();
        batch_.push_back(std::move(out_.front()));
        out_.pop_front();
      }
    }
    std::vector<asio::const_buffer> buffers;
    buffers.reserve(batch_.size());
    for (const std::string& b : batch_) buffers.emplace_back(asio::buffer(b));
    asio::async_write(
        socket_, buffers,
        [self = shared_from_this()](boost::system::error_code ec, size_t /*n*/) {
          // Close() already took what was queued off the counts.
          const size_t written = self->batch_bytes_;
          self->batch_.clear();
          self->batch_bytes_ = 0;
          {
            std::lock_guard<std::mutex> lock(self->mu_);
            if (!self->closed_) self->SubtractOutBytesLocked(written);
          }
          if (ec) return self->Close();
          self->WriteNext();
          self->AfterDrain();
        });
  }

  // On its loop. Idempotent.
  void Close() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closed_) return;
      closed_ = true;
      out_.clear();
      SubtractOutBytesLocked(out_bytes_);
      awaiting_.clear();
    }
    boost::system::error_code ec;
    socket_.shutdown(tcp::socket::shutdown_both, ec);
    socket_.close(ec);
    handshake_timer_.cancel();
    resume_keepalive_.reset();
    if (session_open_) server_->store_.EndSession(this);
    server_->Forget(this);
  }

  template <typename... Args>
  void Log(const char* format, Args&&... args) {
    spdlog::info("tcpstore client {} {}", peer_,
                 fmt::format(fmt::runtime(format), std::forward<Args>(args)...));
  }

  std::shared_ptr<Impl> server_;
  tcp::socket socket_;
  const std::string peer_;              // its address: the per-peer cap's key
  asio::steady_timer handshake_timer_;  // until it validates
  tcpstore::FrameScanner scanner_;      // where the query being read ends
  // Its loop only: the read side.
  std::unique_ptr<char[]> in_;
  size_t in_capacity_ = 0;
  size_t in_start_ = 0;  // [in_start_, in_end_) is read and not yet parsed
  size_t in_end_ = 0;
  size_t need_ = 1;  // bytes the next parse needs before it can progress
  bool validated_ = false;
  // Set on its loop; read by SendHeld on any thread.
  std::atomic<bool> paused_{false};
  // Its loop only: this connection while the backend is Busy() for it.
  std::shared_ptr<Connection> resume_keepalive_;
  bool session_open_ = false;
  std::string ns_;
  uint64_t next_id_ = 1;
  std::vector<std::string> batch_;  // being written
  size_t batch_bytes_ = 0;
  // The reply side, from any thread.
  std::mutex mu_;
  bool closed_ = false;   // guarded by mu_ (written on its loop)
  bool writing_ = false;  // guarded by mu_
  std::deque<std::string> out_;
  // Reply bytes queued or being written; and those of replies held for the
  // log. Both count against this connection's bound and, through the store
  // service, against the bound of all sessions together.
  size_t out_bytes_ = 0;
  size_t held_bytes_ = 0;
  std::unordered_map<uint64_t, QueryType> awaiting_;  // request id -> its query
  int held_ = 0;
  std::shared_ptr<Connection> keepalive_;  // while replies are held for the log
};

void TcpStoreServer::Impl::StartConnection(
    tcp::socket socket, const std::string& peer,
    std::chrono::steady_clock::time_point handshake_deadline) {
  auto connection = std::make_shared<Connection>(shared_from_this(), std::move(socket),
                                                 peer, handshake_deadline);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    connections_[connection.get()] = connection;
  }
  tcpstore_connections_.Inc();
  connection->Start();
}

void TcpStoreServer::Impl::Stop() {
  if (stopping_.exchange(true)) return;
  asio::post(*ios_[0], [self = shared_from_this()] {
    boost::system::error_code ec;
    self->acceptor_.close(ec);
    self->accept_retry_.cancel();
  });
  std::vector<std::shared_ptr<Connection>> open;
  std::vector<std::shared_ptr<Unclassified>> unclassified;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [raw, weak] : connections_)
      if (auto c = weak.lock()) open.push_back(std::move(c));
    unclassified.assign(classifying_.begin(), classifying_.end());
  }
  for (auto& c : open) c->Shutdown();
  for (auto& pending : unclassified) {
    // The timer's executor: the socket may be moving to a connection.
    asio::post(pending->timer.get_executor(), [pending] {
      boost::system::error_code ec;
      pending->socket.close(ec);
      pending->timer.cancel();
    });
  }
  // Each loop returns once its connections are closed (Drain() runs what
  // they post to loops that already returned).
  for (auto& work : work_) work.reset();
}

void TcpStoreServer::Impl::CollectMetrics(std::vector<MetricFamily>* out) {
  MetricFamily connections{"meshrun_daemon_connections_total",
                           "Connections accepted on the daemon's port, by the protocol "
                           "their first byte named.",
                           "counter"};
  connections.Add({{"protocol", "tcpstore"}},
                  static_cast<double>(tcpstore_connections_.value()));
  connections.Add({{"protocol", "grpc"}}, static_cast<double>(grpc_connections_.value()));
  connections.Add({{"protocol", "link"}}, static_cast<double>(link_connections_.value()));
  MetricFamily open{"meshrun_tcpstore_connections_open",
                    "TCPStore protocol connections open now.", "gauge"};
  {
    std::lock_guard<std::mutex> lock(mu_);
    open.Add({}, static_cast<double>(connections_.size()));
  }
  MetricFamily queries{"meshrun_tcpstore_queries_total",
                       "TCPStore protocol queries received (each also counts as a "
                       "store operation).",
                       "counter"};
  queries.Add({}, static_cast<double>(queries_.value()));
  MetricFamily refused{"meshrun_tcpstore_connections_refused_total",
                       "TCPStore protocol connections the daemon closed, by reason: a "
                       "wrong handshake, a malformed or oversized query, a request the "
                       "store refused, no run to serve, gRPC not served there, no first "
                       "byte or VALIDATE within the handshake timeout, or (any protocol, "
                       "before its first byte) over the cap of connections in all or "
                       "from one address.",
                       "counter"};
  MetricFamily caps{"meshrun_daemon_connections_max",
                    "The caps on connections open on the daemon's port (TCPStore "
                    "clients and connections whose first byte has not come), in all "
                    "and from one address.",
                    "gauge"};
  caps.Add({{"scope", "total"}}, static_cast<double>(options_.max_connections));
  caps.Add({{"scope", "peer"}}, static_cast<double>(options_.max_connections_per_peer));
  for (int i = 0; i < static_cast<int>(Refusal::kCount); ++i)
    refused.Add({{"reason", ToString(static_cast<Refusal>(i))}},
                static_cast<double>(refused_[i].value()));
  for (MetricFamily* f : {&connections, &open, &queries, &refused, &caps})
    out->push_back(std::move(*f));
}

absl::StatusOr<std::unique_ptr<TcpStoreServer>> TcpStoreServer::Start(
    TcpStoreServerOptions options, StoreBackend& store) {
  if (options.io_threads <= 0)
    options.io_threads = IoThreadsFor(std::thread::hardware_concurrency());
  const int threads = options.io_threads;
  if (options.max_connections == 0) {
    rlimit limit{};
    const uint64_t soft = getrlimit(RLIMIT_NOFILE, &limit) == 0 ? limit.rlim_cur : 1024;
    options.max_connections = ConnectionCapFor(soft);
  }
  auto impl = std::make_shared<Impl>(std::move(options), store, threads);
  // Bound before a server exists: one that failed here has nothing to stop
  // (a Stop would queue its close in an io_context no thread ever runs).
  if (absl::Status s = impl->Bind(); !s.ok()) return s;
  std::unique_ptr<TcpStoreServer> server(new TcpStoreServer());
  server->impl_ = std::move(impl);
  server->port_ = server->impl_->port();
  server->impl_->Accept();
  for (int i = 0; i < threads; ++i) {
    server->threads_.emplace_back([impl = server->impl_, i] {
      // Runs until Stop() has closed the acceptor and every connection.
      impl->io(static_cast<size_t>(i)).run();
    });
  }
  return server;
}

int IoThreadsFor(unsigned cores) {
  return static_cast<int>(std::clamp(cores / 2, 1u, 8u));
}

const TcpStoreServerOptions& TcpStoreServer::options() const { return impl_->options_; }

boost::asio::io_context& TcpStoreServer::loop() { return impl_->io(0); }

void TcpStoreServer::Stop() {
  if (!impl_) return;
  impl_->Stop();
  for (std::thread& t : threads_) t.join();
  threads_.clear();
  impl_->Drain();
}

TcpStoreServer::~TcpStoreServer() { Stop(); }

void TcpStoreServer::CollectMetrics(std::vector<MetricFamily>* out) {
  if (impl_) impl_->CollectMetrics(out);
}

}  // namespace meshrun::rdzv
