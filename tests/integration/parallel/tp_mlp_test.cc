// Tensor-parallel MLP training equals single-process training: tp_mlp_worker
// under the real launcher checks every step's loss and the gathered final
// params against its own single-process reference (rtol 1e-5); here the
// launcher's exit code, the layer layout and the printed losses are checked.

#include <gtest/gtest.h>

#include "tests/integration/parallel/driver_support.h"

namespace meshrun {
namespace {

using testing::MeshrunRun;
using testing::RunUnderMeshrun;

// Seed 003's model: 50x50 three times, then 50x4; batch 32 -> [32, 4].
TEST(TpMlpTest, Seed003MlpAtTp2MatchesSingleProcess) {
  MeshrunRun run = RunUnderMeshrun(2, "tp_mlp_worker", {"--sizes", "50,50,50,50,4"});
  ExpectTrained(run, 2, 10);
  EXPECT_TRUE(Contains(run.output, "LAYER ColumnParallelLinear(50 -> 50, tp=2)"));
  EXPECT_TRUE(Contains(run.output, "LAYER RowParallelLinear(50 -> 4, tp=2)"));
  // The head's weight keeps 25 of 50 input columns on each rank.
  EXPECT_TRUE(
      Contains(run.output, "LOCAL 1 fc3.weight [4, 50] Shard(dim=1)@tp local [4, 25]"))
      << run.output;
  EXPECT_TRUE(Contains(run.output, "LOCAL 0 fc0.bias [50] Shard(dim=0)@tp local [25]"));
}

// 50 hidden units do not split over 4 ranks; 64 do.
TEST(TpMlpTest, MlpAtTp4MatchesSingleProcess) {
  MeshrunRun run = RunUnderMeshrun(4, "tp_mlp_worker", {"--sizes", "50,64,64,64,4"});
  ExpectTrained(run, 4, 10);
  EXPECT_TRUE(
      Contains(run.output, "LOCAL 3 fc3.weight [4, 64] Shard(dim=1)@tp local [4, 16]"))
      << run.output;
}

// An odd last Linear is column-parallel with a gathered output: the 50x4
// head keeps 2 outputs per rank at tp=2, 1 at tp=4.
TEST(TpMlpTest, OddLastLinearIsColumnParallelWithGatherAtTp2) {
  MeshrunRun run = RunUnderMeshrun(2, "tp_mlp_worker", {"--sizes", "50,50,50,4"});
  ExpectTrained(run, 2, 10);
  EXPECT_TRUE(
      Contains(run.output, "LAYER ColumnParallelLinear(50 -> 4, tp=2, gather_output)"))
      << run.output;
  EXPECT_TRUE(
      Contains(run.output, "LOCAL 1 fc2.weight [4, 50] Shard(dim=0)@tp local [2, 50]"))
      << run.output;
}

TEST(TpMlpTest, OddLastLinearIsColumnParallelWithGatherAtTp4) {
  MeshrunRun run = RunUnderMeshrun(4, "tp_mlp_worker", {"--sizes", "50,64,64,4"});
  ExpectTrained(run, 4, 10);
  EXPECT_TRUE(
      Contains(run.output, "LOCAL 2 fc2.weight [4, 64] Shard(dim=0)@tp local [1, 64]"))
      << run.output;
}

TEST(TpMlpTest, UnevenSplitIsRefusedWithTheSizes) {
  MeshrunRun run = RunUnderMeshrun(
      4, "tp_mlp_worker",
      {"--sizes", "50,50,50,50,4", "--expect-error",
       "fc0.weight: dim 0 of size 50 does not split evenly over 4 ranks of 'tp'"});
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(CountLines(run.output, "ERROR "), 4) << run.output;
}

}  // namespace
}  // namespace meshrun
