// FullyShard on a user's torch::nn::Module trains as one process does:
// module_fsdp_worker under the real launcher checks every step's loss, the
// final parameters, the shards and AdamW's state against its own
// single-process run (rtol 1e-5), and which gathered storage is alive after
// forward and backward; here the launcher's exit code and the shard shapes.

#include <gtest/gtest.h>

#include <string>

#include "tests/integration/parallel/driver_support.h"

namespace meshrun {
namespace {

using testing::MeshrunRun;
using testing::RunUnderMeshrun;

constexpr int kSteps = 8;

TEST(ModuleFsdpTest, World2MatchesSingleProcess) {
  MeshrunRun run = RunUnderMeshrun(2, "module_fsdp_worker", {});
  ExpectTrained(run, 2, kSteps);
  // fc1 is Linear(30, 60): 30 of its 60 rows a rank.
  EXPECT_TRUE(Contains(run.output, "SHARD blocks.0.fc1.weight [30, 30]")) << run.output;
  // Forward touches [root, block0, block1, block2, root] and backward the
  // reverse: 7 gathers a step (the root once, each block in forward and
  // again in backward). Each block's all-gather is issued by the unit before
  // it, in forward from the second step on (the first has no order yet),
  // and in backward from the first: 3 + 7 x 6 of 56.
  EXPECT_TRUE(Contains(run.output, "GATHERS 56 prefetched 45")) << run.output;
}

// 5 output rows over 4 ranks: torch.chunk gives 2, 2, 1, 0 (padded to 2).
TEST(ModuleFsdpTest, World4WithPaddingMatchesSingleProcess) {
  MeshrunRun run = RunUnderMeshrun(4, "module_fsdp_worker", {});
  ExpectTrained(run, 4, kSteps);
  EXPECT_TRUE(Contains(run.output, "SHARD blocks.0.fc1.weight [15, 30]")) << run.output;
  EXPECT_TRUE(Contains(run.output, "GATHERS 56 prefetched 45")) << run.output;
}

TEST(ModuleFsdpTest, World4WithoutReshardAfterForwardMatchesSingleProcess) {
  MeshrunRun run =
      RunUnderMeshrun(4, "module_fsdp_worker", {"--reshard-after-forward", "false"});
  ExpectTrained(run, 4, kSteps);
  // Gathered once a step, in forward, kept for backward: 4 a step, the
  // blocks prefetched from the second step on.
  EXPECT_TRUE(Contains(run.output, "GATHERS 32 prefetched 21")) << run.output;
}

// HSDP: FullyShard over pairs of ranks, DistributedDataParallel across the
// pairs; the shards' grads are all-reduced during backward as their
// reduce-scatters finish.
TEST(ModuleFsdpTest, World4HsdpMatchesSingleProcess) {
  MeshrunRun run = RunUnderMeshrun(4, "module_fsdp_worker", {"--hsdp"});
  ExpectTrained(run, 4, kSteps);
  EXPECT_TRUE(Contains(run.output, "SHARD blocks.0.fc1.weight [30, 30]")) << run.output;
  // One 25 MiB bucket holds the shards.
  EXPECT_TRUE(
      Contains(run.output, "REPLICATE 1 buckets, 1 all-reduced during the last backward"))
      << run.output;
}

}  // namespace
}  // namespace meshrun
