// Workers' TCPStore is torchrun 2's agent store (issues 15, 28): an
// unchanged env:// DDP script (agent_store_train.py) trains under meshrun
// with TORCHELASTIC_USE_AGENT_STORE=True and no worker serving a store of its
// own. With --rdzv-backend=static MASTER_PORT is the daemon on --master-port;
// with c10d it is the worker's own agent's store relay, which carries the
// requests into the round's namespace at the daemon: also with a token, a
// daemon without the TCPStore protocol, and a second run on a shared daemon.

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/types.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <map>
#include <memory>
#include <set>
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

// The ports of the agents' store relays, from their log lines ("serving the
// workers' store on 127.0.0.1:PORT, relayed to ...").
std::set<std::string> RelayPorts(
    const std::vector<std::unique_ptr<ChildProcess>>& agents) {
  const std::string needle = "serving the workers' store on 127.0.0.1:";
  std::set<std::string> ports;
  for (const auto& agent : agents) {
    std::istringstream lines(agent->output());
    for (std::string line; std::getline(lines, line);) {
      size_t at = line.find(needle);
      if (at == std::string::npos) continue;
      std::string rest = line.substr(at + needle.size());
      ports.insert(rest.substr(0, rest.find(',')));
    }
  }
  return ports;
}

// Every rank has the agent store flag and MASTER_* at `port` (or, when
// `port` is empty, at one of `relays` that its node's ranks share and no
// other node's do); no worker listens on it, and no rank listens on more
// ports than another (a rank serving a TCPStore would add its listeners; the
// rest are Gloo's, the same on every rank).
void ExpectWorkerStore(const TempDir& dir, int world, const std::string& port,
                       const std::set<std::string>& relays = {}, int restart = 0) {
  size_t listeners = 0;
  std::map<std::string, std::string> port_of_node;  // GROUP_RANK -> MASTER_PORT
  for (int rank = 0; rank < world; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank) + " attempt " + std::to_string(restart));
    Env env = ReadEnv(dir, rank, restart);
    ASSERT_FALSE(env.empty());
    EXPECT_EQ(env["TORCHELASTIC_USE_AGENT_STORE"], "True");
    EXPECT_EQ(env["TORCHELASTIC_RESTART_COUNT"], std::to_string(restart));
    EXPECT_EQ(env["MASTER_ADDR"], "127.0.0.1");
    const std::string master_port = env["MASTER_PORT"];
    if (!port.empty()) {
      EXPECT_EQ(master_port, port);
    } else {
      EXPECT_EQ(relays.count(master_port), 1u) << master_port;
      EXPECT_NE(master_port, PortOf(env["MESHRUN_STORE_ENDPOINT"]));
      auto [node, inserted] = port_of_node.emplace(env["GROUP_RANK"], master_port);
      EXPECT_EQ(node->second, master_port) << "node " << env["GROUP_RANK"];
    }
    std::vector<std::string> ports = Listening(env);
    for (const std::string& listened : ports)
      EXPECT_NE(listened, master_port) << env["_LISTEN"];
    if (rank == 0) listeners = ports.size();
    EXPECT_EQ(ports.size(), listeners) << env["_LISTEN"];
  }
  // One relay a node, each its own.
  std::set<std::string> distinct;
  for (const auto& [node, node_port] : port_of_node) distinct.insert(node_port);
  EXPECT_EQ(distinct.size(), port_of_node.size());
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
  ExpectWorkerStore(dir, 2, port);
}

// --rdzv-backend=c10d at a meshrun-rdzvd started on its own: each node's
// workers get their agent's relay as MASTER_PORT (never the daemon's port;
// the same for the ranks of one node, another for the other node), and what
// they store lands in the round's namespace at the daemon.
TEST(AgentStoreTest, DynamicWorkersUseTheirAgentsRelayIntoTheRoundsNamespace) {
  TempDir dir("agent-store-dynamic");
  DaemonProcess daemon;
  std::vector<std::unique_ptr<ChildProcess>> agents;
  for (int node = 0; node < 2; ++node) {
    agents.push_back(Meshrun({"--nnodes=2", "--nproc-per-node=2", "--rdzv-backend=c10d",
                              "--rdzv-endpoint=" + daemon.endpoint(), "--rdzv-id=store",
                              kScript, dir.path(), "job"}));
  }
  for (auto& agent : agents)
    ASSERT_EQ(ExitCode(*agent, seconds(180)), 0) << agent->output();
  const std::set<std::string> relays = RelayPorts(agents);
  ASSERT_EQ(relays.size(), 2u) << agents[0]->output() << agents[1]->output();
  EXPECT_EQ(relays.count(PortOf(daemon.endpoint())), 0u);
  ExpectWorkerStore(dir, 4, "", relays);
  for (int rank = 0; rank < 4; ++rank) ExpectKeyAtDaemon(dir, daemon.endpoint(), rank, 0);
}

