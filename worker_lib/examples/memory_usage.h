#pragma once

// A process's memory, as the step benchmarks report it (train_example
// --time-steps, bench/worker_lib/dp_step_bench.cc), measured as their Python
// peers measure it (/proc/self/statm, getrusage).

#include <sys/resource.h>
#include <unistd.h>

#include <fstream>

namespace meshrun::worker::examples {

// This process's resident set now (MiB), from /proc/self/statm.
inline double RssMb() {
  std::ifstream statm("/proc/self/statm");
  long size = 0, resident = 0;
  statm >> size >> resident;
  return static_cast<double>(resident) * static_cast<double>(sysconf(_SC_PAGESIZE)) /
         (1 << 20);
}

// The peak resident set since the process started (MiB; ru_maxrss is in KiB).
inline double PeakRssMb() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) / 1024;
}

}  // namespace meshrun::worker::examples
