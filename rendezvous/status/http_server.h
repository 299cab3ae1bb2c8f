#pragma once

// A small HTTP/1.1 server on Boost.Beast for the daemon's /metrics, status
// page and /api/status. One thread, one request per connection (answered
// with Connection: close), and bounds on everything a client controls: the
// number of connections (beyond it, new ones are closed at once), the size of
// the request head and body (431 / 413), and the time a connection may take
// to send its request (slowloris: closed after `request_timeout`).
//
// Thread-safe. The handler runs on the server's thread and must not block
// for long: it delays every other client.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "rendezvous/status/metrics.h"

namespace meshrun::rdzv {

struct HttpReply {
  int status = 200;
  std::string content_type = "text/plain; charset=utf-8";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
};

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;  // 0: kernel-assigned; read it back from port()
  size_t max_connections = 64;
  size_t max_header_bytes = 8192;
  // Nothing served takes a body; a small one is read and ignored.
  size_t max_body_bytes = 4096;
  // From accepting a connection to having read its whole request, and again
  // for writing the reply.
  std::chrono::milliseconds request_timeout{5000};
};

class HttpServer {
 public:
  // `method` is upper case (GET, HEAD, POST, ...); `target` the raw
  // request-target ("/api/status?x=1").
  using Handler =
      std::function<HttpReply(const std::string& method, const std::string& target)>;

  // Binds and starts serving on its own thread.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(HttpServerOptions options,
                                                           Handler handler);
  ~HttpServer();  // Stop()
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const { return port_; }
  // Closes the listener and every connection, and joins the thread.
  void Stop();

  // meshrun_http_responses_total{code}, connections rejected and open.
  void CollectMetrics(std::vector<MetricFamily>* out);

  class Impl;  // Beast and Asio live in the .cc

 private:
  HttpServer() = default;
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
};

}  // namespace meshrun::rdzv
