// meshrun --restart-scope=replica end to end (issue 18, the launcher side):
// the real binary, shell-script workers that record each incarnation's pid
// and environment in a file per rank, and a real daemon (embedded, or a
// separate meshrun-rdzvd for two nodes).

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>

#include <chrono>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "rendezvous/client/store_client.h"
#include "tests/support/child_process.h"
#include "tests/support/temp_dir.h"
#include "tests/support/text.h"

namespace meshrun {
namespace {

using testing::BinDir;
using testing::ChildProcess;
using testing::Count;
using testing::DaemonProcess;
using testing::ExitCode;
using testing::FreePort;
using testing::TempDir;

const std::string kWorker =
    std::string(MESHRUN_SOURCE_DIR) + "/tests/integration/workers/replica_worker.sh";

std::unique_ptr<ChildProcess> Launch(std::vector<std::string> args) {
  std::vector<std::string> argv{"/usr/bin/env", "PYTHON_EXEC=" MESHRUN_PYTHON,
                                BinDir() + "/meshrun"};
  argv.insert(argv.end(), args.begin(), args.end());
  return std::make_unique<ChildProcess>(argv, /*merge_stderr=*/true);
}

// One line a worker incarnation wrote: "start k=v ..." or "end pid=P".
struct Record {
  std::string kind;
  std::map<std::string, std::string> fields;
};

std::vector<Record> Records(const TempDir& dir, int rank) {
  std::vector<Record> records;
  std::ifstream in(dir / std::to_string(rank));
  for (std::string line; std::getline(in, line);) {
    std::istringstream words(line);
    Record record;
    words >> record.kind;
    for (std::string word; words >> word;) {
      const size_t eq = word.find('=');
      record.fields[word.substr(0, eq)] = word.substr(eq + 1);
    }
    records.push_back(std::move(record));
  }
  return records;
}

// The rank started `starts` times, the i-th as replica restart i and run
// restart i, each in a new process, and the last ended successfully.
void ExpectRan(const TempDir& dir, int rank, const std::string& replica, int starts) {
  SCOPED_TRACE("rank " + std::to_string(rank));
  std::vector<Record> records = Records(dir, rank);
  ASSERT_EQ(records.size(), static_cast<size_t>(starts) + 1);
  for (int i = 0; i < starts; ++i) {
    EXPECT_EQ(records[i].kind, "start");
    EXPECT_EQ(records[i].fields["restarts"], std::to_string(i));
    EXPECT_EQ(records[i].fields["count"], std::to_string(i));
    EXPECT_EQ(records[i].fields["replica"], replica);
    EXPECT_EQ(records[i].fields["scope"], "replica");
    if (i > 0) {
      EXPECT_NE(records[i].fields["pid"], records[i - 1].fields["pid"]);
    }
  }
  EXPECT_EQ(records[starts].kind, "end");
  EXPECT_EQ(records[starts].fields["pid"], records[starts - 1].fields["pid"]);
}

class ReplicaRestartTest : public ::testing::Test {
 protected:
  // Orphans are re-parented to the test, so they are reaped.
  void SetUp() override { prctl(PR_SET_CHILD_SUBREAPER, 1); }
  void TearDown() override {
    while (waitpid(-1, nullptr, WNOHANG) > 0) {
    }
  }
};

TEST_F(ReplicaRestartTest, AKilledWorkerRestartsAloneTheOthersKeepTheirPids) {
  TempDir dir;
  auto run =
      Launch({"--standalone", "--nproc-per-node=4", "--restart-scope=replica",
              "--max-restarts=3", "--no-python", kWorker, dir.path(), "2", "kill"});
  ASSERT_EQ(ExitCode(*run), 0) << run->output();
  for (int rank : {0, 1, 3}) ExpectRan(dir, rank, std::to_string(rank), 1);
  ExpectRan(dir, 2, "2", 2);
  EXPECT_EQ(Records(dir, 2)[0].fields["size"], "1");
  EXPECT_EQ(Count(run->output(), "re-forming"), 0u) << run->output();
  EXPECT_NE(run->output().find("restarting replica group 2 alone (restart 1 of 3)"),
            std::string::npos)
      << run->output();
}

// Two groups fail at once: each restarts once, each restart counted.
TEST_F(ReplicaRestartTest, TwoGroupsFailingTogetherRestartEachAlone) {
  TempDir dir;
  auto run =
      Launch({"--standalone", "--nproc-per-node=4", "--restart-scope=replica",
              "--max-restarts=2", "--no-python", kWorker, dir.path(), "1,3", "kill"});
  ASSERT_EQ(ExitCode(*run), 0) << run->output();
  ExpectRan(dir, 0, "0", 1);
  ExpectRan(dir, 2, "2", 1);
  for (int rank : {1, 3}) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    std::vector<Record> records = Records(dir, rank);
    ASSERT_EQ(records.size(), 3u);
    EXPECT_EQ(records[1].fields["restarts"], "1");
    EXPECT_EQ(records[2].kind, "end");
  }
  // Restarts 1 and 2 of the run, in either order.
  std::set<std::string> counts{Records(dir, 1)[1].fields["count"],
                               Records(dir, 3)[1].fields["count"]};
  EXPECT_EQ(counts, (std::set<std::string>{"1", "2"}));
}

TEST_F(ReplicaRestartTest, AReplicaGroupOfTwoRestartsTogether) {
  TempDir dir;
  auto run = Launch({"--standalone", "--nproc-per-node=4", "--restart-scope=replica",
                     "--replica-size=2", "--max-restarts=1", "--no-python", kWorker,
                     dir.path(), "1", "exit:7"});
  ASSERT_EQ(ExitCode(*run), 0) << run->output();
  // Rank 0 was stopped with its group; ranks 2 and 3 never noticed.
  ExpectRan(dir, 0, "0", 2);
  ExpectRan(dir, 1, "0", 2);
  ExpectRan(dir, 2, "1", 1);
  ExpectRan(dir, 3, "1", 1);
  EXPECT_EQ(Records(dir, 3)[0].fields["size"], "2");
}

TEST_F(ReplicaRestartTest, ASpentBudgetFailsTheJobWithTheRootCause) {
  TempDir dir;
  auto run =
      Launch({"--standalone", "--nproc-per-node=4", "--restart-scope=replica",
              "--max-restarts=2", "--no-python", kWorker, dir.path(), "1", "always:5"});
  ASSERT_EQ(ExitCode(*run), 5) << run->output();
  std::vector<Record> failing = Records(dir, 1);
  ASSERT_EQ(failing.size(), 3u) << run->output();
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(failing[i].fields["restarts"], std::to_string(i));
    EXPECT_EQ(failing[i].fields["count"], std::to_string(i));
  }
  // The others ran once and were stopped at the end.
  for (int rank : {0, 2, 3}) EXPECT_EQ(Records(dir, rank).size(), 1u) << rank;
  EXPECT_NE(run->output().find("Root Cause (first observed failure)"), std::string::npos)
      << run->output();
  EXPECT_NE(run->output().find("exitcode  : 5"), std::string::npos) << run->output();
  EXPECT_NE(run->output().find("rank      : 1 (local_rank: 1)"), std::string::npos)
      << run->output();
}

