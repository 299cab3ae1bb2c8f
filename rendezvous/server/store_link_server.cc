#include "rendezvous/server/store_link_server.h"

#include <spdlog/spdlog.h>
#include <unistd.h>

#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <deque>
#include <limits>
#include <mutex>
#include <unordered_map>
#include <utility>

#include "rendezvous/core/store_link_wire.h"
#include "rendezvous/security/auth.h"

namespace meshrun::rdzv {

namespace asio = boost::asio;
using asio::ip::tcp;
using meshrun::v1::StoreLinkHello;
using meshrun::v1::StoreLinkWelcome;
using meshrun::v1::StoreRequestBatch;
using meshrun::v1::StoreResponse;
using meshrun::v1::StoreResponseBatch;

class StoreLinkServer::Impl : public std::enable_shared_from_this<StoreLinkServer::Impl> {
 public:
  Impl(StoreLinkServerOptions options, StoreService& store)
      : options_(std::move(options)), store_(store), work_(asio::make_work_guard(io_)) {}

  class Link;

  void Adopt(int fd);
  void Stop();
  void Forget(Link* link) {
    std::lock_guard<std::mutex> lock(mu_);
    links_.erase(link);
  }

  const StoreLinkServerOptions options_;
  StoreService& store_;
  asio::io_context io_;
  asio::executor_work_guard<asio::io_context::executor_type> work_;
  std::mutex mu_;
  std::unordered_map<Link*, std::weak_ptr<Link>> links_;  // guarded by mu_
  bool stopping_ = false;                                 // guarded by mu_
  Counter accepted_;
  Counter refused_;
};

// One link. Reads on the I/O thread; replies come from the StoreService on
// any thread and leave in frames of as many as queued up.
class StoreLinkServer::Impl::Link final : public StoreReplySink,
                                          public std::enable_shared_from_this<Link> {
 public:
  Link(std::shared_ptr<Impl> server, tcp::socket socket)
      : server_(std::move(server)), socket_(std::move(socket)), timer_(server_->io_) {}

  void Start() {
    server_->store_.OpenSession();
    timer_.expires_after(server_->options_.handshake_timeout);
    timer_.async_wait([weak = weak_from_this()](boost::system::error_code ec) {
      auto self = weak.lock();
      if (ec || !self || self->welcomed_) return;
      self->Refuse("sent no hello in time");
    });
    in_.resize(link::kMagic.size());
    asio::async_read(socket_, asio::buffer(in_),
                     [self = shared_from_this()](boost::system::error_code ec, size_t) {
                       if (ec) return self->Close();
                       if (self->in_ != link::kMagic) return self->Refuse("wrong magic");
                       self->ReadHeader();
                     });
  }

  // StoreReplySink.
  void Send(StoreResponse reply) override {
    std::vector<StoreResponse> one(1);
    one[0] = std::move(reply);
    SendAll(&one);
  }
  void SendAll(std::vector<StoreResponse>* replies) override {
    bool start = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closed_) return;
      for (StoreResponse& reply : *replies) {
        const size_t bytes = reply.ByteSizeLong();
        out_bytes_ += bytes;
        server_->store_.AddQueuedReplyBytes(bytes);
        out_.push_back(std::move(reply));
      }
      if (!writing_ && !out_.empty()) start = writing_ = true;
    }
    if (start)
      asio::post(server_->io_, [self = shared_from_this()] { self->WriteNext(); });
  }
  void Hold(const std::vector<StoreResponse>& replies) override {
    size_t bytes = 0;
    for (const StoreResponse& reply : replies) bytes += reply.ByteSizeLong();
    std::lock_guard<std::mutex> lock(mu_);
    if (held_++ == 0) keepalive_ = shared_from_this();
    held_bytes_ += bytes;
    server_->store_.AddQueuedReplyBytes(bytes);
  }
  void SendHeld(std::vector<StoreResponse>* replies) override {
    size_t bytes = 0;
    for (const StoreResponse& reply : *replies) bytes += reply.ByteSizeLong();
    SendAll(replies);
    std::shared_ptr<Link> last;
    {
      std::lock_guard<std::mutex> lock(mu_);
      held_bytes_ -= bytes;
      server_->store_.SubtractQueuedReplyBytes(bytes);
      if (--held_ == 0) last = std::move(keepalive_);
    }
    asio::post(server_->io_, [self = shared_from_this()] { self->MaybeResume(); });
  }
  bool DeferIfOverBounds() override { return false; }
  void MarkDeferred() override {}
  size_t RoomBytes() override { return std::numeric_limits<size_t>::max(); }

  // Any thread.
  void Shutdown() {
    asio::post(server_->io_, [self = shared_from_this()] { self->Close(); });
  }

 private:
  void ReadHeader() {
    in_.resize(link::kHeaderBytes);
    asio::async_read(socket_, asio::buffer(in_),
                     [self = shared_from_this()](boost::system::error_code ec, size_t) {
                       if (ec) return self->Close();
                       const uint32_t length = link::FrameLength(self->in_.data());
                       if (length > self->server_->options_.max_frame_bytes)
                         return self->Refuse("sent a frame of " + std::to_string(length) +
                                             " bytes, over the limit");
                       self->ReadBody(length);
                     });
  }

  void ReadBody(uint32_t length) {
    in_.resize(length);
    asio::async_read(socket_, asio::buffer(in_),
                     [self = shared_from_this()](boost::system::error_code ec, size_t) {
                       if (ec) return self->Close();
                       self->Dispatch();
                     });
  }

  void Dispatch() {
    if (!welcomed_) {
      StoreLinkHello hello;
      if (!hello.ParseFromString(in_)) return Refuse("sent a malformed hello");
      StoreLinkWelcome welcome;
      const std::string& token = server_->options_.token;
      if (!token.empty() && !TokensEqual(hello.token(), token))
        welcome.set_error(hello.token().empty() ? "no token" : "wrong token");
      std::string bytes;
      link::AppendFrame(welcome, &bytes);
      if (!welcome.error().empty()) {
        // Say why, then close.
        auto out = std::make_shared<std::string>(std::move(bytes));
        asio::async_write(socket_, asio::buffer(*out),
                          [self = shared_from_this(), out, why = welcome.error()](
                              boost::system::error_code, size_t) { self->Refuse(why); });
        return;
      }
      welcomed_ = true;
      timer_.cancel();
      server_->accepted_.Inc();
      Write(std::move(bytes));
      return ReadHeader();
    }
    StoreRequestBatch batch;
    if (!batch.ParseFromString(in_)) return Refuse("sent a malformed batch");
    if (static_cast<size_t>(batch.requests_size()) >
        server_->options_.max_requests_per_batch)
      return Refuse("sent a batch of " + std::to_string(batch.requests_size()) +
                    " requests, over the limit");
    for (const auto& request : batch.requests()) server_->store_.Handle(this, request);
    MaybeResume(/*after_batch=*/true);
  }

  // Reads the next frame unless the replies queued are over the bound (a
  // write's end calls this again).
  void MaybeResume(bool after_batch = false) {
    if (!after_batch && !paused_) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closed_) return;
      if (server_->store_.OverReplyBounds(out_bytes_ + held_bytes_,
                                          server_->options_.max_queued_reply_bytes)) {
        paused_ = true;
        return;
      }
    }
    paused_ = false;
    ReadHeader();
  }

  // A frame made on the I/O thread (the welcome).
  void Write(std::string bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    pending_frames_.push_back(std::move(bytes));
    if (!writing_) {
      writing_ = true;
      asio::post(server_->io_, [self = shared_from_this()] { self->WriteNext(); });
    }
  }

  // On the I/O thread, with writing_ set: frames what queued up and writes it.
  void WriteNext() {
    size_t framed = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closed_) return;
      wbuf_.clear();
      for (std::string& frame : pending_frames_) wbuf_ += frame;
      pending_frames_.clear();
      if (!out_.empty()) {
        StoreResponseBatch batch;
        size_t bytes = 0;
        while (!out_.empty() &&
               (bytes == 0 || bytes < server_->options_.max_reply_batch_bytes)) {
          bytes += out_.front().ByteSizeLong();
          *batch.add_responses() = std::move(out_.front());
          out_.pop_front();
        }
        framed = bytes;
        link::AppendFrame(batch, &wbuf_);
      }
      if (wbuf_.empty()) {
        writing_ = false;
        return;
      }
    }
    asio::async_write(
        socket_, asio::buffer(wbuf_),
        [self = shared_from_this(), framed](boost::system::error_code ec, size_t) {
          {
            std::lock_guard<std::mutex> lock(self->mu_);
            if (!self->closed_) {
              self->out_bytes_ -= framed;
              self->server_->store_.SubtractQueuedReplyBytes(framed);
            }
          }
          if (ec) return self->Close();
          self->WriteNext();
          self->MaybeResume();
        });
  }

  void Refuse(const std::string& why) {
    if (!closed_) {
      spdlog::info("store link from {}: {}; closing it", Peer(), why);
      server_->refused_.Inc();
    }
    Close();
  }

  std::string Peer() const {
    boost::system::error_code ec;
    const auto endpoint = socket_.remote_endpoint(ec);
    return ec ? std::string("?") : endpoint.address().to_string();
  }

  // On the I/O thread. Idempotent.
  void Close() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (closed_) return;
      closed_ = true;
      server_->store_.SubtractQueuedReplyBytes(out_bytes_);
      out_bytes_ = 0;
      out_.clear();
    }
    boost::system::error_code ec;
    socket_.shutdown(tcp::socket::shutdown_both, ec);
    socket_.close(ec);
    timer_.cancel();
    server_->store_.EndSession(this);
    server_->Forget(this);
  }

  std::shared_ptr<Impl> server_;
  tcp::socket socket_;
  asio::steady_timer timer_;  // the handshake deadline
  // I/O thread only.
  std::string in_;
  std::string wbuf_;
  bool welcomed_ = false;
  bool paused_ = false;
  std::mutex mu_;
  bool closed_ = false;                      // guarded by mu_
  bool writing_ = false;                     // guarded by mu_
  std::deque<StoreResponse> out_;            // guarded by mu_
  std::vector<std::string> pending_frames_;  // guarded by mu_
  size_t out_bytes_ = 0;                     // guarded by mu_
  size_t held_ = 0;                          // guarded by mu_
  size_t held_bytes_ = 0;                    // guarded by mu_
  std::shared_ptr<Link> keepalive_;          // while replies are held
};

