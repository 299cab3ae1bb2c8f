// Pipeline-parallel MLP training equals single-process training: pp_mlp_worker
// under the real launcher checks, on every rank, every step's loss and its
// stage's final params against its own single-process reference (rtol 1e-5);
// here the launcher's exit code, the stage layout, the printed losses and the
// per-rank param checks are verified. Seed 003's model (four Linear layers,
// 50x50 three times then 50x4, batch 32 -> [32, 4]) over pp = 2 and pp = 4,
// GPipe and 1F1B, 4 and 8 microbatches.

#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <vector>

#include "tests/integration/parallel/driver_support.h"
#include "tests/support/meshrun_run.h"

namespace meshrun {
namespace {

using testing::MeshrunRun;
using testing::RunUnderMeshrun;

// (pp, schedule, microbatches)
class PpMlpParityTest
    : public ::testing::TestWithParam<std::tuple<int, std::string, int>> {};

TEST_P(PpMlpParityTest, MatchesSingleProcess) {
  const auto [pp, schedule, microbatches] = GetParam();
  MeshrunRun run = RunUnderMeshrun(pp, "pp_mlp_worker",
                                   {"--schedule", schedule, "--microbatches",
                                    std::to_string(microbatches), "--steps", "10"});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_TRUE(Lines(run.output, "FAIL").empty()) << run.output;
  EXPECT_EQ(Lines(run.output, "DONE ").size(), static_cast<size_t>(pp)) << run.output;
  EXPECT_EQ(CountSteps(run.output), 10) << run.output;
  // 4 Linear layers (weight and bias each) checked exactly once across the stages.
  EXPECT_EQ(Lines(run.output, " matches").size(), 8u) << run.output;
  // The last stage's microbatch output is [32 / M, 4].
  EXPECT_TRUE(Contains(
      run.output, "microbatch output [" + std::to_string(32 / microbatches) + ", 4]"))
      << run.output;
  if (pp == 2) {
    // Seed 003's split: layers 0-1 on the first stage, 2-3 on the second.
    EXPECT_TRUE(Contains(run.output,
                         "STAGE rank 0 stage 0/2: layers [0, 4): Linear(50 -> "
                         "50), ReLU(), Linear(50 -> 50), ReLU()"))
        << run.output;
    EXPECT_TRUE(Contains(run.output,
                         "STAGE rank 1 stage 1/2: layers [4, 7): Linear(50 -> "
                         "50), ReLU(), Linear(50 -> 4)"))
        << run.output;
  } else {
    EXPECT_TRUE(
        Contains(run.output, "STAGE rank 3 stage 3/4: layers [6, 7): Linear(50 -> 4)"))
        << run.output;
  }
}

INSTANTIATE_TEST_SUITE_P(Seed003Mlp, PpMlpParityTest,
                         ::testing::Combine(::testing::Values(2, 4),
                                            ::testing::Values("gpipe", "1f1b"),
                                            ::testing::Values(4, 8)),
                         [](const auto& info) {
                           return "pp" + std::to_string(std::get<0>(info.param)) + "_" +
                                  std::get<1>(info.param) + "_m" +
                                  std::to_string(std::get<2>(info.param));
                         });

// Explicit split points put the stage boundaries where asked.
TEST(PpMlpTest, ExplicitSplitPointsMatchSingleProcess) {
  MeshrunRun run = RunUnderMeshrun(
      2, "pp_mlp_worker",
      {"--schedule", "1f1b", "--microbatches", "2", "--split-points", "1"});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(CountSteps(run.output), 10) << run.output;
  EXPECT_TRUE(
      Contains(run.output, "STAGE rank 0 stage 0/2: layers [0, 1): Linear(50 -> 50)"))
      << run.output;
  EXPECT_EQ(Lines(run.output, " matches").size(), 8u) << run.output;
}

// pp = 1 (a mesh dimension of size 1 in a composed layout): one stage
// holding the whole model, microbatches accumulated locally.
TEST(PpMlpTest, SingleStageMatchesSingleProcess) {
  MeshrunRun run =
      RunUnderMeshrun(1, "pp_mlp_worker", {"--schedule", "1f1b", "--microbatches", "4"});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(CountSteps(run.output), 10) << run.output;
  EXPECT_TRUE(Contains(run.output, "STAGE rank 0 stage 0/1: layers [0, 7)"))
      << run.output;
  EXPECT_EQ(Lines(run.output, " matches").size(), 8u) << run.output;
}

// 1F1B refuses fewer microbatches than stages on every rank, before any
// communication: a clear message and the worker's exit code 3, no hang.
TEST(PpMlpTest, OneFOneBRefusesFewerMicrobatchesThanStages) {
  MeshrunRun run =
      RunUnderMeshrun(4, "pp_mlp_worker", {"--schedule", "1f1b", "--microbatches", "2"},
                      std::chrono::seconds(60));
  EXPECT_EQ(run.exit_code, 3) << run.output;
  EXPECT_TRUE(
      Contains(run.output, "1F1B needs at least 4 microbatches for 4 stages, got 2"))
      << run.output;
  EXPECT_EQ(CountSteps(run.output), 0) << run.output;
  EXPECT_TRUE(Lines(run.output, "DONE ").empty()) << run.output;
}

// A batch that does not split into equal microbatches is refused (first and
// last stage check their own side; here both refuse).
TEST(PpMlpTest, RefusesUnequalMicrobatches) {
  MeshrunRun run = RunUnderMeshrun(2, "pp_mlp_worker", {"--microbatches", "5"},
                                   std::chrono::seconds(60));
  EXPECT_EQ(run.exit_code, 3) << run.output;
  EXPECT_TRUE(Contains(run.output, "of 32 rows does not split into 5 equal microbatches"))
      << run.output;
}

}  // namespace
}  // namespace meshrun
