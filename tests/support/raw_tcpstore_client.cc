#include "tests/support/raw_tcpstore_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "tests/support/http_client.h"

namespace meshrun::testing {

using rdzv::tcpstore::MakeQuery;
using rdzv::tcpstore::QueryType;

int ConnectFrom(const char* source, int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in from{};
  from.sin_family = AF_INET;
  inet_pton(AF_INET, source, &from.sin_addr);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(port));
  to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&from), sizeof from) != 0 ||
      connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to) != 0) {
    if (fd >= 0) close(fd);
    return -1;
  }
  return fd;
}

RawClient::RawClient(int port, bool handshake, const char* source)
    : fd_(source ? ConnectFrom(source, port) : ConnectLoopback(port)) {
  // A send that the server does not read for a minute fails (SendRaw answers
  // false) rather than hanging the test.
  const timeval send_limit{60, 0};
  if (fd_ >= 0) setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &send_limit, sizeof send_limit);
  if (handshake && fd_ >= 0)
    Send(MakeQuery(QueryType::kValidate, {}, {}, rdzv::tcpstore::kValidationMagic));
}

RawClient::~RawClient() {
  if (fd_ >= 0) close(fd_);
}

bool RawClient::SendRaw(const std::string& bytes) { return SendAll(fd_, bytes); }

std::optional<std::string> RawClient::Read(size_t n, std::chrono::milliseconds timeout) {
  std::string out;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (out.size() < n) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return std::nullopt;
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left.count())) <= 0) return std::nullopt;
    char buf[4096];
    const ssize_t got = recv(fd_, buf, std::min(sizeof(buf), n - out.size()), 0);
    if (got <= 0) return std::nullopt;
    out.append(buf, static_cast<size_t>(got));
  }
  return out;
}

std::optional<int64_t> RawClient::ReadI64(std::chrono::milliseconds timeout) {
  auto bytes = Read(8, timeout);
  if (!bytes) return std::nullopt;
  int64_t v;
  std::memcpy(&v, bytes->data(), 8);
  return v;
}

std::optional<std::string> RawClient::ReadValue(std::chrono::milliseconds timeout) {
  auto size = ReadI64(timeout);
  if (!size || *size < 0) return std::nullopt;
  if (*size == 0) return std::string();
  return Read(static_cast<size_t>(*size), timeout);
}

bool RawClient::ClosedByPeer(std::chrono::milliseconds timeout) {
  pollfd p{fd_, POLLIN, 0};
  if (poll(&p, 1, static_cast<int>(timeout.count())) <= 0) return false;
  char c;
  return recv(fd_, &c, 1, MSG_PEEK) == 0 || (p.revents & (POLLHUP | POLLERR)) != 0;
}

}  // namespace meshrun::testing
