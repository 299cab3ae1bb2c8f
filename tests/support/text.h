#pragma once

// Test support: small helpers for checking a process's output.

#include <cstddef>
#include <string>

namespace meshrun::testing {

// How many times `needle` occurs in `text` (overlapping occurrences count).
inline size_t Count(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos;
       at = text.find(needle, at + 1))
    ++n;
  return n;
}

}  // namespace meshrun::testing
