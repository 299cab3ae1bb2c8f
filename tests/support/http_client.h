#pragma once

// Test support: raw HTTP/1.1 over loopback TCP, for the daemon's metrics and
// status port (which answers one request per connection and closes), and
// reading Prometheus text. Every wait has a deadline.

#include <chrono>
#include <functional>
#include <optional>
#include <string>

namespace meshrun::testing {

// A connected TCP socket to 127.0.0.1:port, or -1.
// -1 with errno set when the connection cannot be made.
int ConnectLoopback(int port);
bool SendAll(int fd, const std::string& data);
// Everything the peer sends until it closes, or nullopt at the deadline.
std::optional<std::string> ReadToClose(int fd, std::chrono::milliseconds timeout);

struct HttpResult {
  int status = 0;  // 0: no (parsable) answer
  std::string head;
  std::string body;
};

// Sends `raw` as is, reads the answer until the server closes.
HttpResult HttpRequest(int port, const std::string& raw,
                       std::chrono::milliseconds timeout = std::chrono::seconds(10));
HttpResult HttpGet(int port, const std::string& path);

// The value of one sample, "name" or "name{labels}" exactly as rendered.
std::optional<double> MetricSample(const std::string& text, const std::string& sample);

// Scrapes /metrics until `ok` holds or `timeout` passes; the last scrape.
std::string ScrapeUntil(int port, const std::function<bool(const std::string&)>& ok,
                        std::chrono::milliseconds timeout = std::chrono::seconds(60));

}  // namespace meshrun::testing
