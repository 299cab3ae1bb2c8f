// ParallelizeModule on a user's torch::nn::Module trains as one process
// does: module_tp_worker under the real launcher checks every step's loss
// and the gathered final parameters against its own single-process run
// (rtol 1e-5); here the exit codes, the local shapes, and the one-line
// refusals of bad plans.

#include <gtest/gtest.h>

#include <string>

#include "tests/integration/parallel/driver_support.h"

namespace meshrun {
namespace {

using testing::MeshrunRun;
using testing::RunUnderMeshrun;

constexpr int kSteps = 8;

TEST(ModuleTpTest, World2MatchesSingleProcess) {
  MeshrunRun run = RunUnderMeshrun(2, "module_tp_worker", {});
  ExpectTrained(run, 2, kSteps);
  // fc1 [60, 30] by rows, fc2 [30, 60] by columns: [30, 30] each.
  EXPECT_TRUE(Contains(run.output,
                       "LOCAL blocks.0.fc1.weight [30, 30] blocks.0.fc2.weight [30, 30]"))
      << run.output;
  // Three blocks: fc1's weight and bias, fc2's weight.
  EXPECT_TRUE(Contains(run.output, "SHARDED 9 parameters")) << run.output;
  EXPECT_TRUE(Contains(run.output,
                       "PLAN missing: INVALID_ARGUMENT: ParallelizeModule: the plan's "
                       "'blocks.*.fc3' names no submodule"))
      << run.output;
  EXPECT_TRUE(
      Contains(run.output,
               "PLAN not a Linear: INVALID_ARGUMENT: ParallelizeModule: blocks.0.norm "
               "is a torch::nn::LayerNormImpl; ColwiseParallel and RowwiseParallel "
               "take a torch::nn::Linear"))
      << run.output;
  EXPECT_TRUE(
      Contains(run.output,
               "PLAN uneven: INVALID_ARGUMENT: ParallelizeModule: head.weight is [5, "
               "30]; its rows (output features), 5, do not split evenly over 2 ranks "
               "of 'tp'"))
      << run.output;
}

TEST(ModuleTpTest, World4MatchesSingleProcess) {
  MeshrunRun run = RunUnderMeshrun(4, "module_tp_worker", {});
  ExpectTrained(run, 4, kSteps);
  EXPECT_TRUE(Contains(run.output,
                       "LOCAL blocks.0.fc1.weight [15, 30] blocks.0.fc2.weight [30, 15]"))
      << run.output;
}

// Activation checkpointing (issue 44): each block's forward runs again
// inside backward; the recomputed Linears need their f and g as in forward,
// or the blocks' input gradients are each rank's partial sums and training
// leaves the single-process run at step 1.
TEST(ModuleTpTest, World2WithActivationCheckpointingMatchesSingleProcess) {
  MeshrunRun run = RunUnderMeshrun(2, "module_tp_worker", {"--checkpoint"});
  ExpectTrained(run, 2, kSteps);
  EXPECT_TRUE(Contains(run.output, "RECOMPUTED 24 block forwards")) << run.output;
}

// FSDP over dp on top of TP over tp, on a (2, 2) mesh: every parameter is
// sharded (the TP shards again, by rows).
TEST(ModuleTpTest, FsdpWithTpOnA2x2MeshMatchesSingleProcess) {
  MeshrunRun run = RunUnderMeshrun(4, "module_tp_worker", {"--fsdp"});
  ExpectTrained(run, 4, kSteps);
  EXPECT_TRUE(Contains(run.output,
                       "LOCAL blocks.0.fc1.weight [15, 30] blocks.0.fc2.weight [15, 30]"))
      << run.output;
  EXPECT_TRUE(Contains(run.output, "SHARDED 24 parameters")) << run.output;
}

// Activation checkpointing with FSDP units (issue 45): a block's forward
// runs first under no_grad (nothing to reshard for backward), then again
// inside backward, where its unit gathers for the recomputation and its
// post-backward reduce-scatters and reshards. Alone (a TP group of one) and
// under TP on the 2x2 mesh; both against the single-process run.
TEST(ModuleTpTest, FsdpWithActivationCheckpointingMatchesSingleProcess) {
  MeshrunRun run =
      RunUnderMeshrun(2, "module_tp_worker", {"--fsdp", "--tp=1", "--checkpoint"});
  ExpectTrained(run, 2, kSteps);
  // Every block of every step ran again inside backward (3 blocks, 8 steps).
  EXPECT_TRUE(Contains(run.output, "RECOMPUTED 24 block forwards")) << run.output;
}

TEST(ModuleTpTest, FsdpWithTpAndActivationCheckpointingMatchesSingleProcess) {
  MeshrunRun run = RunUnderMeshrun(4, "module_tp_worker", {"--fsdp", "--checkpoint"});
  ExpectTrained(run, 4, kSteps);
  EXPECT_TRUE(Contains(run.output, "RECOMPUTED 24 block forwards")) << run.output;
  EXPECT_TRUE(Contains(run.output, "SHARDED 24 parameters")) << run.output;
}

}  // namespace
}  // namespace meshrun
