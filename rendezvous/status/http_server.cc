#include "rendezvous/status/http_server.h"

#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

namespace meshrun::rdzv {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

class HttpServer::Impl {
 public:
  Impl(HttpServerOptions options, Handler handler)
      : options_(std::move(options)), handler_(std::move(handler)), acceptor_(io_) {}

  absl::Status Listen() {
    boost::system::error_code error;
    tcp::resolver resolver(io_);
    auto resolved = resolver.resolve(options_.host, std::to_string(options_.port),
                                     tcp::resolver::passive, error);
    if (error || resolved.empty()) {
      return absl::InvalidArgumentError("cannot resolve the metrics host " +
                                        options_.host +
                                        (error ? ": " + error.message() : ""));
    }
    tcp::endpoint endpoint = resolved.begin()->endpoint();
    acceptor_.open(endpoint.protocol(), error);
    if (!error) acceptor_.set_option(asio::socket_base::reuse_address(true), error);
    if (!error) acceptor_.bind(endpoint, error);
    if (!error) acceptor_.listen(asio::socket_base::max_listen_connections, error);
    if (error) {
      return absl::UnavailableError("metrics: cannot listen on " + options_.host + ":" +
                                    std::to_string(options_.port) + ": " +
                                    error.message());
    }
    port_ = acceptor_.local_endpoint().port();
    Accept();
    thread_ = std::thread([this] { io_.run(); });
    return absl::OkStatus();
  }

  void Stop() {
    if (!thread_.joinable()) return;
    asio::post(io_, [this] {
      boost::system::error_code ignored;
      acceptor_.close(ignored);
      // Sessions hold their own sockets; stopping the loop destroys them.
      io_.stop();
    });
    thread_.join();
  }

  int port() const { return port_; }

  void Count(int status) {
    std::lock_guard<std::mutex> lock(mu_);
    ++responses_[status];
  }

  void CollectMetrics(std::vector<MetricFamily>* out) {
    MetricFamily responses{"meshrun_http_responses_total",
                           "HTTP responses of the metrics/status server, by status code.",
                           "counter"};
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (const auto& [code, n] : responses_)
        responses.Add({{"code", std::to_string(code)}}, static_cast<double>(n));
    }
    MetricFamily rejected{
        "meshrun_http_connections_rejected_total",
        "HTTP connections closed at once: the connection limit was reached.", "counter"};
    rejected.Add({}, static_cast<double>(rejected_.value()));
    MetricFamily open{"meshrun_http_connections_open", "HTTP connections open now.",
                      "gauge"};
    open.Add({}, static_cast<double>(open_.load()));
    out->push_back(std::move(responses));
    out->push_back(std::move(rejected));
    out->push_back(std::move(open));
  }

  const HttpServerOptions& options() const { return options_; }
  const Handler& handler() const { return handler_; }
  std::atomic<size_t>& open() { return open_; }

 private:
  void Accept();

  const HttpServerOptions options_;
  const Handler handler_;
  // Before io_: sessions still queued in io_ when it is destroyed count
  // themselves out of open_.
  std::atomic<size_t> open_{0};
  Counter rejected_;
  std::mutex mu_;
  std::map<int, uint64_t> responses_;  // guarded by mu_
  asio::io_context io_{1};
  tcp::acceptor acceptor_;
  std::thread thread_;
  int port_ = 0;
};

namespace {

// One connection: read one request within the deadline, answer, close.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, HttpServer::Impl* server)
      : stream_(std::move(socket)), server_(server) {
    ++server_->open();
  }
  ~Session() { --server_->open(); }

  void Start() {
    parser_.header_limit(static_cast<uint32_t>(server_->options().max_header_bytes));
    parser_.body_limit(server_->options().max_body_bytes);
    // One deadline for the whole request: a client trickling bytes gains
    // nothing.
    stream_.expires_after(server_->options().request_timeout);
    http::async_read(stream_, buffer_, parser_,
                     [self = shared_from_this()](beast::error_code error, size_t) {
                       self->OnRead(error);
                     });
  }

 private:
  void OnRead(beast::error_code error) {
    if (error == beast::error::timeout || error == http::error::end_of_stream ||
        error == asio::error::eof || error == asio::error::connection_reset) {
      return Close();  // slow, silent or gone: nothing worth answering
    }
    if (error == http::error::header_limit) {
      return Reply(Error(431, "request header too large"), false);
    }
    if (error == http::error::body_limit) {
      return Reply(Error(413, "request body too large"), false);
    }
    if (error) return Reply(Error(400, "bad request: " + error.message()), false);
    const auto& request = parser_.get();
    const std::string method(request.method_string());
    HttpReply reply = server_->handler()(method, std::string(request.target()));
    Reply(std::move(reply), method == "HEAD");
  }

  static HttpReply Error(int status, const std::string& text) {
    HttpReply reply;
    reply.status = status;
    reply.body = text + "\n";
    return reply;
  }

  void Reply(HttpReply reply, bool head_only) {
    server_->Count(reply.status);
    response_.result(static_cast<unsigned>(reply.status));
    response_.version(11);
    response_.set(http::field::server, "meshrun-rdzvd");
    response_.set(http::field::content_type, reply.content_type);
    response_.set(http::field::cache_control, "no-store");
    response_.set("X-Content-Type-Options", "nosniff");
    for (const auto& [name, value] : reply.headers) response_.set(name, value);
    response_.keep_alive(false);
    const size_t length = reply.body.size();
    if (!head_only) response_.body() = std::move(reply.body);
    response_.prepare_payload();
    if (head_only) response_.content_length(length);
    stream_.expires_after(server_->options().request_timeout);
    http::async_write(
        stream_, response_,
        [self = shared_from_this()](beast::error_code, size_t) { self->Close(); });
  }

  void Close() {
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ignored);
    stream_.close();
  }

  beast::tcp_stream stream_;
  HttpServer::Impl* const server_;
  beast::flat_buffer buffer_;
  http::request_parser<http::string_body> parser_;
  http::response<http::string_body> response_;
};

}  // namespace

void HttpServer::Impl::Accept() {
  acceptor_.async_accept([this](beast::error_code error, tcp::socket socket) {
    if (error == asio::error::operation_aborted || !acceptor_.is_open()) return;
    if (!error) {
      if (open_.load() >= options_.max_connections) {
        rejected_.Inc();
        boost::system::error_code ignored;
        socket.close(ignored);
      } else {
        std::make_shared<Session>(std::move(socket), this)->Start();
      }
    }
    Accept();
  });
}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(HttpServerOptions options,
                                                              Handler handler) {
  std::unique_ptr<HttpServer> server(new HttpServer());
  server->impl_ = std::make_unique<Impl>(std::move(options), std::move(handler));
  absl::Status status = server->impl_->Listen();
  if (!status.ok()) return status;
  server->port_ = server->impl_->port();
  return server;
}

HttpServer::~HttpServer() { Stop(); }

void HttpServer::Stop() {
  if (impl_) impl_->Stop();
}

void HttpServer::CollectMetrics(std::vector<MetricFamily>* out) {
  impl_->CollectMetrics(out);
}

}  // namespace meshrun::rdzv
