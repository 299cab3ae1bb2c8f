// Workers use the daemon's TCPStore front-end as torchrun 2's agent store
// (issue 15): an unchanged env:// DDP script (agent_store_train.py) trains
// under meshrun with TORCHELASTIC_USE_AGENT_STORE=True and MASTER_PORT at the
// daemon (static: --master-port), and no worker serves a store of its own.
// With a token the daemon does not serve stock clients, and rank 0 hosts a
// TCPStore as before; that case also shows the listener check would notice.

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/types.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/child_process.h"
#include "tests/support/temp_dir.h"

namespace meshrun {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using testing::BinDir;
using testing::ChildProcess;
using testing::DaemonProcess;
using testing::ExitCode;
using testing::FreePort;
using testing::TempDir;
using Env = std::map<std::string, std::string>;

const std::string kScript =
    std::string(MESHRUN_SOURCE_DIR) + "/tests/e2e/agent_store_train.py";

std::unique_ptr<ChildProcess> Meshrun(std::vector<std::string> args) {
  std::vector<std::string> argv{"/usr/bin/env", "PYTHON_EXEC=" MESHRUN_PYTHON,
                                BinDir() + "/meshrun", "--monitor-interval=0.1"};
  argv.insert(argv.end(), args.begin(), args.end());
  return std::make_unique<ChildProcess>(argv, /*merge_stderr=*/true);
}

// What agent_store_train.py wrote for `rank` on attempt `restart`; empty if
// nothing.
Env ReadEnv(const TempDir& dir, int rank, int restart = 0) {
  Env env;
  std::ifstream in(
      dir / ("job." + std::to_string(rank) + ".a" + std::to_string(restart) + ".env"));
  for (std::string line; std::getline(in, line);) {
    size_t eq = line.find('=');
    if (eq != std::string::npos) env[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return env;
}

// The ports the worker listened on ("_LISTEN": comma-separated).
std::vector<std::string> Listening(const Env& env) {
  std::vector<std::string> ports;
  std::istringstream in(env.count("_LISTEN") ? env.at("_LISTEN") : "");
  for (std::string port; std::getline(in, port, ',');)
    if (!port.empty()) ports.push_back(port);
  return ports;
}

std::string PortOf(const std::string& endpoint) {
  return endpoint.substr(endpoint.rfind(':') + 1);
}

// Every rank reached the daemon's store at `port`: the agent store flag,
// MASTER_* there, no worker listening on it, and no rank listening on more
// ports than another (rank 0 serving a TCPStore would add its listeners; the
// rest are Gloo's, the same on every rank).
void ExpectAgentStore(const TempDir& dir, int world, const std::string& port,
                      int restart = 0) {
  size_t listeners = 0;
  for (int rank = 0; rank < world; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank) + " attempt " + std::to_string(restart));
    Env env = ReadEnv(dir, rank, restart);
    ASSERT_FALSE(env.empty());
    EXPECT_EQ(env["TORCHELASTIC_USE_AGENT_STORE"], "True");
    EXPECT_EQ(env["TORCHELASTIC_RESTART_COUNT"], std::to_string(restart));
    EXPECT_EQ(env["MASTER_ADDR"], "127.0.0.1");
    EXPECT_EQ(env["MASTER_PORT"], port);
    std::vector<std::string> ports = Listening(env);
    for (const std::string& listened : ports) EXPECT_NE(listened, port) << env["_LISTEN"];
    if (rank == 0) listeners = ports.size();
    EXPECT_EQ(ports.size(), listeners) << env["_LISTEN"];
  }
}

// The key a worker set through its own TCPStore client is in the round's
// namespace at the daemon (MESHRUN_STORE_PREFIX), read back over gRPC. c10d's
// client puts "/" before every key it sends.
void ExpectKeyAtDaemon(const TempDir& dir, const std::string& endpoint, int rank,
                       int restart) {
  Env env = ReadEnv(dir, rank, restart);
  ASSERT_FALSE(env.empty());
  ChildProcess get(
      {BinDir() + "/store_tool", endpoint, env["MESHRUN_STORE_PREFIX"], "get",
       "/trained/" + std::to_string(restart) + "/" + std::to_string(rank), "2000"},
      /*merge_stderr=*/true);
  EXPECT_EQ(ExitCode(get, seconds(20)), 0) << get.output();
  EXPECT_NE(get.output().find("value=1"), std::string::npos) << get.output();
}

// --rdzv-backend=static (torchrun's default with --nnodes above 1): node
// rank 0 hosts the daemon on --master-port, and that is every worker's
// MASTER_PORT, as torchrun 2's.
TEST(AgentStoreTest, StaticWorkersUseTheDaemonOnMasterPort) {
  TempDir dir("agent-store-static");
  const std::string port = std::to_string(FreePort());
  std::vector<std::unique_ptr<ChildProcess>> nodes;
  for (int node = 0; node < 2; ++node) {
    nodes.push_back(Meshrun({"--nnodes=2", "--node-rank=" + std::to_string(node),
                             "--nproc-per-node=1", "--master-addr=127.0.0.1",
                             "--master-port=" + port, kScript, dir.path(), "job"}));
  }
  for (auto& node : nodes) ASSERT_EQ(ExitCode(*node, seconds(180)), 0) << node->output();
  ExpectAgentStore(dir, 2, port);
}

// --rdzv-backend=c10d at a meshrun-rdzvd started on its own: its port is the
// workers' MASTER_PORT, and what they store lands in the round's namespace.
TEST(AgentStoreTest, DynamicWorkersUseTheSeparateDaemon) {
  TempDir dir("agent-store-dynamic");
  DaemonProcess daemon;
  std::vector<std::unique_ptr<ChildProcess>> agents;
  for (int node = 0; node < 2; ++node) {
    agents.push_back(Meshrun({"--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d",
                              "--rdzv-endpoint=" + daemon.endpoint(), "--rdzv-id=store",
                              kScript, dir.path(), "job"}));
  }
  for (auto& agent : agents)
    ASSERT_EQ(ExitCode(*agent, seconds(180)), 0) << agent->output();
  ExpectAgentStore(dir, 2, PortOf(daemon.endpoint()));
  for (int rank = 0; rank < 2; ++rank) ExpectKeyAtDaemon(dir, daemon.endpoint(), rank, 0);
}

// Rank 0 SIGKILLed mid-training: the job restarts (--max-restarts=1), the
// new workers re-initialise through the same daemon's store (attempt 1's
// prefix in the new round's namespace) and the job exits 0.
TEST(AgentStoreTest, RankZeroKilledMidTrainingRestartsThroughTheSameStore) {
  TempDir dir("agent-store-restart");
  DaemonProcess daemon;
  std::vector<std::unique_ptr<ChildProcess>> agents;
  for (int node = 0; node < 2; ++node) {
    agents.push_back(
        Meshrun({"--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d",
                 "--rdzv-endpoint=" + daemon.endpoint(), "--rdzv-id=restart",
                 "--max-restarts=1", kScript, dir.path(), "job", "--stall-rank", "0"}));
  }
  // Rank 0 writes its pid once it is training; kill it by that pid.
  const std::string pid_file = dir / "job.stalled.pid";
  pid_t victim = 0;
  for (auto deadline = std::chrono::steady_clock::now() + seconds(120);
       victim == 0 && std::chrono::steady_clock::now() < deadline;) {
    std::ifstream in(pid_file);
    if (!(in >> victim)) {
      victim = 0;
      std::this_thread::sleep_for(milliseconds(100));
    }
  }
  ASSERT_GT(victim, 0) << "rank 0 never trained\n"
                       << agents[0]->output() << agents[1]->output();
  ASSERT_TRUE(testing::ProcessAlive(victim));
  ASSERT_EQ(kill(victim, SIGKILL), 0);

  for (auto& agent : agents)
    ASSERT_EQ(ExitCode(*agent, seconds(180)), 0) << agent->output();
  EXPECT_TRUE(ReadEnv(dir, 0, 0).empty());  // attempt 0 never finished
  ExpectAgentStore(dir, 2, PortOf(daemon.endpoint()), /*restart=*/1);
  for (int rank = 0; rank < 2; ++rank) ExpectKeyAtDaemon(dir, daemon.endpoint(), rank, 1);
}

// With a token, stock TCPStore clients cannot reach the daemon: the workers
// get TORCHELASTIC_USE_AGENT_STORE=False, and rank 0 serves a TCPStore on the
// MASTER_PORT its agent picked (which the listener check above would catch).
// Rank 0 served the workers' store on the port its agent offered (the
// fallback when the daemon is not their store).
void ExpectRankZeroStore(const TempDir& dir) {
  Env rank0 = ReadEnv(dir, 0), rank1 = ReadEnv(dir, 1);
  ASSERT_FALSE(rank0.empty());
  ASSERT_FALSE(rank1.empty());
  for (Env* env : {&rank0, &rank1}) {
    EXPECT_EQ((*env)["TORCHELASTIC_USE_AGENT_STORE"], "False");
    EXPECT_EQ((*env)["MASTER_PORT"], rank0["MASTER_PORT"]);
    EXPECT_NE((*env)["MASTER_PORT"], PortOf((*env)["MESHRUN_STORE_ENDPOINT"]));
  }
  std::vector<std::string> ports0 = Listening(rank0), ports1 = Listening(rank1);
  EXPECT_NE(std::find(ports0.begin(), ports0.end(), rank0["MASTER_PORT"]), ports0.end())
      << rank0["_LISTEN"];
  EXPECT_GT(ports0.size(), ports1.size())
      << rank0["_LISTEN"] << " / " << rank1["_LISTEN"];
}

TEST(AgentStoreTest, WithATokenRankZeroServesTheStore) {
  TempDir dir("agent-store-token");
  const std::string token_file = dir.Write("token", "s3cret-token-for-agent-store\n");
  auto run = Meshrun({"--standalone", "--nproc-per-node=2", "--token-file", token_file,
                      kScript, dir.path(), "job"});
  ASSERT_EQ(ExitCode(*run, seconds(180)), 0) << run->output();
  ExpectRankZeroStore(dir);
}

// A separately started daemon that does not serve the TCPStore protocol
// (--tcpstore=off) says so in its round assignments: workers fall back.
TEST(AgentStoreTest, ADaemonWithoutTheProtocolSaysSoAndRankZeroServesTheStore) {
  TempDir dir("agent-store-off");
  DaemonProcess daemon({"--tcpstore", "off"});
  std::vector<std::unique_ptr<ChildProcess>> agents;
  for (int node = 0; node < 2; ++node) {
    agents.push_back(Meshrun({"--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d",
                              "--rdzv-endpoint=" + daemon.endpoint(), "--rdzv-id=off",
                              kScript, dir.path(), "job"}));
  }
  for (auto& agent : agents)
    ASSERT_EQ(ExitCode(*agent, seconds(180)), 0) << agent->output();
  ExpectRankZeroStore(dir);
}

// A shared daemon without --tcpstore-run serves the TCPStore clients of the
// first run in progress; a second run starting meanwhile is told so at its
// round (serves_tcpstore false), and its rank 0 serves its store. Before,
// the second run's workers were refused by the daemon (two runs, and a stock
// client cannot say which is its own).
TEST(AgentStoreTest, ASecondRunOnASharedDaemonFallsBackToRankZerosStore) {
  TempDir first_dir("agent-store-first"), second_dir("agent-store-second");
  DaemonProcess daemon;
  auto first = Meshrun({"--nnodes=1", "--nproc-per-node=1", "--rdzv-backend=c10d",
                        "--rdzv-endpoint=" + daemon.endpoint(), "--rdzv-id=first",
                        kScript, first_dir.path(), "job", "--stall-rank", "0"});
  // The first run's worker writes its pid once it trains, and keeps training.
  const std::string pid_file = first_dir / "job.stalled.pid";
  bool training = false;
  for (auto deadline = std::chrono::steady_clock::now() + seconds(120);
       !training && std::chrono::steady_clock::now() < deadline;) {
    training = std::ifstream(pid_file).good();
    if (!training) std::this_thread::sleep_for(milliseconds(100));
  }
  ASSERT_TRUE(training) << "the first run never trained\n" << first->output();

  auto second = Meshrun({"--nnodes=1", "--nproc-per-node=2", "--rdzv-backend=c10d",
                         "--rdzv-endpoint=" + daemon.endpoint(), "--rdzv-id=second",
                         kScript, second_dir.path(), "job"});
  ASSERT_EQ(ExitCode(*second, seconds(180)), 0) << second->output();
  ExpectRankZeroStore(second_dir);

  // The first run was served throughout: still running, ended here by pid.
  ASSERT_TRUE(testing::ProcessAlive(first->pid())) << first->output();
  ASSERT_EQ(kill(first->pid(), SIGTERM), 0);
  EXPECT_NE(ExitCode(*first, seconds(60)), -1) << first->output();
}

}  // namespace
}  // namespace meshrun
