#pragma once

// Delays between an agent's attempts to reach the daemon again: exponential
// from `initial` up to `max`, each drawn uniformly from [d/2, d] so that
// agents which lost the daemon together do not come back in lockstep.
//
// Thread-safety: none; one owner.

#include <chrono>
#include <cstdint>
#include <random>

namespace meshrun::agent {

class Backoff {
 public:
  Backoff(std::chrono::milliseconds initial, std::chrono::milliseconds max,
          uint64_t seed);
  std::chrono::milliseconds Next();
  // After a success: the next failure starts from `initial` again.
  void Reset() { current_ = initial_; }

 private:
  const std::chrono::milliseconds initial_;
  const std::chrono::milliseconds max_;
  std::chrono::milliseconds current_;
  std::mt19937_64 random_;
};

}  // namespace meshrun::agent
