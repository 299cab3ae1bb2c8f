#pragma once

// torchrun's worker watchdog, the pure part: the requests torch's
// FileTimerClient (torch.distributed.elastic.timer) writes to the agent's
// FIFO, one JSON object a line,
//   {"version": 1, "pid": P, "scope_id": S, "expiration_time": T, "signal": N}
// (T in seconds since the epoch; T < 0 releases the timer), and the table of
// timers they set. The FIFO, the clock and the killing are the agent's
// (agent/file_timer_server.h).

#include <sys/types.h>

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace meshrun::agent {

struct TimerRequest {
  pid_t pid = 0;
  std::string scope_id;
  double expiration_time = 0;  // < 0: release
  int signal = 0;              // <= 0: expire without killing
  bool release() const { return expiration_time < 0; }
};

// One line of the FIFO (without its newline), or why it is not a request.
absl::StatusOr<TimerRequest> ParseTimerRequest(std::string_view line);

// A worker whose timers expired: the signal of its earliest expired timer
// that has one (0: none had, it is left running), as torch's server does.
struct ExpiredWorker {
  pid_t pid = 0;
  std::string scope_id;        // of that timer (or of the earliest expired)
  double expiration_time = 0;  // when it expired
  double overdue_s = 0;        // how long before TakeExpired's `now`
  int signal = 0;
};

class TimerTable {
 public:
  // Acquire (a later request for the same pid and scope replaces the
  // earlier) or release.
  void Apply(const TimerRequest& request);
  // The workers with a timer expired at `now`, earliest first; their timers
  // are all dropped (a worker is reaped once).
  std::vector<ExpiredWorker> TakeExpired(double now);
  // The timers of a worker that has ended.
  void Forget(pid_t pid);
  std::optional<double> NextExpiration() const;
  size_t size() const { return timers_.size(); }

 private:
  std::map<std::pair<pid_t, std::string>, TimerRequest> timers_;
};

}  // namespace meshrun::agent
