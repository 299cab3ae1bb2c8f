// Parallelisms composed on one mesh (issue 5): train_example under the real
// launcher, with --verify (every rank also trains the whole model in one
// process and checks each step's loss and the final gathered parameters);
// seed 000's FSDP+TP full_tensor; a checkpoint saved on one layout and
// loaded on another; layouts that cannot work refused with their reason.

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "tests/integration/parallel/driver_support.h"
#include "tests/support/meshrun_run.h"

namespace meshrun::worker::parallel {
namespace {

using meshrun::testing::MeshrunRun;
using meshrun::testing::RunUnderMeshrun;

std::vector<std::string> Args(const std::string& text) {
  return absl::StrSplit(text, ' ', absl::SkipEmpty());
}

// Rank 0's "step N loss X" lines.
std::map<int, double> Losses(const std::string& output) {
  std::map<int, double> losses;
  std::regex re(R"((?:^|\n)step (\d+) loss (\S+))");
  for (std::sregex_iterator it(output.begin(), output.end(), re), end; it != end; ++it)
    losses[std::stoi((*it)[1])] = std::stod((*it)[2]);
  return losses;
}

int CountOf(const std::string& output, const std::string& needle) {
  int count = 0;
  for (size_t at = output.find(needle); at != std::string::npos;
       at = output.find(needle, at + 1))
    ++count;
  return count;
}

struct Layout {
  std::string model;
  std::string args;
  int world;
};

std::ostream& operator<<(std::ostream& out, const Layout& layout) {
  return out << layout.model << " " << layout.args;
}

class ComposedLayouts : public ::testing::TestWithParam<Layout> {};

TEST_P(ComposedLayouts, TrainExactlyAsOneProcess) {
  const Layout& layout = GetParam();
  MeshrunRun run = RunUnderMeshrun(
      layout.world, "train_example",
      Args("--model " + layout.model + " " + layout.args + " --steps 10 --verify"));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(CountOf(run.output, "equal single-process training"), layout.world)
      << run.output;
  auto losses = Losses(run.output);
  ASSERT_EQ(losses.size(), 10u) << run.output;
  EXPECT_TRUE(std::isfinite(losses[9]));
}

INSTANTIATE_TEST_SUITE_P(
    Mesh, ComposedLayouts,
    ::testing::Values(
        // Each parallelism alone (FSDP over 4: 50 rows -> 13, 13, 13, 11
        // with padding; dp x fsdp is HSDP).
        Layout{"mlp", "--dp 4", 4}, Layout{"mlp", "--fsdp 4", 4},
        Layout{"mlp", "--dp 2 --fsdp 2", 4}, Layout{"mlp", "--tp 2", 2},
        Layout{"gpt", "--tp 2", 2},
        // Composed.
        Layout{"mlp", "--fsdp 2 --tp 2", 4},
        // Seed 003: 4 layers (50x50 three times, 50x4), batch 32 -> [32, 4],
        // TP inside each of two pipeline stages.
        Layout{"mlp", "--pp 2 --tp 2 --microbatches 4", 4},
        Layout{"mlp", "--pp 2 --tp 2 --schedule 1f1b --microbatches 4", 4},
        Layout{"mlp", "--pp 2 --dp 2 --tp 2 --schedule 1f1b --microbatches 4", 8},
        Layout{"mlp", "--dp 2 --fsdp 2 --tp 2", 8},
        // FSDP inside pipeline stages: each stage module the root of its units.
        Layout{"mlp", "--pp 2 --fsdp 2 --schedule 1f1b --microbatches 2 --no-reshard", 4},
        Layout{"gpt", "--fsdp 2 --tp 2 --optimizer adamw --lr 0.003", 4},
        Layout{"gpt", "--pp 2 --tp 2 --schedule 1f1b --microbatches 2", 4},
        Layout{"gpt", "--dp 2 --pp 2 --fsdp 2 --microbatches 2", 8}));

// Seed 000's FSDP2 + TP: full_tensor() gives the rows back in order.
TEST(ComposedFullTensor, FsdpOverTpShardsReassemblesInOrder) {
  MeshrunRun run = RunUnderMeshrun(8, "compose_full_tensor_worker", {});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  std::string full;
  for (int v = 101; v <= 244; ++v) full += (v > 101 ? ", " : "") + std::to_string(v);
  EXPECT_NE(run.output.find("FULL " + full + "\n"), std::string::npos) << run.output;
  // Rank 4 (fsdp 1, tp 0) holds global row 2 (125..136): the last row of TP
  // shard 0, not row 3 as mesh-order reassembly would have it.
  EXPECT_NE(run.output.find("SHARD 4 fsdp_rank:1 tp_rank:0 rows 2+1 "
                            "[Shard(dim=0)@TP, Shard(dim=0)@FSDP] values 125, 126, 127"),
            std::string::npos)
      << run.output;
  EXPECT_EQ(CountOf(run.output, "SHARD "), 8);
}

// Seed 000's HSDP: a flat weight arange(101., 201.) fully sharded over "FSDP"
// of a (2, 4) mesh ["DP", "FSDP"], replicated over "DP": each rank holds 25
// values, fsdp_rank k 101+25k .. 125+25k, the same on both DP ranks.
TEST(ComposedHsdp, Seed000PrintoutOnMesh2x4) {
  MeshrunRun run = RunUnderMeshrun(8, "hsdp_seed000_worker", {});
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(CountOf(run.output, "FAIL rank"), 0) << run.output;
  std::regex re(
      "Global rank: (\\d+), dp_rank: (\\d+), fsdp_rank:(\\d+), Weights array: "
      "tensor\\(\\[([^\\]]*)\\], requires_grad=True\\)");
  std::set<int> ranks;
  for (std::sregex_iterator it(run.output.begin(), run.output.end(), re), end; it != end;
       ++it) {
    const std::smatch& m = *it;
    const int rank = std::stoi(m[1]);
    const int fsdp_rank = std::stoi(m[3]);
    ranks.insert(rank);
    EXPECT_EQ(std::stoi(m[2]), rank / 4) << m[0];
    EXPECT_EQ(fsdp_rank, rank % 4) << m[0];
    std::string expected;
    for (int v = 101 + 25 * fsdp_rank; v <= 125 + 25 * fsdp_rank; ++v)
      expected += (expected.empty() ? "" : ", ") + std::to_string(v) + ".";
    EXPECT_EQ(m[4].str(), expected) << m[0];
  }
  EXPECT_EQ(ranks.size(), 8u) << run.output;
  // The seed's own line for rank 6.
  EXPECT_NE(run.output.find("Global rank: 6, dp_rank: 1, fsdp_rank:2, Weights array: "
                            "tensor([151., 152., 153."),
            std::string::npos)
      << run.output;
}

// 5 steps of AdamW on dp=2 x tp=2, saved with the optimizer's state; 5 more
// on pp=2 x fsdp=2 from the checkpoint: the same losses as 10 uninterrupted
// steps in one process.
TEST(ComposedCheckpoint, ResumesOnAnotherLayout) {
  char pattern[] = "/tmp/meshrun_compose_ckpt_XXXXXX";
  ASSERT_NE(mkdtemp(pattern), nullptr);
  const std::string dir = pattern;

  const std::string adamw = " --optimizer adamw --lr 0.01 --weight-decay 0.1";
  MeshrunRun whole = RunUnderMeshrun(1, "train_example", Args("--steps 10" + adamw));
  ASSERT_EQ(whole.exit_code, 0) << whole.output;
  MeshrunRun first = RunUnderMeshrun(
      4, "train_example", Args("--dp 2 --tp 2 --steps 5 --save " + dir + adamw));
  ASSERT_EQ(first.exit_code, 0) << first.output;
  MeshrunRun second = RunUnderMeshrun(4, "train_example",
                                      Args("--pp 2 --fsdp 2 --microbatches 2 --load " +
                                           dir + " --first-step 5 --steps 5" + adamw));
  std::filesystem::remove_all(dir);
  ASSERT_EQ(second.exit_code, 0) << second.output;

  auto want = Losses(whole.output);
  auto resumed = Losses(second.output);
  ASSERT_EQ(resumed.size(), 5u) << second.output;
  for (int step = 5; step < 10; ++step) {
    ASSERT_TRUE(resumed.count(step)) << second.output;
    EXPECT_NEAR(resumed[step], want[step], 1e-5 * std::abs(want[step]))
        << "step " << step;
  }
}

class RefusedLayouts : public ::testing::TestWithParam<Refusal> {};

TEST_P(RefusedLayouts, FailWithTheirReason) {
  const Refusal& refusal = GetParam();
  MeshrunRun run = RunUnderMeshrun(refusal.world, "train_example", Args(refusal.args));
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_NE(run.output.find(refusal.message), std::string::npos) << run.output;
}

INSTANTIATE_TEST_SUITE_P(
    Mesh, RefusedLayouts,
    ::testing::Values(
        Refusal{"--dp 3", 2,
                "ModuleTrainer: layout dp=3 fsdp=1 pp=1 tp=1: DDP over dp needs 3 ranks, "
                "the world has 2"},
        Refusal{"--pp 2 --schedule 1f1b --microbatches 1", 2,
                "1F1B needs at least 2 microbatches for 2 stages, got 1"},
        Refusal{"--pp 2 --microbatches 5", 2,
                "pipeline input of 32 rows does not split into 5 equal microbatches"},
        Refusal{"--tp 3", 3,
                "ParallelizeModule: fc0.weight is [50, 50]; its rows (output features), "
                "50, do not split evenly over 3 ranks of 'tp'"}));

}  // namespace
}  // namespace meshrun::worker::parallel
