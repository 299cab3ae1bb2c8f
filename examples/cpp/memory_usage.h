#pragma once

// A process's memory, as the step benchmarks report it (train_example
// --time-steps, bench/worker_lib/dp_step_bench.cc), measured as their Python
// peers measure it (/proc/self/statm, getrusage).

#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <vector>

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

// The `--time-steps` line (train_example, gpt_worker; the benchmarks parse
// it): "timing step_ms=<each step's slowest rank> max_rss_mb=<the largest
// rank's peak> rss_growth_mb=<its growth over rss_before_model>". Collective
// over `world`; rank 0 gets the line, the others an empty string.
inline std::string StepTimingLine(c10d::ProcessGroup& world,
                                  const std::vector<double>& step_ms,
                                  double rss_before_model) {
  const double peak = PeakRssMb();
  std::vector<at::Tensor> all{
      at::cat({at::tensor(step_ms, at::kDouble),
               at::tensor({peak, peak - rss_before_model}, at::kDouble)})};
  c10d::AllreduceOptions max;
  max.reduceOp = c10d::ReduceOp::MAX;
  world.allreduce(all, max)->wait();
  if (world.getRank() != 0) return "";
  const size_t steps = step_ms.size();
  const auto values = all[0].accessor<double, 1>();
  std::string line = "timing step_ms=";
  for (size_t i = 0; i < steps; ++i) line += (i ? "," : "") + std::to_string(values[i]);
  char memory[96];
  std::snprintf(memory, sizeof memory, " max_rss_mb=%.1f rss_growth_mb=%.1f",
                values[steps], values[steps + 1]);
  return line + memory;
}

}  // namespace meshrun::worker::examples