// --worker-store=daemon: the workers get the daemon's own port with c10d
// too (it serves this run to stock clients: no token, the only run), and
// no agent serves a relay.
TEST(AgentStoreTest, WorkerStoreDaemonGivesTheDaemonsPortWithC10d) {
  TempDir dir("agent-store-daemon");
  DaemonProcess daemon;
  std::vector<std::unique_ptr<ChildProcess>> agents;
  for (int node = 0; node < 2; ++node) {
    agents.push_back(Meshrun({"--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d",
                              "--rdzv-endpoint=" + daemon.endpoint(), "--rdzv-id=direct",
                              "--worker-store=daemon", kScript, dir.path(), "job"}));
  }
  for (auto& agent : agents)
    ASSERT_EQ(ExitCode(*agent, seconds(180)), 0) << agent->output();
  EXPECT_TRUE(RelayPorts(agents).empty()) << agents[0]->output();
  ExpectWorkerStore(dir, 2, PortOf(daemon.endpoint()));
  for (int rank = 0; rank < 2; ++rank) ExpectKeyAtDaemon(dir, daemon.endpoint(), rank, 0);
}

// Rank 0 SIGKILLed mid-training: the job restarts (--max-restarts=1), the
// new workers re-initialise through the same relays (the new round's
// namespace at the same daemon) and the job exits 0.
TEST(AgentStoreTest, RankZeroKilledMidTrainingRestartsThroughTheSameRelay) {
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
  // One relay an agent, kept across the restart.
  const std::set<std::string> relays = RelayPorts(agents);
  ASSERT_EQ(relays.size(), 2u) << agents[0]->output() << agents[1]->output();
  ExpectWorkerStore(dir, 2, "", relays, /*restart=*/1);
  for (int rank = 0; rank < 2; ++rank) ExpectKeyAtDaemon(dir, daemon.endpoint(), rank, 1);
}

// With a token a stock TCPStore client cannot reach the daemon (--standalone
// hosts one with the token): the workers still get the agent store, their
// agent's relay, which carries the token; no rank serves a store.
TEST(AgentStoreTest, WithATokenWorkersUseTheRelayAndNoRankServesAStore) {
  TempDir dir("agent-store-token");
  const std::string token_file = dir.Write("token", "s3cret-token-for-agent-store\n");
  std::vector<std::unique_ptr<ChildProcess>> runs;
  runs.push_back(Meshrun({"--standalone", "--nproc-per-node=2", "--token-file",
                          token_file, kScript, dir.path(), "job"}));
  ASSERT_EQ(ExitCode(*runs[0], seconds(180)), 0) << runs[0]->output();
  const std::set<std::string> relays = RelayPorts(runs);
  ASSERT_EQ(relays.size(), 1u) << runs[0]->output();
  ExpectWorkerStore(dir, 2, "", relays);
}

// A separately started daemon that does not serve the TCPStore protocol
// (--tcpstore=off): the relays speak it to the workers and gRPC to the
// daemon, so nothing changes for them.
TEST(AgentStoreTest, ADaemonWithoutTheProtocolServesTheWorkersThroughTheRelay) {
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
  const std::set<std::string> relays = RelayPorts(agents);
  ASSERT_EQ(relays.size(), 2u) << agents[0]->output() << agents[1]->output();
  ExpectWorkerStore(dir, 2, "", relays);
  for (int rank = 0; rank < 2; ++rank) ExpectKeyAtDaemon(dir, daemon.endpoint(), rank, 0);
}

// A second run starting on a shared daemon while the first trains: its
// workers use their own agent's relay (the run's namespace, which a stock
// client could not name at the daemon), and the first run goes on.
TEST(AgentStoreTest, ASecondRunOnASharedDaemonUsesItsOwnRelay) {
  TempDir first_dir("agent-store-first"), second_dir("agent-store-second");
  DaemonProcess daemon;
  std::vector<std::unique_ptr<ChildProcess>> first;
  first.push_back(Meshrun({"--nnodes=1", "--nproc-per-node=1", "--rdzv-backend=c10d",
                           "--rdzv-endpoint=" + daemon.endpoint(), "--rdzv-id=first",
                           kScript, first_dir.path(), "job", "--stall-rank", "0"}));
  // The first run's worker writes its pid once it trains, and keeps training.
  const std::string pid_file = first_dir / "job.stalled.pid";
  bool training = false;
  for (auto deadline = std::chrono::steady_clock::now() + seconds(120);
       !training && std::chrono::steady_clock::now() < deadline;) {
    training = std::ifstream(pid_file).good();
    if (!training && !first[0]->ReadLine(milliseconds(100)) && !first[0]->Running())
      break;
  }
  ASSERT_TRUE(training) << "the first run never trained\n" << first[0]->output();

  std::vector<std::unique_ptr<ChildProcess>> second;
  second.push_back(Meshrun({"--nnodes=1", "--nproc-per-node=2", "--rdzv-backend=c10d",
                            "--rdzv-endpoint=" + daemon.endpoint(), "--rdzv-id=second",
                            kScript, second_dir.path(), "job"}));
  ASSERT_EQ(ExitCode(*second[0], seconds(180)), 0) << second[0]->output();
  const std::set<std::string> relays = RelayPorts(second);
  ASSERT_EQ(relays.size(), 1u) << second[0]->output();
  EXPECT_EQ(RelayPorts(first).count(*relays.begin()), 0u);
  ExpectWorkerStore(second_dir, 2, "", relays);
  for (int rank = 0; rank < 2; ++rank)
    ExpectKeyAtDaemon(second_dir, daemon.endpoint(), rank, 0);

  // The first run was served throughout: still running, ended here by pid.
  ASSERT_TRUE(testing::ProcessAlive(first[0]->pid())) << first[0]->output();
  ASSERT_EQ(kill(first[0]->pid(), SIGTERM), 0);
  EXPECT_NE(ExitCode(*first[0], seconds(60)), -1) << first[0]->output();
}

}  // namespace
}  // namespace meshrun
