// Fault-tolerant replicas over a user's torch::nn::Module and AdamW under
// the real launcher and daemon: module_ft_worker with one of four replicas
// SIGKILLed at step 10 of 400. Every replica's final parameters must equal
// one process trained on the committed steps, each on the rows of the
// replicas that took part, which holds only if the restarted replica was
// healed with the parameters and AdamW's moments and step; the survivors
// keep their pids.

#include <gtest/gtest.h>

#include <string>

#include "tests/integration/parallel/driver_support.h"

namespace meshrun {
namespace {

using testing::MeshrunRun;
using testing::RunUnderMeshrun;

TEST(ModuleFaultTolerance, AKilledReplicaIsHealedWithItsOptimizerStateAndTheRestTrainOn) {
  MeshrunRun run = RunUnderMeshrun(4, "module_ft_worker",
                                   {"--replicas", "4", "--steps", "400", "--kill-at-step",
                                    "10", "--kill-replica", "2"},
                                   std::chrono::seconds(240),
                                   {"--restart-scope=replica", "--max-restarts=3"});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(CountLines(run.output, "SIGKILLs itself"), 1) << run.output;
  EXPECT_EQ(CountLines(run.output, "equal one process trained on 400 committed steps"), 4)
      << run.output;
  EXPECT_GE(CountLines(run.output, "replica 2 healed from replica"), 1) << run.output;
  const auto started = StartedPids(run.output);
  const auto verified = VerifiedPids(run.output);
  for (int rank = 0; rank < 4; ++rank) {
    ASSERT_TRUE(started.count(rank) && verified.count(rank)) << rank << "\n"
                                                             << run.output;
    const auto& pids = started.at(rank);
    ASSERT_EQ(pids.size(), rank == 2 ? 2u : 1u) << rank << "\n" << run.output;
    EXPECT_EQ(verified.at(rank), pids.back()) << run.output;
  }
}

}  // namespace
}  // namespace meshrun
