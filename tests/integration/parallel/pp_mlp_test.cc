// Pipeline-parallel MLP training equals single-process training: pp_mlp_worker
// under the real launcher checks, on every rank, every step's loss and its
// stage's final params against its own single-process reference (rtol 1e-5);
// here the launcher's exit code, the stage layout, the printed losses and the
// per-rank param checks are verified. Seed 003's model (four Linear layers,
// 50x50 three times then 50x4, batch 32 -> [32, 4]) over pp = 2 and pp = 4,
// GPipe and 1F1B, 4 and 8 microbatches.

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "tests/integration/parallel/driver_support.h"
#include "tests/support/child_process.h"
#include "tests/support/meshrun_run.h"

namespace meshrun {
namespace {

using testing::MeshrunRun;
using testing::RunUnderMeshrun;

// One worker process per rank, started directly rather than by the launcher,
// so that nothing stops a rank when another exits: each must end on its own.
// The ranks' groups rendezvous through a real meshrun-rdzvd (port 0) as
// under meshrun.
struct DirectRank {
  int exit_code = -1;  // -1: still running at the deadline (then killed)
  std::chrono::milliseconds ran{};
  std::string output;
};

std::vector<DirectRank> RunDirectly(int world, const std::string& program,
                                    const std::vector<std::string>& args,
                                    std::chrono::milliseconds timeout) {
  testing::DaemonProcess daemon;
  const std::string port = daemon.endpoint().substr(daemon.endpoint().rfind(':') + 1);
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::unique_ptr<testing::ChildProcess>> processes;
  for (int rank = 0; rank < world; ++rank) {
    // MASTER_* are required by the worker environment but unused with
    // meshrun's store (Gloo binds 127.0.0.1 for a loopback MASTER_ADDR).
    std::vector<std::string> argv{"/usr/bin/env",
                                  "RANK=" + std::to_string(rank),
                                  "WORLD_SIZE=" + std::to_string(world),
                                  "LOCAL_RANK=" + std::to_string(rank),
                                  "LOCAL_WORLD_SIZE=" + std::to_string(world),
                                  "MASTER_ADDR=127.0.0.1",
                                  "MASTER_PORT=" + port,
                                  "MESHRUN_STORE_ENDPOINT=" + daemon.endpoint(),
                                  "MESHRUN_STORE_PREFIX=direct/",
                                  "OMP_NUM_THREADS=1",
                                  testing::BinDir() + "/" + program};
    argv.insert(argv.end(), args.begin(), args.end());
    processes.push_back(
        std::make_unique<testing::ChildProcess>(argv, /*merge_stderr=*/true));
  }
  std::vector<DirectRank> ranks(world);
  for (int rank = 0; rank < world; ++rank) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        start + timeout - std::chrono::steady_clock::now());
    ranks[rank].exit_code =
        testing::ExitCode(*processes[rank], std::max(left, std::chrono::milliseconds(0)));
    ranks[rank].ran = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::steady_clock::now() - start);
    ranks[rank].output = processes[rank]->output();
  }
  return ranks;  // the processes still running are killed here, by pid
}

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

// Interleaved 1F1B through RunStep: each rank holds V stages of the model
// cut into pp x V (chunk c of rank r: stage c * pp + r), activations wrap
// around from the last rank to the first between chunks. (pp, V, microbatches,
// MLP sizes), batch 24: seed 003's 4 Linears over 2 x 2 stages; 6 Linears
// over 3 x 2 (M = 3: one round; M = 6: two rounds of 3) and 2 x 3.
class PpMlpInterleavedTest
    : public ::testing::TestWithParam<std::tuple<int, int, int, std::string>> {};

