// FSDP training equals single-process training: fsdp_worker under the real
// launcher checks every step's loss and the gathered final params against
// its own single-process reference (rtol 1e-5) and when gathered params are
// alive; here the launcher's exit code, the shard layout (with padding) and
// the memory report are checked.

#include <gtest/gtest.h>

#include <regex>
#include <string>

#include "tests/integration/parallel/driver_support.h"

namespace meshrun {
namespace {

using testing::MeshrunRun;
using testing::RunUnderMeshrun;

TEST(FsdpTest, World2MatchesSingleProcess) {
  MeshrunRun run = RunUnderMeshrun(2, "fsdp_worker", {"--sizes", "50,50,50,50,4"});
  ExpectTrained(run, 2, 10);
  EXPECT_TRUE(Contains(run.output, "LAYER FSDP(Linear(50 -> 50))")) << run.output;
  EXPECT_TRUE(Contains(
      run.output, "LOCAL 1 fc0.weight [50, 50] Shard(dim=0)@fsdp local [25, 50] rows 25"))
      << run.output;
  EXPECT_TRUE(Contains(run.output, "UNSHARDED after forward: 0 bytes")) << run.output;
}

// 50 rows over 4 ranks: torch.chunk gives 13, 13, 13, 11 (the last padded to 13).
TEST(FsdpTest, World4WithPaddingMatchesSingleProcess) {
  MeshrunRun run = RunUnderMeshrun(4, "fsdp_worker", {"--sizes", "50,50,50,50,4"});
  ExpectTrained(run, 4, 10);
  for (int rank = 0; rank < 3; ++rank) {
    EXPECT_TRUE(Contains(run.output, "LOCAL " + std::to_string(rank) +
                                         " fc1.weight [50, 50] Shard(dim=0)@fsdp local "
                                         "[13, 50] rows 13"))
        << run.output;
  }
  EXPECT_TRUE(Contains(
      run.output, "LOCAL 3 fc1.weight [50, 50] Shard(dim=0)@fsdp local [13, 50] rows 11"))
      << run.output;
  EXPECT_TRUE(
      Contains(run.output, "LOCAL 3 fc0.bias [50] Shard(dim=0)@fsdp local [13] rows 11"))
      << run.output;
  // One group a layer: 13 rows of the weight and 13 of the bias per rank,
  // gathered by one all-gather; the next layer's issued before computing.
  EXPECT_TRUE(
      Contains(run.output, "GROUP FSDP(Linear(50 -> 50)): 2 params, 663 elements a rank"))
      << run.output;
  EXPECT_TRUE(
      Contains(run.output, "GROUP FSDP(Linear(50 -> 4)): 2 params, 51 elements a rank"))
      << run.output;
  EXPECT_TRUE(Contains(run.output,
                       "PREFETCH after FSDP(Linear(50 -> 50)): FSDP(Linear(50 -> 50))'s "
                       "all-gather in flight"))
      << run.output;
  EXPECT_TRUE(Contains(run.output, "UNSHARDED after forward: 0 bytes")) << run.output;
}

// Without resharding after forward the gathered params (padded: 4 x 13 rows
// of 50 floats for the 50x50 weights...) stay alive until backward.
TEST(FsdpTest, World4WithoutReshardAfterForwardMatchesSingleProcess) {
  MeshrunRun run = RunUnderMeshrun(
      4, "fsdp_worker", {"--sizes", "50,50,50,50,4", "--reshard-after-forward", "false"});
  ExpectTrained(run, 4, 10);
  // 3 x (52x50 + 52) + (4x50 + 4) floats.
  const int bytes = 4 * (3 * (52 * 50 + 52) + 4 * 50 + 4);
  EXPECT_TRUE(Contains(run.output,
                       "UNSHARDED after forward: " + std::to_string(bytes) + " bytes"))
      << run.output;
}

TEST(FsdpTest, World2WithoutReshardAfterForwardMatchesSingleProcess) {
  MeshrunRun run = RunUnderMeshrun(
      2, "fsdp_worker", {"--sizes", "50,50,50,50,4", "--reshard-after-forward", "false"});
  ExpectTrained(run, 2, 10);
}

// Rows fewer than ranks: [2, 5] over 4 ranks leaves ranks 2 and 3 with an
// empty (all-padding) chunk.
TEST(FsdpTest, World4EmptyChunksMatchSingleProcess) {
  MeshrunRun run = RunUnderMeshrun(4, "fsdp_worker", {"--sizes", "6,5,2"});
  ExpectTrained(run, 4, 10);
  EXPECT_TRUE(Contains(run.output,
                       "LOCAL 3 fc1.weight [2, 5] Shard(dim=0)@fsdp local [1, 5] rows 0"))
      << run.output;
  EXPECT_TRUE(Contains(run.output,
                       "LOCAL 2 fc0.weight [5, 6] Shard(dim=0)@fsdp local [2, 6] rows 1"))
      << run.output;
}

// Per-rank params + grads + SGD momentum: FSDP's are DP's / 4 plus padding,
// and no gathered param outlives a resharding forward.
TEST(FsdpTest, World4MemoryIsAQuarterOfDpPlusPadding) {
  MeshrunRun run =
      RunUnderMeshrun(4, "fsdp_worker", {"--sizes", "50,50,50,50,4", "--memory"});
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_TRUE(Lines(run.output, "FAIL rank").empty()) << run.output;
  auto lines = Lines(run.output, "MEMORY rank");
  ASSERT_EQ(lines.size(), 4u) << run.output;
  std::regex re(
      "dp params (\\d+) grads (\\d+) state (\\d+) total (\\d+) \\| fsdp params (\\d+) "
      "grads "
      "(\\d+) state (\\d+) total (\\d+) \\| padding (\\d+) \\| ratio ([.0-9]+) \\| "
      "unsharded after forward: reshard (\\d+), no reshard (\\d+)");
  for (const std::string& line : lines) {
    std::smatch m;
    ASSERT_TRUE(std::regex_search(line, m, re)) << line;
    const long dp_total = std::stol(m[4]);
    const long fsdp_total = std::stol(m[8]);
    const long padding = std::stol(m[9]);
    // 3 copies (param, grad, momentum) of (7858 floats).
    EXPECT_EQ(dp_total, 3L * 4 * (3 * (50 * 50 + 50) + 4 * 50 + 4)) << line;
    EXPECT_EQ(4 * fsdp_total, dp_total + 3 * padding) << line;
    EXPECT_LT(std::stod(m[10]), 0.26) << line;
    EXPECT_EQ(std::stol(m[11]), 0) << line;
    EXPECT_GT(std::stol(m[12]), 0) << line;
  }
}

// Seed 000's FSDP + TP on a (2, 4) mesh ["FSDP", "TP"]: FSDP shards the
// TP-local rows, and full_tensor() reassembles the 12x12 weight in order.
TEST(FsdpTest, FsdpOverTpShardsSeed000) {
  MeshrunRun run = RunUnderMeshrun(8, "fsdp_worker", {"--tp-seed000"});
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_TRUE(Lines(run.output, "FAIL rank").empty()) << run.output;
  EXPECT_EQ(Lines(run.output, "DONE rank").size(), 8u) << run.output;
  // Rank 5 = (FSDP 1, TP 1): TP rows 3..5 (row 3 starts at 137), FSDP keeps
  // the last of them (row 5: 161..172), padded to 2 rows.
  EXPECT_TRUE(Contains(run.output,
                       "FSDPTP rank 5 fsdp_rank 1 tp_rank 1 net1.weight [12, 12] "
                       "Shard(dim=0)@TP, Shard(dim=0)@FSDP local [2, 12] first 161"))
      << run.output;
}

}  // namespace
}  // namespace meshrun
