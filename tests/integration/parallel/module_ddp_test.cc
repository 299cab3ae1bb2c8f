// DistributedDataParallel on a user's torch::nn::Module trains as one
// process does: module_ddp_worker under the real launcher checks every
// step's loss and its final parameters against its own single-process run
// (rtol 1e-5); here the exit codes, the buckets, and Wrap's refusal of
// ranks whose models differ.

#include <gtest/gtest.h>

#include <string>

#include "tests/integration/parallel/driver_support.h"

namespace meshrun {
namespace {

using testing::MeshrunRun;
using testing::RunUnderMeshrun;

constexpr int kSteps = 8;

TEST(ModuleDdpTest, World4MatchesSingleProcess) {
  MeshrunRun run = RunUnderMeshrun(4, "module_ddp_worker", {});
  ExpectTrained(run, 4, kSteps);
  // 4 KiB buckets of the model's 27 KiB of float parameters, every one
  // all-reduced while backward went on.
  EXPECT_TRUE(Contains(run.output, "BUCKETS 13, 13 started during the last backward"))
      << run.output;
}

// Each rank starts from other values; Wrap gives every rank rank 0's.
TEST(ModuleDdpTest, RanksStartingApartTrainFromRankZerosValues) {
  MeshrunRun run = RunUnderMeshrun(4, "module_ddp_worker", {"--rank-seeded"});
  ExpectTrained(run, 4, kSteps);
}

TEST(ModuleDdpTest, NoSyncAccumulatesMicrobatches) {
  MeshrunRun run = RunUnderMeshrun(2, "module_ddp_worker", {"--accumulate"});
  ExpectTrained(run, 2, kSteps);
}

TEST(ModuleDdpTest, RanksWithDifferentModelsAreRefusedAtWrap) {
  MeshrunRun run = RunUnderMeshrun(2, "module_ddp_worker", {"--mismatch"});
  EXPECT_NE(run.exit_code, 0) << run.output;
  EXPECT_TRUE(
      Contains(run.output,
               "WRAP rank 1: FAILED_PRECONDITION: DistributedDataParallel: parameter "
               "22 (head.weight, Float [6, 30] on rank 1) has another shape or dtype "
               "on rank 0"))
      << run.output;
  EXPECT_TRUE(Lines(run.output, "step 0").empty()) << run.output;
}

}  // namespace
}  // namespace meshrun
