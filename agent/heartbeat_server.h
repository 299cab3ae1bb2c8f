#pragma once

// The workers' heartbeats (meshrun.heartbeat() in Python, its C++ twin in the
// worker library), for --hang-timeout: datagrams on an abstract Unix socket
// that MESHRUN_HEARTBEAT_SOCKET names ("@meshrun-heartbeat-<hex>"; the '@'
// stands for the leading NUL), read on the agent's io_context.
//
// The kernel says who sent each datagram (SCM_CREDENTIALS), so a heartbeat
// counts for the process that sent it, whatever the datagram holds. Its bytes
// may carry the step's time the worker measured, "step=<seconds>" (for
// stragglers); anything else is a plain heartbeat. One from a process that is
// not one of the agent's running workers is refused and logged (the first
// few; then counted): nothing else changes.

#include <sys/types.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "agent/refusal_log.h"

namespace meshrun::agent {

class HeartbeatServer {
 public:
  // Called on `io`'s thread for each heartbeat with the sender's pid and the
  // step time it carries, if any; false: the pid is not one of the agent's
  // running workers.
  using OnHeartbeat = std::function<bool(pid_t, std::optional<double>)>;

  // Binds a fresh abstract socket and serves it on `io` until destroyed.
  // `io` must outlive it.
  static absl::StatusOr<std::unique_ptr<HeartbeatServer>> Start(
      boost::asio::io_context& io, OnHeartbeat on_heartbeat);
  ~HeartbeatServer();
  HeartbeatServer(const HeartbeatServer&) = delete;
  HeartbeatServer& operator=(const HeartbeatServer&) = delete;

  // The workers' MESHRUN_HEARTBEAT_SOCKET.
  const std::string& name() const { return name_; }
  uint64_t refused() const { return refusals_.count(); }

  // A datagram's step time: "step=<seconds>", finite and not negative.
  static std::optional<double> StepSeconds(std::string_view payload);

 private:
  HeartbeatServer(boost::asio::io_context& io, int fd, std::string name,
                  OnHeartbeat on_heartbeat);
  void Wait();
  void Receive();

  const std::string name_;
  const OnHeartbeat on_heartbeat_;
  boost::asio::posix::stream_descriptor socket_;
  RefusalLog refusals_{"heartbeats"};
  std::shared_ptr<HeartbeatServer*> self_;  // handlers check it is still there
};

}  // namespace meshrun::agent
