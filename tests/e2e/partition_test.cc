// Network partition, end to end: the real daemon in a hub network namespace,
// three real `meshrun` agents in namespaces of their own, each linked to the
// hub by a veth pair. One node's link is taken down in the middle of the job:
// the cut-off node must stop its workers once its lease has run out (no split
// brain trains on), and the two others must re-form without it and finish.
// Needs root and iproute2 (skipped, with the reason, otherwise).

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <thread>

#include "tests/e2e/netns_lab.h"
#include "tests/support/child_process.h"

namespace meshrun {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using testing::BinDir;
using testing::ChildProcess;
using testing::NetnsLab;
namespace fs = std::filesystem;

constexpr int kNodes = 3;
constexpr int kNproc = 2;
// Lease = keep_alive_interval x keep_alive_max_attempt.
constexpr int kKeepAliveSeconds = 1;
constexpr int kKeepAliveAttempts = 3;
constexpr auto kLease = seconds(kKeepAliveSeconds * kKeepAliveAttempts);
// Beyond the lease: the last heartbeat's own deadline and stopping workers
// (SIGTERM first, SIGKILL after --shutdown-timeout=2), with room for a
// loaded machine. Lease and slack stay well inside the workers' own time
// (kWorkSeconds), so a node that trained on is still told apart.
constexpr auto kStopSlack = seconds(10);

// Each worker appends its pid to its node's file and sleeps. (Attempts
// follow one another, so a node's lines come kNproc per attempt.)
constexpr char kWorker[] = R"(#!/bin/sh
echo $$ >> "$PARTITION_DIR/node$PARTITION_NODE.pids"
exec sleep "$WORK_SECONDS"
)";

bool Alive(pid_t pid) {
  if (kill(pid, 0) != 0) return false;
  // A zombie is dead for our purpose (its parent has not reaped it yet).
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string pid_field, comm, state;
  stat >> pid_field >> comm >> state;
  return state != "Z";
}

class PartitionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (auto why = NetnsLab::Unavailable()) GTEST_SKIP() << *why;
    lab_ = std::make_unique<NetnsLab>(kNodes);
    char dir[] = "/tmp/meshrun-partition-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
    std::ofstream(dir_ + "/worker.sh") << kWorker;
  }

  void TearDown() override {
    agents_.clear();  // ended by pid before their namespaces go
    daemon_.reset();
    lab_.reset();
    if (!dir_.empty()) fs::remove_all(dir_);
  }

  void StartDaemon() {
    daemon_ = std::make_unique<ChildProcess>(
        lab_->InHub({BinDir() + "/meshrun-rdzvd", "--host", lab_->hub_address(), "--port",
                     "0", "--log-level", "warn"}));
    const std::string prefix = "MESHRUN_RDZVD_ENDPOINT=";
    auto line = daemon_->ReadUntil(prefix, seconds(20));
    ASSERT_TRUE(line) << "meshrun-rdzvd did not print its endpoint";
    endpoint_ = line->substr(line->find(prefix) + prefix.size());
  }

  void StartAgent(int node, int work_seconds) {
    agents_.push_back(std::make_unique<ChildProcess>(
        lab_->InNode(
            node,
            {"/usr/bin/env", "PARTITION_NODE=" + std::to_string(node),
             "PARTITION_DIR=" + dir_, "WORK_SECONDS=" + std::to_string(work_seconds),
             BinDir() + "/meshrun", "--nnodes=2:" + std::to_string(kNodes),
             "--nproc-per-node=" + std::to_string(kNproc), "--rdzv-backend=c10d",
             "--rdzv-endpoint=" + endpoint_, "--rdzv-id=partition", "--max-restarts=3",
             "--rdzv-conf=join_timeout=60,last_call_timeout=2,keep_alive_interval=" +
                 std::to_string(kKeepAliveSeconds) +
                 ",keep_alive_max_attempt=" + std::to_string(kKeepAliveAttempts),
             "--shutdown-timeout=2", "--no-python", "/bin/sh", dir_ + "/worker.sh"}),
        /*merge_stderr=*/true));
  }

  // Pids recorded by the workers of `node` in its attempt `attempt`.
  std::vector<pid_t> WorkerPids(int node, int attempt) {
    std::ifstream in(dir_ + "/node" + std::to_string(node) + ".pids");
    std::vector<pid_t> all, pids;
    pid_t pid;
    while (in >> pid) all.push_back(pid);
    for (size_t i = attempt * kNproc; i < all.size() && i < (attempt + 1u) * kNproc; ++i)
      pids.push_back(all[i]);
    return pids;
  }

  std::unique_ptr<NetnsLab> lab_;
  std::string dir_;
  std::unique_ptr<ChildProcess> daemon_;
  std::string endpoint_;
  std::vector<std::unique_ptr<ChildProcess>> agents_;
};

