#pragma once

// A process's memory and steps' times, as the step benchmarks report them
// (train_example --time-steps, bench/worker_lib/dp_step_bench.cc), measured
// as their Python peers measure them (/proc/self/statm, getrusage,
// time.perf_counter and time.process_time).

#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <ctime>
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

// This process's CPU time so far, every thread's (ms): Python's
// time.process_time().
inline double ProcessCpuMs() {
  timespec now{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
  return static_cast<double>(now.tv_sec) * 1e3 + static_cast<double>(now.tv_nsec) / 1e6;
}

// Each step's wall time and this process's CPU time in it (ms).
class StepClock {
 public:
  void Start() {
    wall_start_ = std::chrono::steady_clock::now();
    cpu_start_ = ProcessCpuMs();
  }
  void Stop() {
    wall_ms_.push_back(std::chrono::duration<double, std::milli>(
                           std::chrono::steady_clock::now() - wall_start_)
                           .count());
    cpu_ms_.push_back(ProcessCpuMs() - cpu_start_);
  }
  const std::vector<double>& wall_ms() const { return wall_ms_; }
  const std::vector<double>& cpu_ms() const { return cpu_ms_; }

 private:
  std::chrono::steady_clock::time_point wall_start_;
  double cpu_start_ = 0;
  std::vector<double> wall_ms_, cpu_ms_;
};

// The `--time-steps` line (train_example, gpt_worker; the benchmarks parse
// it): "timing step_ms=<each step's slowest rank> cpu_ms=<each step's CPU
// time, summed over the ranks> max_rss_mb=<the largest rank's peak>
// rss_growth_mb=<its growth over rss_before_model>". Collective over
// `world`; rank 0 gets the line, the others an empty string.
inline std::string StepTimingLine(c10d::ProcessGroup& world, const StepClock& clock,
                                  double rss_before_model) {
  const double peak = PeakRssMb();
  std::vector<at::Tensor> maxima{
      at::cat({at::tensor(clock.wall_ms(), at::kDouble),
               at::tensor({peak, peak - rss_before_model}, at::kDouble)})};
  c10d::AllreduceOptions max;
  max.reduceOp = c10d::ReduceOp::MAX;
  world.allreduce(maxima, max)->wait();
  std::vector<at::Tensor> sums{at::tensor(clock.cpu_ms(), at::kDouble)};
  world.allreduce(sums)->wait();
  if (world.getRank() != 0) return "";
  const size_t steps = clock.wall_ms().size();
  const auto values = maxima[0].accessor<double, 1>();
  const auto cpu = sums[0].accessor<double, 1>();
  std::string line = "timing step_ms=";
  for (size_t i = 0; i < steps; ++i) line += (i ? "," : "") + std::to_string(values[i]);
  line += " cpu_ms=";
  for (size_t i = 0; i < steps; ++i) line += (i ? "," : "") + std::to_string(cpu[i]);
  char memory[96];
  std::snprintf(memory, sizeof memory, " max_rss_mb=%.1f rss_growth_mb=%.1f",
                values[steps], values[steps + 1]);
  return line + memory;
}

}  // namespace meshrun::worker::examples