TEST_F(ReplicaRestartTest, BadFlagsExitTwoWithOneLine) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--restart-scope=node"}, "meshrun: --restart-scope: expected job or replica"},
      {{"--restart-scope=replica", "--replica-size=0"},
       "meshrun: --replica-size: expected a positive integer"},
      {{"--replica-size=2", "--nproc-per-node=2"},
       "meshrun: --replica-size: needs --restart-scope=replica"},
      {{"--restart_scope=replica", "--replica_size=3", "--nproc_per_node=4"},
       "meshrun: --replica-size: 3 does not divide --nproc-per-node=4: a replica group "
       "lives within one node"},
  };
  for (const auto& [flags, message] : cases) {
    std::vector<std::string> args = flags;
    args.insert(args.end(), {"--standalone", "--no-python", "/bin/true"});
    auto run = Launch(args);
    EXPECT_EQ(ExitCode(*run), 2) << run->output();
    EXPECT_EQ(run->output().rfind(message, 0), 0u) << run->output();
    EXPECT_EQ(Count(run->output(), "\n"), 1u) << run->output();
  }
}

// The daemon re-forms nobody: the other node's workers run on untouched.
TEST_F(ReplicaRestartTest, TwoNodesOnlyTheFailedReplicaRestarts) {
  TempDir dir;
  DaemonProcess daemon;
  std::vector<std::unique_ptr<ChildProcess>> agents;
  for (int node = 0; node < 2; ++node)
    agents.push_back(
        Launch({"--nnodes=2", "--nproc-per-node=2", "--rdzv-backend=c10d",
                "--rdzv-endpoint=" + daemon.endpoint(), "--rdzv-id=replicas",
                "--node-rank=" + std::to_string(node), "--restart-scope=replica",
                "--max-restarts=1", "--no-python", kWorker, dir.path(), "3", "kill"}));
  for (auto& agent : agents) {
    ASSERT_EQ(ExitCode(*agent), 0) << agent->output();
    EXPECT_EQ(Count(agent->output(), "re-forming"), 0u) << agent->output();
  }
  for (int rank : {0, 1, 2}) ExpectRan(dir, rank, std::to_string(rank), 1);
  ExpectRan(dir, 3, "3", 2);
}

