// The plain-libtorch GPT (worker_lib/examples/gpt.h) trains under meshrun's
// parallelisms on torch::nn modules as in one process: gpt_worker checks
// every step's loss and the final parameters (rtol 1e-5, AdamW); here the
// exit codes and steps.

#include <gtest/gtest.h>

#include <string>

#include "tests/integration/parallel/driver_support.h"

namespace meshrun {
namespace {

using testing::MeshrunRun;
using testing::RunUnderMeshrun;

constexpr int kSteps = 8;

TEST(GptTest, TensorParallelMatchesSingleProcess) {
  MeshrunRun run = RunUnderMeshrun(2, "gpt_worker", {"--layout", "tp"});
  ExpectTrained(run, 2, kSteps);
}

TEST(GptTest, FsdpWithTensorParallelMatchesSingleProcess) {
  MeshrunRun run = RunUnderMeshrun(4, "gpt_worker", {"--layout", "fsdp_tp"});
  ExpectTrained(run, 4, kSteps);
}

TEST(GptTest, DistributedDataParallelMatchesSingleProcess) {
  MeshrunRun run = RunUnderMeshrun(2, "gpt_worker", {"--layout", "ddp"});
  ExpectTrained(run, 2, kSteps);
}

}  // namespace
}  // namespace meshrun