void StoreLinkServer::Impl::Adopt(int fd) {
  asio::post(io_, [self = shared_from_this(), fd] {
    tcp::socket socket(self->io_);
    boost::system::error_code ec;
    socket.assign(tcp::v4(), fd, ec);  // the protocol only tags the socket
    if (ec) {
      ::close(fd);
      return;
    }
    socket.set_option(tcp::no_delay(true), ec);
    auto link = std::make_shared<Link>(self, std::move(socket));
    {
      std::lock_guard<std::mutex> lock(self->mu_);
      if (self->stopping_) return;  // the socket closes with `link`
      self->links_[link.get()] = link;
    }
    link->Start();
  });
}

void StoreLinkServer::Impl::Stop() {
  std::vector<std::shared_ptr<Link>> open;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    for (auto& [ptr, weak] : links_)
      if (auto link = weak.lock()) open.push_back(std::move(link));
  }
  for (auto& link : open) link->Shutdown();
  work_.reset();
}

StoreLinkServer::StoreLinkServer(StoreLinkServerOptions options, StoreService& store)
    : impl_(std::make_shared<Impl>(std::move(options), store)) {
  thread_ = std::thread([impl = impl_] { impl->io_.run(); });
}

StoreLinkServer::~StoreLinkServer() { Stop(); }

void StoreLinkServer::Adopt(int fd) { impl_->Adopt(fd); }

void StoreLinkServer::Stop() {
  if (!thread_.joinable()) return;
  impl_->Stop();
  thread_.join();
  // Replies posted after the loop ended hold their links (and the links
  // this server): run them, which finds the links closed.
  impl_->io_.restart();
  impl_->io_.poll();
}

void StoreLinkServer::CollectMetrics(std::vector<MetricFamily>* out) {
  MetricFamily links{"meshrun_store_links_total",
                     "Store links (an agent's relay to the daemon, without gRPC) by "
                     "outcome: accepted, or refused (wrong magic or token, an "
                     "oversized or malformed frame).",
                     "counter"};
  links.Add({{"outcome", "accepted"}}, static_cast<double>(impl_->accepted_.value()));
  links.Add({{"outcome", "refused"}}, static_cast<double>(impl_->refused_.value()));
  out->push_back(std::move(links));
}

}  // namespace meshrun::rdzv