// Nodes of one run that disagree on the restart scope would restart their
// workers differently: whichever joins second is refused, with one line
// naming the difference, while the other waits for a node that agrees.
TEST_F(ReplicaRestartTest, NodesThatDisagreeOnTheRestartScopeAreRefused) {
  TempDir dir;
  DaemonProcess daemon;
  std::vector<std::unique_ptr<ChildProcess>> agents;
  for (int node = 0; node < 2; ++node) {
    std::vector<std::string> args{"--nnodes=2",
                                  "--nproc-per-node=2",
                                  "--rdzv-backend=c10d",
                                  "--rdzv-endpoint=" + daemon.endpoint(),
                                  "--rdzv-id=scopes",
                                  "--node-rank=" + std::to_string(node),
                                  "--no-python",
                                  kWorker,
                                  dir.path(),
                                  "-1",
                                  "ok"};
    if (node == 0) args.insert(args.begin(), "--restart-scope=replica");
    agents.push_back(Launch(args));
  }
  // The refused one ends on its own; the other waits (ended below by pid).
  ChildProcess* refused = nullptr;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (refused == nullptr && std::chrono::steady_clock::now() < deadline) {
    for (auto& agent : agents)
      if (!agent->Running()) refused = agent.get();
    if (refused == nullptr) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_NE(refused, nullptr) << "neither agent was refused";
  const int code = ExitCode(*refused);
  EXPECT_NE(code, 0) << refused->output();
  EXPECT_NE(refused->output().find("restart scope: run has"), std::string::npos)
      << refused->output();
  EXPECT_EQ(Count(refused->output(), "restart scope"), 1u) << refused->output();
  for (auto& agent : agents) EXPECT_TRUE(agent.get() == refused || agent->Running());
  // No worker started anywhere.
  for (int rank = 0; rank < 4; ++rank) EXPECT_TRUE(Records(dir, rank).empty());
}

// The daemon (--state-dir) restarts while a replica group's failure is
// unanswered: the agent retries its report, the group restarts, and the
// daemon counts the failure once (a second count would spend the budget of 1).
TEST_F(ReplicaRestartTest, TheFailureReportOutlivesADaemonRestart) {
  TempDir dir;
  TempDir state;
  const int port = FreePort();
  const std::string endpoint = "127.0.0.1:" + std::to_string(port);
  auto start_daemon = [&] {
    auto daemon = std::make_unique<ChildProcess>(std::vector<std::string>{
        BinDir() + "/meshrun-rdzvd", "--host", "127.0.0.1", "--port",
        std::to_string(port), "--log-level", "warn", "--state-dir", state.path()});
    auto line = daemon->ReadLine(std::chrono::seconds(20));
    EXPECT_TRUE(line && line->find(endpoint) != std::string::npos)
        << line.value_or("<none>");
    return daemon;
  };
  auto daemon = start_daemon();
  const std::string go = dir / "go";
  auto agent = Launch({"--nnodes=1", "--nproc-per-node=2", "--rdzv-backend=c10d",
                       "--rdzv-endpoint=" + endpoint, "--rdzv-id=outlives",
                       "--rdzv-conf=keep_alive_interval=1,keep_alive_max_attempt=30",
                       "--restart-scope=replica", "--max-restarts=1", "--no-python",
                       kWorker, dir.path(), "1", "kill-on:" + go});
  ASSERT_TRUE(agent->ReadUntil("round 1:", std::chrono::seconds(30))) << agent->output();
  // A store write is on disk when answered, and the round with it.
  rdzv::StoreClientOptions options;
  options.target = endpoint;
  options.ns = "outlives/test";
  options.timeout = std::chrono::seconds(20);
  auto store = rdzv::StoreClient::Connect(options);
  ASSERT_TRUE(store.ok()) << store.status();
  ASSERT_TRUE((*store)->Set("persisted", "1").ok());

  daemon->Signal(SIGKILL);
  ASSERT_TRUE(daemon->Wait(std::chrono::seconds(10)));
  std::ofstream(go) << "go\n";
  ASSERT_TRUE(agent->ReadUntil("cannot report the failure of replica group 1",
                               std::chrono::seconds(30)))
      << agent->output();
  daemon = start_daemon();
  ASSERT_EQ(ExitCode(*agent), 0) << agent->output();
  ExpectRan(dir, 0, "0", 1);
  ExpectRan(dir, 1, "1", 2);
}

}  // namespace
}  // namespace meshrun
