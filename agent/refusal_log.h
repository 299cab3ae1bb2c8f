#pragma once

// What the agent refuses from its workers' side channels (torch's watchdog
// FIFO, heartbeats): the first few refusals are logged one by one, later
// ones only counted, so a worker that floods a channel cannot flood the log;
// the count is logged when the channel closes.

#include <cstdint>
#include <string>
#include <utility>

namespace meshrun::agent {

class RefusalLog {
 public:
  static constexpr uint64_t kLogged = 10;

  // `channel` starts each line: "worker watchdog", "heartbeats".
  explicit RefusalLog(std::string channel) : channel_(std::move(channel)) {}
  ~RefusalLog();
  RefusalLog(const RefusalLog&) = delete;
  RefusalLog& operator=(const RefusalLog&) = delete;

  // "<channel>: refused <what>".
  void Refuse(const std::string& what);

  uint64_t count() const { return count_; }

 private:
  std::string channel_;
  uint64_t count_ = 0;
};

}  // namespace meshrun::agent
