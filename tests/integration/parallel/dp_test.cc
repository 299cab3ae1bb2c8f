// Data-parallel training equals single-process training: dp_worker under the
// real launcher checks every step's loss and the final params against its
// own single-process reference (rtol 1e-5), the initial broadcast, that
// grads stay in the buckets, and accumulation over backwards; here the launcher's exit
// code and the printed lines are checked.

#include <gtest/gtest.h>

#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "tests/integration/parallel/driver_support.h"

namespace meshrun {
namespace {

using testing::MeshrunRun;
using testing::RunUnderMeshrun;

TEST(DpTest, World2MatchesSingleProcess) {
  MeshrunRun run = RunUnderMeshrun(2, "dp_worker", {"--sizes", "50,50,50,50,4"});
  ExpectTrained(run, 2, 10);
  // Different initial weights on rank 1 were seen, then overwritten.
  EXPECT_TRUE(Contains(run.output,
                       "VERIFY before broadcast: FAILED_PRECONDITION: DataParallel: "
                       "fc0.weight differs between the group's ranks"))
      << run.output;
  // 4096-byte buckets, in reverse order: fc3 and fc2.bias together, then
  // every other param alone (a 50x50 weight is 10000 bytes).
  EXPECT_TRUE(Contains(run.output, "BUCKETS 6 of <= 4096 bytes for 8 params"))
      << run.output;
  // Every param gets its grad in backward, so every bucket's all-reduce
  // starts there, before SyncGradients.
  EXPECT_TRUE(
      Contains(run.output, "OVERLAP at least 6 of 6 buckets started during backward"))
      << run.output;
  EXPECT_TRUE(
      Contains(run.output, "got a gradient while its bucket was being all-reduced"))
      << run.output;
}

TEST(DpTest, World4MatchesSingleProcess) {
  MeshrunRun run = RunUnderMeshrun(4, "dp_worker", {"--sizes", "50,50,50,50,4"});
  ExpectTrained(run, 4, 10);
}

TEST(DpTest, World4OneBucketMatchesSingleProcess) {
  MeshrunRun run = RunUnderMeshrun(
      4, "dp_worker", {"--sizes", "50,50,50,50,4", "--bucket-bytes", "26214400"});
  ExpectTrained(run, 4, 10);
  EXPECT_TRUE(Contains(run.output, "BUCKETS 1 of <= 26214400 bytes for 8 params"))
      << run.output;
  EXPECT_TRUE(
      Contains(run.output, "OVERLAP at least 1 of 1 buckets started during backward"))
      << run.output;
}

}  // namespace
}  // namespace meshrun