TEST_F(PartitionTest, CutOffNodeStopsItsWorkersAndTheOthersFinish) {
  StartDaemon();
  ASSERT_FALSE(endpoint_.empty());
  // Long enough for the cut to land in the first attempt; the survivors'
  // second attempt runs it again and then ends.
  constexpr int kWorkSeconds = 30;
  static_assert(kLease + kStopSlack < seconds(kWorkSeconds));
  for (int node = 0; node < kNodes; ++node) StartAgent(node, kWorkSeconds);

  // Every worker of every node is running in attempt 0.
  const auto started_by = std::chrono::steady_clock::now() + seconds(60);
  while (true) {
    int running = 0;
    for (int node = 0; node < kNodes; ++node)
      running += static_cast<int>(WorkerPids(node, 0).size());
    if (running == kNodes * kNproc) break;
    ASSERT_LT(std::chrono::steady_clock::now(), started_by)
        << "workers did not all start; agent 0 said:\n"
        << agents_[0]->ReadAll(milliseconds(100));
    std::this_thread::sleep_for(milliseconds(100));
  }

  constexpr int kCut = 2;
  const auto cut_off_workers = WorkerPids(kCut, 0);
  const auto cut_at = std::chrono::steady_clock::now();
  lab_->Cut(kCut);

  // The cut-off node's workers are gone within its lease (plus the slack).
  for (pid_t pid : cut_off_workers) {
    while (Alive(pid)) {
      ASSERT_LT(std::chrono::steady_clock::now(), cut_at + kLease + kStopSlack)
          << "worker " << pid << " of the cut-off node still runs";
      std::this_thread::sleep_for(milliseconds(50));
    }
  }
  const auto stopped_after = std::chrono::steady_clock::now() - cut_at;
  std::cerr << "cut-off node's workers stopped "
            << std::chrono::duration_cast<milliseconds>(stopped_after).count()
            << " ms after the cut (lease " << kLease.count() << " s)\n";
  // And its agent gives up with a failure exit and says why.
  auto cut_status = agents_[kCut]->Wait(kLease + kStopSlack + seconds(5));
  ASSERT_TRUE(cut_status) << "the cut-off agent did not exit";
  EXPECT_TRUE(WIFEXITED(*cut_status) && WEXITSTATUS(*cut_status) != 0);
  const std::string cut_output = agents_[kCut]->ReadAll(seconds(5));
  EXPECT_NE(cut_output.find("rendezvous daemon"), std::string::npos) << cut_output;

  // The others re-form without it (restart 1) and finish.
  for (int node = 0; node < kNodes; ++node) {
    if (node == kCut) continue;
    auto status = agents_[node]->Wait(seconds(kWorkSeconds + 60));
    ASSERT_TRUE(status) << "survivor " << node << " did not finish";
    EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0)
        << agents_[node]->ReadAll(seconds(5));
    EXPECT_EQ(WorkerPids(node, 1).size(), static_cast<size_t>(kNproc))
        << "survivor " << node << " did not run a second attempt";
  }
  // The cut-off node never trained on in a later attempt.
  EXPECT_TRUE(WorkerPids(kCut, 1).empty());
}

}  // namespace
}  // namespace meshrun
