// A pipeline step that cannot run is refused by every stage alike, and
// each ends by itself: train_example's ranks started directly (no launcher
// to stop the others when one exits), each with its own one-line reason.

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "tests/integration/parallel/driver_support.h"
#include "tests/support/child_process.h"

namespace meshrun {
namespace {

// One worker process per rank, started directly rather than by the launcher,
// so that nothing stops a rank when another exits: each must end on its own.
// The ranks' groups rendezvous through a real meshrun-rdzvd (port 0) as
// under meshrun.
struct DirectRank {
  int exit_code = -1;  // -1: still running at the deadline (then killed)
  std::chrono::milliseconds ran{};
  std::string output;
};

std::vector<DirectRank> RunDirectly(int world, const std::string& program,
                                    const std::vector<std::string>& args,
                                    std::chrono::milliseconds timeout) {
  testing::DaemonProcess daemon;
  const std::string port = daemon.endpoint().substr(daemon.endpoint().rfind(':') + 1);
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::unique_ptr<testing::ChildProcess>> processes;
  for (int rank = 0; rank < world; ++rank) {
    // MASTER_* are required by the worker environment but unused with
    // meshrun's store (Gloo binds 127.0.0.1 for a loopback MASTER_ADDR).
    std::vector<std::string> argv{"/usr/bin/env",
                                  "RANK=" + std::to_string(rank),
                                  "WORLD_SIZE=" + std::to_string(world),
                                  "LOCAL_RANK=" + std::to_string(rank),
                                  "LOCAL_WORLD_SIZE=" + std::to_string(world),
                                  "MASTER_ADDR=127.0.0.1",
                                  "MASTER_PORT=" + port,
                                  "MESHRUN_STORE_ENDPOINT=" + daemon.endpoint(),
                                  "MESHRUN_STORE_PREFIX=direct/",
                                  "OMP_NUM_THREADS=1",
                                  testing::BinDir() + "/" + program};
    argv.insert(argv.end(), args.begin(), args.end());
    processes.push_back(
        std::make_unique<testing::ChildProcess>(argv, /*merge_stderr=*/true));
  }
  std::vector<DirectRank> ranks(world);
  for (int rank = 0; rank < world; ++rank) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        start + timeout - std::chrono::steady_clock::now());
    ranks[rank].exit_code =
        testing::ExitCode(*processes[rank], std::max(left, std::chrono::milliseconds(0)));
    ranks[rank].ran = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::steady_clock::now() - start);
    ranks[rank].output = processes[rank]->output();
  }
  return ranks;  // the processes still running are killed here, by pid
}

// A batch that does not split into equal microbatches is visible only to
// the first stage (the input) and the last (the target). Every stage,
// the middle ones included, refuses the step with the same one-line error
// and exits by itself within seconds: no stage waits for an activation that
// will never be sent (the group timeout is the default 30 minutes).
TEST(PipelineRefusal, EveryStageRefusesUnequalMicrobatchesAndEndsPromptly) {
  constexpr int kStages = 4;
  const std::vector<DirectRank> ranks = RunDirectly(
      kStages, "train_example", {"--pp", "4", "--microbatches", "5", "--steps", "1"},
      std::chrono::seconds(90));
  for (int rank = 0; rank < kStages; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank) + " (ran " +
                 std::to_string(ranks[rank].ran.count()) + " ms)");
    EXPECT_EQ(ranks[rank].exit_code, 1) << ranks[rank].output;
    EXPECT_EQ(Lines(ranks[rank].output, "train_example rank "),
              std::vector<std::string>{
                  "train_example rank " + std::to_string(rank) +
                  ": pipeline input of 32 rows does not split into 5 equal microbatches"})
        << ranks[rank].output;
    EXPECT_EQ(CountSteps(ranks[rank].output), 0) << ranks[rank].output;
  }
  // Process start (libtorch loads in each) included; a waiting stage would
  // take the group timeout.
  for (const DirectRank& rank : ranks) EXPECT_LT(rank.ran, std::chrono::seconds(60));
}

}  // namespace
}  // namespace meshrun
