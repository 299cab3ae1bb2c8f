// A torch::nn convolutional net (Conv2d, max-pooling, Linear, NLL) trains
// under DistributedDataParallel, FullyShard and HSDP as in one process:
// module_conv_worker checks every step's loss and the final parameters
// (rtol 1e-5, AdamW), and with BatchNorm the buffers DDP leaves; here the
// exit codes and steps.

#include <gtest/gtest.h>

#include "tests/integration/parallel/driver_support.h"

namespace meshrun {
namespace {

using testing::MeshrunRun;
using testing::RunUnderMeshrun;

constexpr int kSteps = 8;

TEST(ModuleConvTest, DistributedDataParallelMatchesSingleProcess) {
  MeshrunRun run = RunUnderMeshrun(4, "module_conv_worker", {"--layout", "ddp"});
  ExpectTrained(run, 4, kSteps);
}

TEST(ModuleConvTest, FullyShardMatchesSingleProcess) {
  MeshrunRun run = RunUnderMeshrun(4, "module_conv_worker", {"--layout", "fsdp"});
  ExpectTrained(run, 4, kSteps);
}

TEST(ModuleConvTest, HsdpMatchesSingleProcess) {
  MeshrunRun run = RunUnderMeshrun(4, "module_conv_worker", {"--layout", "hsdp"});
  ExpectTrained(run, 4, kSteps);
}

// BatchNorm under DDP: every rank ends with rank 0's running statistics, as
// DDP's broadcast_buffers leaves them, and evaluates with them.
TEST(ModuleConvTest, BatchNormBuffersAreRankZerosAsUnderDdp) {
  MeshrunRun run =
      RunUnderMeshrun(4, "module_conv_worker", {"--layout", "ddp_batchnorm"});
  ExpectTrained(run, 4, kSteps);
}

}  // namespace
}  // namespace meshrun
