// NCCL, where a GPU is: every collective of pg_worker and a DeviceMesh of
// mesh_worker over the NCCL backend, one worker per GPU (at most 4), under
// the real launcher. The NCCL path is compiled in every build (the torch
// wheel is a CUDA build); on a machine without a GPU the tests are skipped,
// saying so.

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <string>

#include "tests/support/gpus.h"
#include "tests/support/meshrun_run.h"
#include "tests/support/text.h"

namespace meshrun {
namespace {

using testing::RunUnderMeshrun;

class NcclTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why_none;
    gpus_ = std::min(testing::CountGpus(&why_none), 4);
    if (gpus_ == 0) GTEST_SKIP() << why_none;
  }
  int gpus_ = 0;
};

TEST_F(NcclTest, EveryCollectiveOnTheDefaultGroupAndSubgroups) {
  auto run =
      RunUnderMeshrun(gpus_, PG_WORKER_BINARY, {"collectives", "--backend", "nccl"});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(testing::Count(run.output, "FAIL rank="), 0u) << run.output;
  EXPECT_EQ(testing::Count(run.output, "PASS rank="), static_cast<size_t>(gpus_))
      << run.output;
  EXPECT_NE(run.output.find("backend=nccl device=cuda:0"), std::string::npos)
      << run.output;
}

TEST_F(NcclTest, DeviceMeshCollectivesOnEveryDimension) {
  const std::string shape =
      gpus_ % 2 == 0 ? "2," + std::to_string(gpus_ / 2) : std::to_string(gpus_);
  const std::string names = gpus_ % 2 == 0 ? "dp,tp" : "dp";
  auto run = RunUnderMeshrun(gpus_, MESH_WORKER_BINARY,
                             {"--shape", shape, "--names", names, "--backend", "nccl"});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(testing::Count(run.output, "FAIL "), 0u) << run.output;
  EXPECT_EQ(testing::Count(run.output, "DONE "), static_cast<size_t>(gpus_))
      << run.output;
}

}  // namespace
}  // namespace meshrun
