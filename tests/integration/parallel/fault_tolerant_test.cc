// Fault-tolerant replicas (issue 18) under the real launcher and daemon:
// train_example --fault-tolerant under `meshrun --restart-scope=replica`,
// with a worker SIGKILLing itself at a chosen step and point of the step
// (its first incarnation only). Every run must exit 0 with every rank's
// --verify line: its final parameters equal single-process training of the
// committed steps, each on the rows of the replicas that took part, so a
// partly reduced or half-applied step would show. The survivors keep their
// pids from start to end; only the failed replica group starts again, and
// it is healed from a live peer.

#include <gtest/gtest.h>

#include <map>
#include <ostream>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "tests/integration/parallel/driver_support.h"
#include "tests/support/meshrun_run.h"
#include "tests/support/temp_dir.h"

namespace meshrun {
namespace {

using testing::MeshrunRun;
using testing::RunUnderMeshrun;

std::vector<std::string> Args(const std::string& text) {
  return absl::StrSplit(text, ' ', absl::SkipEmpty());
}

// rank -> the pids it started with ("rank R pid P: replica ..."), in order.
std::map<int, std::vector<std::string>> StartedPids(const std::string& output) {
  std::map<int, std::vector<std::string>> pids;
  std::regex re("rank (\\d+) pid (\\d+): replica");
  for (const std::string& line : Lines(output, ": replica ")) {
    std::smatch m;
    if (std::regex_search(line, m, re)) pids[std::stoi(m[1])].push_back(m[2]);
  }
  return pids;
}

// rank -> the pid of its "verified rank R pid P" line.
std::map<int, std::string> VerifiedPids(const std::string& output) {
  std::map<int, std::string> pids;
  std::regex re("verified rank (\\d+) pid (\\d+): ");
  for (const std::string& line : Lines(output, "verified rank")) {
    std::smatch m;
    if (std::regex_search(line, m, re)) pids[std::stoi(m[1])] = m[2];
  }
  return pids;
}

struct Failure {
  std::string args;         // train_example's, after --fault-tolerant --verify
  int replica_size;         // meshrun --replica-size
  std::set<int> restarted;  // the ranks that must start twice
};

std::ostream& operator<<(std::ostream& out, const Failure& failure) {
  return out << failure.args;
}

class ReplicaFailures : public ::testing::TestWithParam<Failure> {};

TEST_P(ReplicaFailures, SurvivorsTrainOnAndTheFailedGroupIsHealed) {
  const Failure& failure = GetParam();
  MeshrunRun run = RunUnderMeshrun(
      4, "train_example", Args(failure.args + " --fault-tolerant --verify"),
      std::chrono::seconds(240),
      {"--restart-scope=replica",
       "--replica-size=" + std::to_string(failure.replica_size), "--max-restarts=3"});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(CountLines(run.output, "SIGKILLs itself"), 1) << run.output;
  EXPECT_EQ(CountLines(run.output, "equal single-process training of"), 4) << run.output;

  const auto started = StartedPids(run.output);
  const auto verified = VerifiedPids(run.output);
  for (int rank = 0; rank < 4; ++rank) {
    ASSERT_TRUE(started.count(rank) && verified.count(rank)) << rank << "\n"
                                                             << run.output;
    const std::vector<std::string>& pids = started.at(rank);
    if (failure.restarted.count(rank)) {
      ASSERT_EQ(pids.size(), 2u) << rank << "\n" << run.output;
      EXPECT_EQ(verified.at(rank), pids.back()) << run.output;
    } else {
      // Never restarted: one start, and the same process verified at the end.
      ASSERT_EQ(pids.size(), 1u) << rank << "\n" << run.output;
      EXPECT_EQ(verified.at(rank), pids.front()) << run.output;
    }
  }
  // The restarted group was healed from a live replica.
  EXPECT_GE(CountLines(run.output, "healed from replica"), 1) << run.output;
}

INSTANTIATE_TEST_SUITE_P(
    KillPoints, ReplicaFailures,
    ::testing::Values(
        // The run: one of four replicas killed near step 30 of 100.
        Failure{"--dp 4 --steps 100 --kill-at-step 30 --kill-rank 2", 1, {2}},
        // In the middle of the gradient all-reduce, and after voting ok.
        Failure{
            "--dp 4 --steps 40 --kill-at-step 10 --kill-rank 1 --kill-point allreduce",
            1,
            {1}},
        Failure{"--dp 4 --steps 40 --kill-at-step 10 --kill-rank 3 --kill-point voted",
                1,
                {3}},
        // With momentum, a heal copies the optimizer's buffers too: without
        // them the healed replica's later updates (and so everyone's) would
        // differ from the reference.
        Failure{"--dp 4 --steps 300 --model transformer --momentum 0.9 --kill-at-step 20 "
                "--kill-rank 2",
                1,
                {2}},
        // Replica groups of two tensor-parallel ranks: rank 3's group (2, 3)
        // restarts, rank 2 with it.
        Failure{"--dp 2 --tp 2 --steps 40 --kill-at-step 10 --kill-rank 3", 2, {2, 3}}));

TEST(FaultTolerantReplicas, WithoutFailuresTrainExactlyAsOneProcess) {
  MeshrunRun run = RunUnderMeshrun(
      4, "train_example", Args("--dp 4 --steps 20 --fault-tolerant --verify"),
      std::chrono::seconds(240), {"--restart-scope=replica"});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(CountSteps(run.output), 20) << run.output;
  EXPECT_EQ(CountLines(run.output, "committed steps (0 without every replica)"), 4)
      << run.output;
}

TEST(FaultTolerantReplicas, BadCombinationsAreRefused) {
  MeshrunRun run = RunUnderMeshrun(4, "train_example", Args("--dp 3 --fault-tolerant"),
                                   std::chrono::seconds(120));
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_TRUE(Contains(run.output, "WORLD_SIZE 4 does not split into 3 replica groups"))
      << run.output;
  run = RunUnderMeshrun(4, "train_example", Args("--dp 4 --kill-at-step 3"),
                        std::chrono::seconds(120));
  EXPECT_NE(run.exit_code, 0) << run.output;
  EXPECT_TRUE(Contains(run.output,
                       "--kill-at-step and --kill-every need --fault-tolerant or "
                       "--checkpoint-dir"))
      << run.output;
  run = RunUnderMeshrun(4, "train_example",
                        Args("--dp 4 --fault-tolerant --checkpoint-dir /nonexistent"),
                        std::chrono::seconds(120), {"--restart-scope=replica"});
  EXPECT_NE(run.exit_code, 0) << run.output;
  EXPECT_TRUE(Contains(run.output, "--fault-tolerant does not combine with"))
      << run.output;
}

// --kill-every (scripts/bench-recovery.sh's repeated failures): every
// replica fails in turn, each restarts once and heals, and the committed
// steps still verify.
TEST(FaultTolerantReplicas, EveryReplicaFailingInTurnIsHealedEachTime) {
  MeshrunRun run = RunUnderMeshrun(
      4, "train_example",
      Args("--dp 4 --steps 50 --kill-every 10 --fault-tolerant --verify"),
      std::chrono::seconds(240), {"--restart-scope=replica", "--max-restarts=4"});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  for (int step : {10, 20, 30, 40}) {
    EXPECT_EQ(CountLines(run.output,
                         "SIGKILLs itself at step " + std::to_string(step) + " (start)"),
              1)
        << step << "\n"
        << run.output;
  }
  const auto started = StartedPids(run.output);
  for (int rank = 0; rank < 4; ++rank) {
    ASSERT_TRUE(started.count(rank)) << run.output;
    EXPECT_EQ(started.at(rank).size(), 2u) << rank << "\n" << run.output;
  }
  EXPECT_EQ(CountLines(run.output, "equal single-process training of 50 committed steps"),
            4)
      << run.output;
}

// The default recovery the fault-tolerant mode is measured against: a
// failure restarts the world, which resumes from the latest checkpoint and
// trains on exactly as an uninterrupted run (--verify compares each resumed
// step's loss and the final parameters with single-process training).
TEST(FullRestart, TheWorldResumesFromTheLatestCheckpoint) {
  testing::TempDir checkpoints;
  MeshrunRun run = RunUnderMeshrun(
      4, "train_example",
      Args("--dp 2 --tp 2 --steps 20 --checkpoint-every 5 --kill-at-step 12 --verify "
           "--checkpoint-dir " +
           checkpoints.path()),
      std::chrono::seconds(240), {"--max-restarts=1"});
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(CountLines(run.output, "SIGKILLs itself at step 12 (start)"), 1)
      << run.output;
  EXPECT_EQ(CountLines(run.output, "resumed from the checkpoint after step 10"), 1)
      << run.output;
  EXPECT_EQ(CountLines(run.output, ": 10 losses and"), 4) << run.output;
}

}  // namespace
}  // namespace meshrun
