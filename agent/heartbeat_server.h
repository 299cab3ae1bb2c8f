#pragma once

// The workers' heartbeats (meshrun.heartbeat() in Python, its C++ twin in the
// worker library), for --hang-timeout: datagrams on an abstract Unix socket
// that MESHRUN_HEARTBEAT_SOCKET names ("@meshrun-heartbeat-<hex>"; the '@'
// stands for the leading NUL).
//
// The kernel says who sent each datagram (SCM_CREDENTIALS), so a heartbeat
// counts for the process that sent it, whatever the datagram holds. Its bytes
// may carry the step's time the worker measured, "step=<seconds>" (for
// stragglers); anything else is a plain heartbeat. One from a process that is
// not one of the agent's running workers is refused and logged (the first
// few; then counted): nothing else changes.
//
// An abstract socket has no file mode: any local process (of any user, in
// the agent's network namespace) can send to it. So the datagrams are read on
// a thread of the server's own, never on the agent's io_context, and they
// reach the io_context merged by sender: one batch at a time, each sender
// once in it (its heartbeats since the last batch, their step times, at most
// kStepsPerBatch), at most kSendersPerBatch senders. A flood from any number
// of datagrams costs the io_context at most one batch between two of its
// other handlers (worker exits, rendezvous), not a loop until the flood ends.

#include <sys/types.h>

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/refusal_log.h"

namespace meshrun::agent {

class HeartbeatServer {
 public:
  // Step times kept per sender in one batch (the newest); a worker sends one
  // a step, so a batch rarely holds more than one.
  static constexpr size_t kStepsPerBatch = 8;
  // Senders in one batch; heartbeats from further senders before the batch
  // is handled are refused (counted).
  static constexpr size_t kSendersPerBatch = 1024;

  // Called on `io`'s thread for each sender of a batch with its pid and the
  // step time a heartbeat carried, if any (once per step time; once with
  // nullopt for plain heartbeats only); false: the pid is not one of the
  // agent's running workers.
  using OnHeartbeat = std::function<bool(pid_t, std::optional<double>)>;

  // Binds a fresh abstract socket and serves it until destroyed, calling
  // `on_heartbeat` on `io`. `io` must outlive it.
  static absl::StatusOr<std::unique_ptr<HeartbeatServer>> Start(
      boost::asio::io_context& io, OnHeartbeat on_heartbeat);
  // Stops and joins the reading thread; a batch already posted to `io` is
  // dropped.
  ~HeartbeatServer();
  HeartbeatServer(const HeartbeatServer&) = delete;
  HeartbeatServer& operator=(const HeartbeatServer&) = delete;

  // The workers' MESHRUN_HEARTBEAT_SOCKET.
  const std::string& name() const { return name_; }
  // Refused heartbeats (senders not workers, or past kSendersPerBatch). On
  // `io`'s thread.
  uint64_t refused() const { return refusals_.count() + overflow_refusals_; }

  // A datagram's step time: "step=<seconds>", finite and not negative.
  static std::optional<double> StepSeconds(std::string_view payload);

 private:
  // What one sender sent since the last batch.
  struct Beats {
    std::vector<double> steps;  // newest last, at most kStepsPerBatch
  };

  HeartbeatServer(boost::asio::io_context& io, int fd, int wake_fd, std::string name,
                  OnHeartbeat on_heartbeat);
  void Read();  // the reading thread
  // On the reading thread: one datagram from `sender` (0: unknown).
  void Note(pid_t sender, std::optional<double> step);
  void DeliverBatch();  // on io's thread

  boost::asio::io_context& io_;
  const int fd_;
  const int wake_fd_;  // an eventfd: the destructor's "stop"
  const std::string name_;
  const OnHeartbeat on_heartbeat_;
  std::atomic<bool> stopping_{false};
  RefusalLog refusals_{"heartbeats"};  // on io's thread

  std::mutex mu_;
  std::map<pid_t, Beats> batch_;    // guarded by mu_
  bool batch_posted_ = false;       // guarded by mu_: a DeliverBatch is queued
  uint64_t overflow_ = 0;           // guarded by mu_: refused past kSendersPerBatch
  uint64_t overflow_refusals_ = 0;  // on io's thread: overflow_ as last seen

  std::shared_ptr<HeartbeatServer*> self_;  // posted batches check it is still there
  std::thread reader_;
};

}  // namespace meshrun::agent
