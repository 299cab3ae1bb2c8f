#include "agent/heartbeat_server.h"

#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <boost/asio/post.hpp>
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
  const int wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake_fd < 0) {
    auto status = absl::FailedPreconditionError(
        absl::StrCat("cannot create the heartbeat socket's eventfd: ", strerror(errno)));
    close(fd);
    return status;
  }
  std::unique_ptr<HeartbeatServer> server(new HeartbeatServer(
      io, fd, wake_fd, absl::StrCat("@", name), std::move(on_heartbeat)));
  server->reader_ = std::thread([raw = server.get()] { raw->Read(); });
  return server;
}

HeartbeatServer::HeartbeatServer(boost::asio::io_context& io, int fd, int wake_fd,
                                 std::string name, OnHeartbeat on_heartbeat)
    : io_(io),
      fd_(fd),
      wake_fd_(wake_fd),
      name_(std::move(name)),
      on_heartbeat_(std::move(on_heartbeat)),
      self_(std::make_shared<HeartbeatServer*>(this)) {}

HeartbeatServer::~HeartbeatServer() {
  *self_ = nullptr;
  stopping_ = true;  // a flood never lets the reader back to poll()
  const uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof one);
  if (reader_.joinable()) reader_.join();
  close(fd_);
  close(wake_fd_);
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

void HeartbeatServer::Read() {
  for (;;) {
    pollfd waits[2] = {{fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
    if (poll(waits, 2, -1) < 0) {
      if (errno == EINTR) continue;
      spdlog::warn("heartbeats: cannot wait for the socket: {}", strerror(errno));
      return;
    }
    if (waits[1].revents != 0 || stopping_) return;
    // Until the socket is empty: the kernel's queue is short (a few
    // datagrams), so a reader that falls behind drops the workers' heartbeats
    // (their sends fail) as well as a flood's. Merging by sender (Note) is
    // what bounds the io_context's share.
    while (!stopping_.load(std::memory_order_relaxed)) {
      char data[256];
      iovec part{data, sizeof data};
      alignas(cmsghdr) char control[CMSG_SPACE(sizeof(ucred))];
      msghdr message{};
      message.msg_iov = &part;
      message.msg_iovlen = 1;
      message.msg_control = control;
      message.msg_controllen = sizeof control;
      const ssize_t got = recvmsg(fd_, &message, MSG_DONTWAIT);
      if (got < 0) {
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
          spdlog::warn("heartbeats: cannot receive: {}", strerror(errno));
        break;
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
      Note(sender, StepSeconds(std::string_view(data, size)));
    }
  }
}

void HeartbeatServer::Note(pid_t sender, std::optional<double> step) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = batch_.find(sender);
  if (it == batch_.end()) {
    if (batch_.size() >= kSendersPerBatch) {
      ++overflow_;
      return;
    }
    it = batch_.emplace(sender, Beats{}).first;
  }
  if (step) {
    std::vector<double>& steps = it->second.steps;
    if (steps.size() == kStepsPerBatch) steps.erase(steps.begin());
    steps.push_back(*step);
  }
  if (batch_posted_) return;
  batch_posted_ = true;
  std::weak_ptr<HeartbeatServer*> weak = self_;
  boost::asio::post(io_, [weak] {
    auto self = weak.lock();
    if (self && *self != nullptr) (*self)->DeliverBatch();
  });
}

void HeartbeatServer::DeliverBatch() {
  std::map<pid_t, Beats> batch;
  uint64_t overflow = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    batch.swap(batch_);
    batch_posted_ = false;
    overflow = overflow_;
  }
  for (const auto& [sender, beats] : batch) {
    bool worker = sender > 0;
    if (worker && beats.steps.empty()) worker = on_heartbeat_(sender, std::nullopt);
    for (double step : beats.steps) {
      if (!worker) break;
      worker = on_heartbeat_(sender, step);
    }
    if (!worker)
      refusals_.Refuse(absl::StrCat("one from pid ", sender,
                                    ", not one of this agent's running workers"));
  }
  if (overflow > overflow_refusals_) {
    if (overflow_refusals_ == 0)
      spdlog::warn(
          "heartbeats: refused some from senders past the first {} of a batch "
          "(a flood?); further ones are counted",
          kSendersPerBatch);
    overflow_refusals_ = overflow;
  }
}

}  // namespace meshrun::agent