TEST_P(PpMlpInterleavedTest, MatchesSingleProcess) {
  const auto [pp, chunks, microbatches, sizes] = GetParam();
  MeshrunRun run = RunUnderMeshrun(
      pp, "pp_mlp_worker",
      {"--schedule", "interleaved", "--virtual-stages", std::to_string(chunks),
       "--microbatches", std::to_string(microbatches), "--sizes", sizes, "--batch", "24",
       "--steps", "10"});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_TRUE(Lines(run.output, "FAIL").empty()) << run.output;
  EXPECT_EQ(Lines(run.output, "DONE ").size(), static_cast<size_t>(pp)) << run.output;
  EXPECT_EQ(CountSteps(run.output), 10) << run.output;
  // Every Linear (weight and bias) checked exactly once across the ranks.
  const size_t linears = std::count(sizes.begin(), sizes.end(), ',');
  EXPECT_EQ(Lines(run.output, " matches").size(), 2 * linears) << run.output;
  EXPECT_EQ(Lines(run.output, "virtual stages: ").size(), static_cast<size_t>(pp))
      << run.output;
  if (pp == 2 && chunks == 2) {
    // One Linear a stage; rank 0 holds stages 0 and 2, rank 1 stages 1 and 3.
    EXPECT_TRUE(Contains(run.output,
                         "STAGE rank 0 rank 0/2, 2 virtual stages: stage 0/4: layers [0, "
                         "2): Linear(50 -> 50), ReLU(); stage 2/4: layers [4, 6): "
                         "Linear(50 -> 50), ReLU()"))
        << run.output;
    EXPECT_TRUE(Contains(run.output,
                         "STAGE rank 1 rank 1/2, 2 virtual stages: stage 1/4: layers [2, "
                         "4): Linear(50 -> 50), ReLU(); stage 3/4: layers [6, 7): "
                         "Linear(50 -> 4)"))
        << run.output;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Interleaved, PpMlpInterleavedTest,
    ::testing::Values(std::make_tuple(2, 2, 4, "50,50,50,50,4"),
                      std::make_tuple(2, 2, 2, "50,50,50,50,4"),
                      std::make_tuple(2, 2, 8, "50,50,50,50,4"),
                      std::make_tuple(3, 2, 3, "50,50,50,50,50,50,4"),
                      std::make_tuple(3, 2, 6, "50,50,50,50,50,50,4"),
                      std::make_tuple(2, 3, 4, "50,50,50,50,50,50,4")),
    [](const auto& info) {
      return "pp" + std::to_string(std::get<0>(info.param)) + "_v" +
             std::to_string(std::get<1>(info.param)) + "_m" +
             std::to_string(std::get<2>(info.param));
    });

// An interleaved step the schedule cannot run is refused on every rank
// before any activation is sent.
TEST(PpMlpTest, InterleavedRefusesMicrobatchesOffItsRounds) {
  MeshrunRun run = RunUnderMeshrun(
      2, "pp_mlp_worker",
      {"--schedule", "interleaved", "--virtual-stages", "2", "--microbatches", "5"},
      std::chrono::seconds(60));
  EXPECT_EQ(run.exit_code, 3) << run.output;
  EXPECT_EQ(Lines(run.output, "ERROR rank").size(), 2u) << run.output;
  EXPECT_TRUE(Contains(run.output,
                       "interleaved 1F1B needs the microbatches to be a multiple of its "
                       "number of rounds, max(1, 5 / 2) = 2; got 5"))
      << run.output;
  EXPECT_EQ(CountSteps(run.output), 0) << run.output;
}

// A stage cut for V chunks cannot run a one-stage-per-rank schedule.
TEST(PpMlpTest, OneFOneBRefusesVirtualStages) {
  MeshrunRun run = RunUnderMeshrun(
      2, "pp_mlp_worker",
      {"--schedule", "1f1b", "--virtual-stages", "2", "--microbatches", "4"},
      std::chrono::seconds(60));
  EXPECT_EQ(run.exit_code, 3) << run.output;
  EXPECT_TRUE(Contains(run.output,
                       "1f1b runs one stage per pipeline rank; 2 virtual stages per rank "
                       "need the interleaved schedule"))
      << run.output;
}

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
// activation is sent: a clear message and the worker's exit code 3, no hang.
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

// A batch that does not split into equal microbatches is refused (every
// stage refuses alike; the test below runs the stages without a launcher).
TEST(PpMlpTest, RefusesUnequalMicrobatches) {
  MeshrunRun run = RunUnderMeshrun(2, "pp_mlp_worker", {"--microbatches", "5"},
                                   std::chrono::seconds(60));
  EXPECT_EQ(run.exit_code, 3) << run.output;
  EXPECT_TRUE(Contains(run.output, "of 32 rows does not split into 5 equal microbatches"))
      << run.output;
}

// A batch that does not split into equal microbatches is visible only to
// the first stage (the input) and the last (the target). Every stage,
// the middle ones included, refuses the step with the same one-line error
// and exits by itself within seconds: no stage waits for an activation that
// will never be sent (the group timeout is the default 30 minutes).
TEST(PpMlpTest, EveryStageRefusesUnequalMicrobatchesAndEndsPromptly) {
  constexpr int kStages = 4;
  const std::vector<DirectRank> ranks =
      RunDirectly(kStages, "pp_mlp_worker", {"--microbatches", "5", "--steps", "1"},
                  std::chrono::seconds(90));
  for (int rank = 0; rank < kStages; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank) + " (ran " +
                 std::to_string(ranks[rank].ran.count()) + " ms)");
    EXPECT_EQ(ranks[rank].exit_code, 3) << ranks[rank].output;
    EXPECT_EQ(Lines(ranks[rank].output, "ERROR "),
              std::vector<std::string>{
                  "ERROR rank " + std::to_string(rank) +
                  ": pipeline input of 32 rows does not split into 5 equal microbatches"})
        << ranks[rank].output;
    EXPECT_EQ(CountSteps(ranks[rank].output), 0) << ranks[rank].output;
  }
  // Process start (libtorch loads in each) included; a waiting stage would
  // take the group timeout.
  for (const DirectRank& rank : ranks) EXPECT_LT(rank.ran, std::chrono::seconds(60));
}

}  // namespace
}  // namespace meshrun
