#include "agent/heartbeat_server.h"

#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace meshrun::agent {

namespace {}  // namespace

absl::StatusOr<std::unique_ptr<HeartbeatServer>> HeartbeatServer::Start(
    boost::asio::io_context& io, OnHeartbeat on_heartbeat) {
  const int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create the heartbeat socket: ", strerror(errno)));
  const int on = 1;
  std::random_device random;
  char name[64];
  std::snprintf(name, sizeof name, "meshrun-heartbeat-%08x%08x", random(), random());
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  // An abstract name: no file to remove, gone with the socket.
  std::memcpy(address.sun_path + 1, name, std::strlen(name));
  const socklen_t length =
      static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + std::strlen(name));
  if (setsockopt(fd, SOL_SOCKET, SO_PASSCRED, &on, sizeof on) != 0 ||
      bind(fd, reinterpret_cast<const sockaddr*>(&address), length) != 0) {
    auto status = absl::FailedPreconditionError(
        absl::StrCat("cannot bind the heartbeat socket: ", strerror(errno)));
    close(fd);
    return status;
  }
  std::unique_ptr<HeartbeatServer> server(
      new HeartbeatServer(io, fd, absl::StrCat("@", name), std::move(on_heartbeat)));
  server->Wait();
  return server;
}

HeartbeatServer::HeartbeatServer(boost::asio::io_context& io, int fd, std::string name,
                                 OnHeartbeat on_heartbeat)
    : name_(std::move(name)),
      on_heartbeat_(std::move(on_heartbeat)),
      socket_(io, fd),
      self_(std::make_shared<HeartbeatServer*>(this)) {}

HeartbeatServer::~HeartbeatServer() {
  *self_ = nullptr;
  boost::system::error_code ignored;
  socket_.close(ignored);
}

std::optional<double> HeartbeatServer::StepSeconds(std::string_view payload) {
  constexpr std::string_view kPrefix = "step=";
  if (payload.substr(0, kPrefix.size()) != kPrefix) return std::nullopt;
  double seconds = 0;
  const std::string_view number = payload.substr(kPrefix.size());
  if (!absl::SimpleAtod(absl::string_view(number.data(), number.size()), &seconds) ||
      !std::isfinite(seconds) || seconds < 0)
    return std::nullopt;
  return seconds;
}

void HeartbeatServer::Wait() {
  std::weak_ptr<HeartbeatServer*> weak = self_;
  socket_.async_wait(boost::asio::posix::stream_descriptor::wait_read,
                     [weak](const boost::system::error_code& error) {
                       auto self = weak.lock();
                       if (!self || *self == nullptr || error) return;
                       (*self)->Receive();
                       (*self)->Wait();
                     });
}

void HeartbeatServer::Receive() {
  for (;;) {
    char data[256];
    iovec part{data, sizeof data};
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(ucred))];
    msghdr message{};
    message.msg_iov = &part;
    message.msg_iovlen = 1;
    message.msg_control = control;
    message.msg_controllen = sizeof control;
    const ssize_t got = recvmsg(socket_.native_handle(), &message, MSG_DONTWAIT);
    if (got < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK)
        spdlog::warn("heartbeats: cannot receive: {}", strerror(errno));
      return;
    }
    pid_t sender = 0;
    for (cmsghdr* header = CMSG_FIRSTHDR(&message); header != nullptr;
         header = CMSG_NXTHDR(&message, header)) {
      if (header->cmsg_level == SOL_SOCKET && header->cmsg_type == SCM_CREDENTIALS) {
        ucred credentials;
        std::memcpy(&credentials, CMSG_DATA(header), sizeof credentials);
        sender = credentials.pid;
      }
    }
    const size_t size = std::min(static_cast<size_t>(got), sizeof data);
    if (sender > 0 && on_heartbeat_(sender, StepSeconds(std::string_view(data, size))))
      continue;
    refusals_.Refuse(absl::StrCat("one from pid ", sender,
                                  ", not one of this agent's running workers"));
  }
}

}  // namespace meshrun::agent
