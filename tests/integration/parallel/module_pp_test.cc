// Pipeline stages of a user's torch::nn::Module train as one process does:
// module_pp_worker under the real launcher checks every step's loss and its
// stages' final parameters against its own single-process run (rtol 1e-5)
// under each schedule; here the exit codes and the stages.

#include <gtest/gtest.h>

#include <string>

#include "tests/integration/parallel/driver_support.h"

namespace meshrun {
namespace {

using testing::MeshrunRun;
using testing::RunUnderMeshrun;

constexpr int kSteps = 8;

TEST(ModulePpTest, GPipeMatchesSingleProcess) {
  MeshrunRun run = RunUnderMeshrun(2, "module_pp_worker", {"--schedule", "gpipe"});
  ExpectTrained(run, 2, kSteps);
  // [in, block 0, block 1]: 2 + 2 x 6 parameters; [block 2, norm, head]: 6 + 2 + 2.
  EXPECT_TRUE(
      Contains(run.output, "STAGES rank 0: stage 0/2: NetStageImpl, 14 parameters"))
      << run.output;
  EXPECT_TRUE(
      Contains(run.output, "STAGES rank 1: stage 1/2: NetStageImpl, 10 parameters"))
      << run.output;
}

TEST(ModulePpTest, OneFOneBMatchesSingleProcess) {
  MeshrunRun run = RunUnderMeshrun(2, "module_pp_worker", {"--schedule", "1f1b"});
  ExpectTrained(run, 2, kSteps);
}

TEST(ModulePpTest, Interleaved1F1BMatchesSingleProcess) {
  MeshrunRun run = RunUnderMeshrun(2, "module_pp_worker", {"--schedule", "interleaved"});
  ExpectTrained(run, 2, kSteps);
  EXPECT_TRUE(
      Contains(run.output,
               "STAGES rank 1: rank 1/2, 2 virtual stages: stage 1/4: NetStageImpl; "
               "stage 3/4: NetStageImpl, 10 parameters"))
      << run.output;
}

// DP x TP x PP on 8 ranks, (dp, pp, tp) = (2, 2, 2): the blocks
// tensor-parallel, the stages DistributedDataParallel over dp.
TEST(ModulePpTest, DpTimesTpTimesPpMatchesSingleProcess) {
  MeshrunRun run = RunUnderMeshrun(8, "module_pp_worker",
                                   {"--schedule", "1f1b", "--dp", "2", "--tp", "2"});
  ExpectTrained(run, 8, kSteps);
}

}  // namespace
}  // namespace meshrun
