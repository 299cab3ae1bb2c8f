#include "tests/support/http_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <sstream>
#include <thread>

namespace meshrun::testing {

using std::chrono::milliseconds;

int ConnectLoopback(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) return fd;
  // A signal (libFuzzer's SIGALRM) can interrupt a connect that waits for a
  // SYN's retransmission; the handshake goes on, so wait for it to end.
  if (errno == EINTR) {
    pollfd p{fd, POLLOUT, 0};
    int ready;
    do ready = poll(&p, 1, 30'000);
    while (ready < 0 && errno == EINTR);
    int error = ready == 1 ? 0 : ETIMEDOUT;
    socklen_t len = sizeof error;
    if (ready == 1) getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len);
    if (error == 0) return fd;
    errno = error;
  }
  const int saved = errno;
  close(fd);
  errno = saved;
  return -1;
}

bool SendAll(int fd, const std::string& data) {
  size_t sent = 0;
  while (sent < data.size()) {
    ssize_t n = send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return false;
    sent += static_cast<size_t>(n);
  }
  return true;
}

std::optional<std::string> ReadToClose(int fd, milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string out;
  char buf[16384];
  while (true) {
    const auto left = std::chrono::duration_cast<milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return std::nullopt;
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) return out;  // closed (or reset)
    out.append(buf, static_cast<size_t>(n));
  }
}

HttpResult HttpRequest(int port, const std::string& raw, milliseconds timeout) {
  HttpResult result;
  int fd = ConnectLoopback(port);
  if (fd < 0) return result;
  if (SendAll(fd, raw)) {
    if (auto response = ReadToClose(fd, timeout)) {
      size_t split = response->find("\r\n\r\n");
      result.head = response->substr(0, split);
      if (split != std::string::npos) result.body = response->substr(split + 4);
      if (result.head.rfind("HTTP/1.1 ", 0) == 0)
        result.status = std::atoi(result.head.c_str() + 9);
    }
  }
  close(fd);
  return result;
}

HttpResult HttpGet(int port, const std::string& path) {
  return HttpRequest(port, "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
}

std::optional<double> MetricSample(const std::string& text, const std::string& sample) {
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.size() > sample.size() && line.compare(0, sample.size(), sample) == 0 &&
        line[sample.size()] == ' ')
      return std::strtod(line.c_str() + sample.size() + 1, nullptr);
  }
  return std::nullopt;
}

std::string ScrapeUntil(int port, const std::function<bool(const std::string&)>& ok,
                        milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string body;
  while (std::chrono::steady_clock::now() < deadline) {
    HttpResult r = HttpGet(port, "/metrics");
    body = r.body;
    if (r.status == 200 && ok(body)) return body;
    std::this_thread::sleep_for(milliseconds(50));
  }
  return body;
}

}  // namespace meshrun::testing
