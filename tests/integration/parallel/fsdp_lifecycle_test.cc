// FullyShard's lifecycle where real training goes (issue 45's cases):
// fsdp_lifecycle_worker under the real launcher checks each case against
// single-process training itself (FAIL lines); here the exit code, the
// steps, and what each case prints.

#include <gtest/gtest.h>

#include <regex>
#include <string>
#include <vector>

#include "tests/integration/parallel/driver_support.h"

namespace meshrun {
namespace {

using testing::MeshrunRun;
using testing::RunUnderMeshrun;

MeshrunRun RunCase(const std::string& which, std::vector<std::string> args = {},
                   int nproc = 2) {
  args.insert(args.begin(), {"--case", which});
  return RunUnderMeshrun(nproc, "fsdp_lifecycle_worker", args);
}

// A backward that throws halfway (after blocks 2 and 1 reduce-scattered),
// caught; then that step again and the rest equal a run without it.
TEST(FsdpLifecycleTest, AnExceptionInBackwardLeavesTheNextStepsExact) {
  MeshrunRun run = RunCase("exception");
  ExpectTrained(run, 2, 10);
  EXPECT_TRUE(Contains(run.output, "step 3 backward threw, caught")) << run.output;
}

TEST(FsdpLifecycleTest, AnExceptionInBackwardLeavesDdpExact) {
  MeshrunRun run = RunCase("exception", {"--ddp"});
  ExpectTrained(run, 2, 10);
  EXPECT_TRUE(Contains(run.output, "step 3 backward threw, caught")) << run.output;
}

TEST(FsdpLifecycleTest, AWeightTiedAcrossUnitsIsOneParameter) {
  MeshrunRun run = RunCase("tied");
  ExpectTrained(run, 2, 10);
  EXPECT_TRUE(Contains(run.output, "TIED one parameter")) << run.output;
}

TEST(FsdpLifecycleTest, TwoModelsTrainFromTwoThreads) {
  MeshrunRun run = RunCase("threads", {"--steps", "1000"});
  ExpectTrained(run, 2, 8);
  EXPECT_TRUE(Contains(run.output, "THREADS 2 models, 1000 steps each")) << run.output;
}

// The same under AddressSanitizer (fsdp_lifecycle_worker_asan: FullyShard's
// state compiled with it), where a use after free of one thread's model
// state by the other stops the worker with a report.
TEST(FsdpLifecycleTest, TwoModelsTrainFromTwoThreadsUnderAsan) {
  MeshrunRun run = RunUnderMeshrun(2, "fsdp_lifecycle_worker_asan",
                                   {"--case", "threads", "--steps", "1000"});
  ExpectTrained(run, 2, 8);
  EXPECT_TRUE(Contains(run.output, "THREADS 2 models, 1000 steps each")) << run.output;
  EXPECT_FALSE(Contains(run.output, "AddressSanitizer")) << run.output;
}

// Frozen Linears in every block: gathered bytes in backward as with them
// trained (the worker bounds both by the root, a unit and one prefetch).
TEST(FsdpLifecycleTest, FrozenParametersFreeTheirUnitsInBackward) {
  MeshrunRun frozen = RunCase("frozen", {"--steps", "4"});
  ExpectTrained(frozen, 2, 4);
  MeshrunRun trainable = RunCase("frozen", {"--steps", "4", "--trainable"});
  ExpectTrained(trainable, 2, 4);
  std::smatch a, b;
  std::regex peak("PEAK (\\d+) ");
  ASSERT_TRUE(std::regex_search(frozen.output, a, peak)) << frozen.output;
  ASSERT_TRUE(std::regex_search(trainable.output, b, peak)) << trainable.output;
  EXPECT_EQ(a[1], b[1]) << frozen.output << trainable.output;
}

TEST(FsdpLifecycleTest, WritesReachTheShardsOrAreRefused) {
  MeshrunRun run = RunCase("writes");
  ExpectTrained(run, 2, 3);
  EXPECT_TRUE(Contains(run.output, "REFUSED The size of tensor a")) << run.output;
}

// One rank (a group of one: no collectives), so that 100,000 forwards take
// seconds; the lifecycle runs as over more.
TEST(FsdpLifecycleTest, EvalForwardsKeepNothingGathered) {
  MeshrunRun run = RunCase("eval", {"--count", "100000"}, /*nproc=*/1);
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_TRUE(Lines(run.output, "FAIL rank").empty()) << run.output;
  EXPECT_TRUE(Contains(run.output, "EVAL 100000 forwards")) << run.output;
}

TEST(FsdpLifecycleTest, ModelsBuiltAgainShareNothing) {
  MeshrunRun run = RunCase("rebuild", {"--count", "20"});
  ExpectTrained(run, 2, 2);
  EXPECT_TRUE(Contains(run.output, "REBUILT 20 models, 19 at an address used before"))
      << run.output;
}

// Two forwards before one backward: FSDP2's all-gathers and reduce-scatters.
TEST(FsdpLifecycleTest, GradientAccumulationCommunicatesAsFsdp2) {
  MeshrunRun ours = RunCase("accumulate", {"--steps", "4"});
  ExpectTrained(ours, 2, 4);
  MeshrunRun theirs = RunUnderMeshrun(
      2, MESHRUN_PYTHON,
      {std::string(MESHRUN_SOURCE_DIR) + "/tests/integration/parallel/fsdp_counts.py",
       "--steps", "4"});
  ASSERT_EQ(theirs.exit_code, 0) << theirs.output;
  std::smatch a, b;
  std::regex counts("COUNTS [^\\n]*");
  ASSERT_TRUE(std::regex_search(ours.output, a, counts)) << ours.output;
  ASSERT_TRUE(std::regex_search(theirs.output, b, counts)) << theirs.output;
  EXPECT_EQ(a.str(), b.str()) << ours.output << theirs.output;
}

// pytorch/examples' cpp/mnist with FullyShard of its Net, changed in the
// lines marked "// meshrun" (examples/cpp/mnist.cc): it learns.
TEST(FsdpLifecycleTest, MnistExampleTrains) {
  MeshrunRun run = RunUnderMeshrun(2, "mnist", {"--epochs", "2"});
  EXPECT_EQ(run.exit_code, 0) << run.output;
  std::vector<std::string> tests = Lines(run.output, "Test set: Average loss");
  ASSERT_EQ(tests.size(), 2u) << run.output;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(tests.back(), m, std::regex("Accuracy: ([0-9.]+)")));
  EXPECT_GT(std::stod(m[1]), 0.9) << run.output;
}

}  // namespace
}  // namespace meshrun
