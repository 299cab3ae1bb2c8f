#pragma once

// torchrun's worker watchdog (TORCHELASTIC_ENABLE_FILE_TIMER=1), served by
// the agent: a FIFO at TORCHELASTIC_TIMER_FILE that torch's own
// FileTimerClient writes its requests to (agent/file_timer.h), read on the
// agent's io_context. A timer that expires hands its worker to the agent,
// which kills it and handles the exit as any other failure (torchrun's
// server also kills its own agent then; meshrun's agent carries on).
//
// Requests for a pid that is not one of the agent's running workers, and
// lines that are not requests, are refused and logged (the first few; then
// counted): nothing else changes.

#include <boost/asio/io_context.hpp>
#include <boost/asio/posix/stream_descriptor.hpp>
#include <boost/asio/steady_timer.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "agent/file_timer.h"
#include "agent/refusal_log.h"

namespace meshrun::agent {

class FileTimerServer {
 public:
  struct Callbacks {
    // Whether `pid` is one of the agent's running workers.
    std::function<bool(pid_t)> is_worker;
    // A worker's timer expired.
    std::function<void(const ExpiredWorker&)> expired;
  };

  // Creates the FIFO at `path` (replacing what is there, as torch's server
  // does) and serves it on `io` until destroyed. `io` must outlive it; all
  // callbacks run on `io`'s thread.
  static absl::StatusOr<std::unique_ptr<FileTimerServer>> Start(
      boost::asio::io_context& io, const std::string& path, Callbacks callbacks);
  ~FileTimerServer();  // removes the FIFO
  FileTimerServer(const FileTimerServer&) = delete;
  FileTimerServer& operator=(const FileTimerServer&) = delete;

  const std::string& path() const { return path_; }
  // A worker ended: its timers go.
  void Forget(pid_t pid) { table_.Forget(pid); }
  uint64_t refused() const { return refusals_.count(); }

 private:
  FileTimerServer(boost::asio::io_context& io, std::string path, int read_fd, int keep_fd,
                  Callbacks callbacks);
  void Read();
  void OnLine(std::string_view line);
  void CheckTimers();

  const std::string path_;
  const Callbacks callbacks_;
  boost::asio::posix::stream_descriptor fifo_;
  // A writer of our own, so the FIFO never reads as ended between clients.
  const int keep_fd_;
  boost::asio::steady_timer timer_;
  TimerTable table_;
  std::string pending_;  // bytes after the last newline
  char buffer_[4096];
  RefusalLog refusals_{"worker watchdog"};
  std::shared_ptr<FileTimerServer*> self_;  // handlers check it is still there
};

}  // namespace meshrun::agent
