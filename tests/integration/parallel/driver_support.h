#pragma once

// Checks shared by the parallel-training test drivers (dp, fsdp, hsdp, tp_*)
// on the output of workers run under meshrun.

#include <gtest/gtest.h>

#include <map>
#include <ostream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/meshrun_run.h"

namespace meshrun {

// Lines containing `pattern`.
inline std::vector<std::string> Lines(const std::string& output,
                                      const std::string& pattern) {
  std::vector<std::string> lines;
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);) {
    if (line.find(pattern) != std::string::npos) lines.push_back(line);
  }
  return lines;
}

// How many lines contain `pattern`.
inline int CountLines(const std::string& output, const std::string& pattern) {
  return static_cast<int>(Lines(output, pattern).size());
}

inline bool Contains(const std::string& output, const std::string& text) {
  return output.find(text) != std::string::npos;
}

// Distinct step numbers of "step N loss X" lines.
inline int CountSteps(const std::string& output) {
  std::regex re("step (\\d+) loss ([-+.e0-9]+)");
  std::set<int> steps;
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);) {
    std::smatch m;
    if (std::regex_search(line, m, re)) steps.insert(std::stoi(m[1]));
  }
  return static_cast<int>(steps.size());
}

// Exit 0, no "FAIL rank" line (parity_harness Fail()), every rank done,
// `steps` steps printed.
inline void ExpectTrained(const testing::MeshrunRun& run, int world, int steps) {
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_TRUE(Lines(run.output, "FAIL rank").empty()) << run.output;
  EXPECT_EQ(Lines(run.output, "DONE rank").size(), static_cast<size_t>(world))
      << run.output;
  EXPECT_EQ(CountSteps(run.output), steps) << run.output;
}

// rank -> the pids it started with ("rank R pid P: replica ..."), in order.
inline std::map<int, std::vector<std::string>> StartedPids(const std::string& output) {
  std::map<int, std::vector<std::string>> pids;
  std::regex re("rank (\\d+) pid (\\d+): replica");
  for (const std::string& line : Lines(output, ": replica ")) {
    std::smatch m;
    if (std::regex_search(line, m, re)) pids[std::stoi(m[1])].push_back(m[2]);
  }
  return pids;
}

// rank -> the pid of its "verified rank R pid P" line.
inline std::map<int, std::string> VerifiedPids(const std::string& output) {
  std::map<int, std::string> pids;
  std::regex re("verified rank (\\d+) pid (\\d+): ");
  for (const std::string& line : Lines(output, "verified rank")) {
    std::smatch m;
    if (std::regex_search(line, m, re)) pids[std::stoi(m[1])] = m[2];
  }
  return pids;
}

// A train_example command line that must be refused: its flags, the world
// it runs in, and (part of) the one-line reason. Printed by its flags in
// gtest's parameter names.
struct Refusal {
  std::string args;
  int world;
  std::string message;
};

inline std::ostream& operator<<(std::ostream& out, const Refusal& refusal) {
  return out << refusal.args;
}

}  // namespace meshrun
