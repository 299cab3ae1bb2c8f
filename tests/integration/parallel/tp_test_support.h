#pragma once

// Checks shared by the tensor-parallel test drivers (tp_ops_test,
// tp_mlp_test, tp_lm_test) on the output of workers run under meshrun.

#include <gtest/gtest.h>

#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/meshrun_run.h"

namespace meshrun::tp_testing {

// How many lines contain `text`.
inline int CountLines(const std::string& output, const std::string& text) {
  int count = 0;
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);) {
    if (line.find(text) != std::string::npos) ++count;
  }
  return count;
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

// Exit 0, no FAIL line, every rank done, `steps` steps printed.
inline void ExpectTrained(const testing::MeshrunRun& run, int world, int steps) {
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(CountLines(run.output, "FAIL"), 0) << run.output;
  EXPECT_EQ(CountLines(run.output, "DONE rank"), world) << run.output;
  EXPECT_EQ(CountSteps(run.output), steps) << run.output;
}

}  // namespace meshrun::tp_testing
