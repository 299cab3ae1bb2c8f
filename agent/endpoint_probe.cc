#include "agent/endpoint_probe.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <optional>
#include <vector>

#include "absl/strings/str_join.h"
#include "rendezvous/client/endpoint_list.h"

namespace meshrun::agent {

namespace {

// The HTTP/2 client connection preface and an empty SETTINGS frame: a gRPC
// server answers with its own SETTINGS frame.
constexpr char kPreface[] = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
constexpr unsigned char kEmptySettings[9] = {0, 0, 0, 4, 0, 0, 0, 0, 0};

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

int MillisLeft(std::chrono::steady_clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      deadline - std::chrono::steady_clock::now());
  return left.count() > 0 ? static_cast<int>(left.count()) : 0;
}

// 0 when connected, else the errno (ETIMEDOUT when `deadline` passed).
int ConnectBy(int fd, const addrinfo& address,
              std::chrono::steady_clock::time_point deadline) {
  if (connect(fd, address.ai_addr, address.ai_addrlen) == 0) return 0;
  if (errno != EINPROGRESS) return errno;
  pollfd p{fd, POLLOUT, 0};
  if (poll(&p, 1, MillisLeft(deadline)) <= 0) return ETIMEDOUT;
  int error = 0;
  socklen_t len = sizeof error;
  if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &len) != 0) return errno;
  return error;
}

}  // namespace

Greeting ClassifyGreeting(std::string_view bytes) {
  if (bytes.rfind("HTTP/", 0) == 0) return Greeting::kHttp1;
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(bytes[i]); };
  // A TLS record: handshake (22) or alert (21), then version major 3.
  if (bytes.size() >= 2 && (byte(0) == 21 || byte(0) == 22) && byte(1) == 3)
    return Greeting::kTls;
  // An HTTP/2 frame header: 24-bit length, type, flags, stream id. A server
  // starts with SETTINGS (4) on stream 0; GOAWAY (7) is an HTTP/2 answer too.
  if (bytes.size() >= 9 && (byte(3) == 4 || byte(3) == 7) && byte(5) == 0 &&
      byte(6) == 0 && byte(7) == 0 && byte(8) == 0)
    return Greeting::kHttp2;
  return Greeting::kUnknown;
}

ProbeResult ProbeEndpoint(const std::string& endpoint, bool tls,
                          std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string host, port;
  if (!endpoint.empty() && endpoint.front() == '[') {
    const size_t close = endpoint.find(']');
    host = endpoint.substr(1, close - 1);
    if (close != std::string::npos && close + 1 < endpoint.size())
      port = endpoint.substr(close + 2);
  } else if (size_t colon = endpoint.rfind(':'); colon != std::string::npos) {
    host = endpoint.substr(0, colon);
    port = endpoint.substr(colon + 1);
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (int error = getaddrinfo(host.c_str(), port.c_str(), &hints, &found); error != 0) {
    return {ProbeResult::Kind::kUnresolvable,
            "cannot resolve host " + host + ": " + gai_strerror(error)};
  }
  int connect_error = ECONNREFUSED;
  int fd = -1;
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    int s = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                   a->ai_protocol);
    if (s < 0) continue;
    connect_error = ConnectBy(s, *a, deadline);
    if (connect_error == 0) {
      fd = s;
    } else {
      close(s);
    }
  }
  freeaddrinfo(found);
  if (fd < 0) {
    if (connect_error == ECONNREFUSED)
      return {ProbeResult::Kind::kRefused,
              "connection refused: nothing listens on " + endpoint + " (yet)"};
    if (connect_error == ETIMEDOUT)
      return {ProbeResult::Kind::kUnreachable,
              "no answer to a TCP connection to " + endpoint};
    return {ProbeResult::Kind::kUnreachable,
            "cannot connect to " + endpoint + ": " + std::strerror(connect_error)};
  }
  Fd socket_fd(fd);
  if (tls) return {ProbeResult::Kind::kAnswers, "it accepts TCP connections"};
  std::string hello(kPreface);
  hello.append(reinterpret_cast<const char*>(kEmptySettings), sizeof kEmptySettings);
  // The socket buffer takes these few bytes at once.
  if (send(fd, hello.data(), hello.size(), MSG_NOSIGNAL) !=
      static_cast<ssize_t>(hello.size()))
    return {ProbeResult::Kind::kSilent, "it accepts TCP connections but drops them"};
  std::string answer;
  char buffer[64];
  while (answer.size() < 9) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, MillisLeft(deadline)) <= 0) break;
    ssize_t n = recv(fd, buffer, sizeof buffer, 0);
    if (n <= 0) break;
    answer.append(buffer, static_cast<size_t>(n));
    if (ClassifyGreeting(answer) != Greeting::kUnknown) break;
  }
  if (answer.empty())
    return {ProbeResult::Kind::kSilent,
            "something accepts TCP connections on " + endpoint +
                " but does not answer as a gRPC server (a daemon that is stopped, "
                "overloaded or out of file descriptors, or another program)"};
  switch (ClassifyGreeting(answer)) {
    case Greeting::kHttp2:
      return {ProbeResult::Kind::kAnswers, "it answers HTTP/2"};
    case Greeting::kHttp1:
      return {ProbeResult::Kind::kNotMeshrun,
              "an HTTP/1 server answers on " + endpoint +
                  ", not a meshrun rendezvous daemon (wrong port?)"};
    case Greeting::kTls:
      return {ProbeResult::Kind::kNotMeshrun,
              "the server on " + endpoint +
                  " expects TLS: give --tls-ca (a daemon with --tls-cert), or check "
                  "the port"};
    case Greeting::kUnknown:
      break;
  }
  return {ProbeResult::Kind::kNotMeshrun, "the server on " + endpoint +
                                              " does not speak gRPC: not a meshrun "
                                              "rendezvous daemon (wrong port?)"};
}

ProbeResult ProbeEndpoints(const std::string& endpoints, bool tls,
                           std::chrono::milliseconds timeout) {
  const std::vector<std::string> entries = rdzv::SplitEndpointList(endpoints);
  if (entries.size() == 1) return ProbeEndpoint(endpoints, tls, timeout);
  std::optional<ProbeResult::Kind> first;
  std::vector<std::string> details;
  for (const std::string& entry : entries) {
    ProbeResult result = ProbeEndpoint(entry, tls, timeout);
    if (result.kind == ProbeResult::Kind::kAnswers ||
        result.kind == ProbeResult::Kind::kNotMeshrun) {
      result.detail = entry + ": " + result.detail;
      return result;
    }
    if (!first) first = result.kind;
    details.push_back(entry + ": " + result.detail);
  }
  return {*first, "no replica serves (" + absl::StrJoin(details, "; ") + ")"};
}

}  // namespace meshrun::agent
