#include "rendezvous/server/deadline_timer.h"

#include <utility>

namespace meshrun::rdzv {

DeadlineTimer::DeadlineTimer(std::function<std::optional<TimePoint>(TimePoint)> fire)
    : fire_(std::move(fire)), thread_([this] { Loop(); }) {}

DeadlineTimer::~DeadlineTimer() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void DeadlineTimer::Poke(TimePoint when) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (next_ && *next_ <= when) return;
    next_ = when;
  }
  cv_.notify_all();
}

void DeadlineTimer::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    if (!next_) {
      cv_.wait(lock);
      continue;
    }
    if (std::chrono::steady_clock::now() < *next_) {
      cv_.wait_until(lock, *next_);
      continue;
    }
    next_.reset();
    lock.unlock();
    std::optional<TimePoint> next = fire_(std::chrono::steady_clock::now());
    lock.lock();
    if (next && (!next_ || *next < *next_)) next_ = next;
  }
}

}  // namespace meshrun::rdzv
