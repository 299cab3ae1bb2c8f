#include "agent/backoff.h"

#include <algorithm>

namespace meshrun::agent {

Backoff::Backoff(std::chrono::milliseconds initial, std::chrono::milliseconds max,
                 uint64_t seed)
    : initial_(std::max(initial, std::chrono::milliseconds(1))),
      max_(std::max(max, initial_)),
      current_(initial_),
      random_(seed) {}

std::chrono::milliseconds Backoff::Next() {
  const int64_t high = current_.count();
  std::uniform_int_distribution<int64_t> pick((high + 1) / 2, high);
  const std::chrono::milliseconds delay(pick(random_));
  current_ = std::min(current_ * 2, max_);
  return delay;
}

}  // namespace meshrun::agent
