#pragma once

// Runs a callback at the deadlines a pure core asks for. The cores are
// clock-free; this adapter owns the one thread that feeds them time.
//
// Thread-safe: Poke() may be called from any thread.

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>

namespace meshrun::rdzv {

class DeadlineTimer {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  // `fire(now)` does the due work and returns the next deadline, if any. It
  // runs on the timer's thread, never concurrently with itself.
  explicit DeadlineTimer(std::function<std::optional<TimePoint>(TimePoint)> fire);
  ~DeadlineTimer();  // stops and joins the thread
  DeadlineTimer(const DeadlineTimer&) = delete;
  DeadlineTimer& operator=(const DeadlineTimer&) = delete;

  // A deadline may have moved earlier: wake up and re-evaluate at `when`.
  void Poke(TimePoint when);

 private:
  void Loop();

  std::function<std::optional<TimePoint>(TimePoint)> fire_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::optional<TimePoint> next_;  // guarded by mu_
  bool stop_ = false;              // guarded by mu_
  std::thread thread_;
};

}  // namespace meshrun::rdzv
