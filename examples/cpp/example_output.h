#pragma once

// Output of the example training programs, shared by train_example and
// train_text: one write per line, so that ranks' lines do not interleave.

#include <iostream>
#include <string>

namespace meshrun::worker::examples {

inline void Say(const std::string& line) { std::cout << line + "\n" << std::flush; }

// "<program> rank <rank>: <what>" on stderr; returns exit code 1.
inline int Fail(const std::string& program, int rank, const std::string& what) {
  std::cerr << program + " rank " + std::to_string(rank) + ": " + what + "\n"
            << std::flush;
  return 1;
}

}  // namespace meshrun::worker::examples
