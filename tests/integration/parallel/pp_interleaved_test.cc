// Interleaved 1F1B (V model chunks per pipeline rank) through ModuleTrainer:
// train_example under the real launcher with --verify (every rank also
// trains the whole model in one process and checks each step's loss and the
// final gathered parameters, rtol 1e-5), alone and composed with DP, FSDP
// and TP; the stage split printed; bad combinations refused with one line.

#include <gtest/gtest.h>

#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "tests/integration/parallel/driver_support.h"
#include "tests/support/meshrun_run.h"

namespace meshrun {
namespace {

using testing::MeshrunRun;
using testing::RunUnderMeshrun;

std::vector<std::string> Args(const std::string& text) {
  return absl::StrSplit(text, ' ', absl::SkipEmpty());
}

struct Layout {
  std::string args;
  int world;
};

std::ostream& operator<<(std::ostream& out, const Layout& layout) {
  return out << layout.args;
}

class InterleavedLayouts : public ::testing::TestWithParam<Layout> {};

TEST_P(InterleavedLayouts, TrainExactlyAsOneProcess) {
  const Layout& layout = GetParam();
  MeshrunRun run =
      RunUnderMeshrun(layout.world, "train_example",
                      Args(layout.args + " --schedule interleaved --steps 10 --verify"));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(CountLines(run.output, "equal single-process training"), layout.world)
      << run.output;
  EXPECT_EQ(CountSteps(run.output), 10) << run.output;
  EXPECT_EQ(CountLines(run.output, "rank 0 holds stage 0/"), 1) << run.output;
}

INSTANTIATE_TEST_SUITE_P(
    Mesh, InterleavedLayouts,
    ::testing::Values(
        // Seed 003's MLP (4 Linears): one Linear a stage over 2 x 2 stages.
        Layout{"--model mlp --pp 2 --virtual-stages 2 --microbatches 4", 2},
        Layout{"--model mlp --pp 2 --virtual-stages 2 --microbatches 2", 2},
        // 6 Linears over 2 ranks x 3 chunks.
        Layout{"--model mlp --sizes 50,50,50,50,50,50,4 --pp 2 --virtual-stages 3 "
               "--microbatches 4",
               2},
        // The GPT (embeddings, 2 blocks, final norm and head) over 4 stages.
        Layout{"--model gpt --pp 2 --virtual-stages 2 --microbatches 4", 2},
        // Composed: replicas synchronise all of a rank's chunks; FSDP shards
        // each chunk; TP inside every chunk.
        Layout{"--model mlp --pp 2 --dp 2 --virtual-stages 2 --microbatches 4", 4},
        Layout{"--model mlp --pp 2 --fsdp 2 --virtual-stages 2 --microbatches 2", 4},
        Layout{"--model mlp --pp 2 --tp 2 --virtual-stages 2 --microbatches 4", 4},
        Layout{"--model gpt --pp 2 --tp 2 --virtual-stages 2 --microbatches 2", 4},
        Layout{"--model gpt --pp 2 --dp 2 --virtual-stages 2 --microbatches 4 "
               "--optimizer adamw --lr 0.003",
               4}));

// The split rank 0 prints: it holds stages 0 and 2 of the model cut in 4,
// one Linear (part) each.
TEST(InterleavedTrainer, DescribesTheStageSplit) {
  MeshrunRun run = RunUnderMeshrun(
      2, "train_example",
      Args("--pp 2 --schedule interleaved --virtual-stages 2 --microbatches 4 "
           "--steps 1"));
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_TRUE(
      Contains(run.output,
               "layout dp=1 fsdp=1 pp=2 tp=1: interleaved over pp (2 chunks a "
               "rank), 4 microbatches (torch::nn MLP 50,50,50,50,4); rank 0 holds "
               "stage 0/4: parts [0, 0], stage 2/4: parts [2, 2]"))
      << run.output;
}

class InterleavedRefusals : public ::testing::TestWithParam<Refusal> {};

// Refused by ModuleTrainer::Create on every rank before it trains: exit 1 and the
// reason on one line (per rank that got to say it before the launcher
// stopped the group on the first rank's exit).
TEST_P(InterleavedRefusals, FailWithTheirReason) {
  const Refusal& refusal = GetParam();
  MeshrunRun run = RunUnderMeshrun(refusal.world, "train_example", Args(refusal.args));
  EXPECT_EQ(run.exit_code, 1) << run.output;
  const std::vector<std::string> lines = Lines(run.output, refusal.message);
  EXPECT_GE(lines.size(), 1u) << run.output;
  EXPECT_LE(lines.size(), static_cast<size_t>(refusal.world)) << run.output;
  for (const std::string& line : lines)
    EXPECT_TRUE(Contains(line, "train_example rank ")) << line;
  EXPECT_EQ(CountSteps(run.output), 0) << run.output;
}

INSTANTIATE_TEST_SUITE_P(
    Mesh, InterleavedRefusals,
    ::testing::Values(
        Refusal{"--pp 2 --schedule interleaved --microbatches 4", 2,
                "interleaved 1F1B needs at least 2 virtual stages per pipeline rank, got "
                "1 (with one, use 1f1b)"},
        Refusal{"--pp 2 --virtual-stages 2 --microbatches 4", 2,
                "gpipe runs one stage per pipeline rank; 2 virtual stages per rank need "
                "the interleaved schedule"},
        Refusal{"--pp 2 --schedule 1f1b --virtual-stages 2 --microbatches 4", 2,
                "1f1b runs one stage per pipeline rank; 2 virtual stages per rank need "
                "the interleaved schedule"},
        Refusal{"--pp 2 --schedule interleaved --virtual-stages 2 --microbatches 5 "
                "--batch 40",
                2,
                "interleaved 1F1B needs the microbatches to be a multiple of its number "
                "of rounds, max(1, 5 / 2) = 2; got 5"},
        Refusal{"--dp 2 --schedule interleaved --virtual-stages 2 --microbatches 2", 2,
                "interleaved 1F1B needs at least 2 pipeline ranks, got 1"},
        // 4 Linears cannot make 6 stages.
        Refusal{"--pp 2 --schedule interleaved --virtual-stages 3 --microbatches 4", 2,
                "ModuleTrainer: 6 pipeline stages need a model of at least 6 parts and "
                "a stage_of; it has 4"}));

}  // namespace
}  // namespace meshrun
