// The agent's dealings with the daemon (issue 19), end to end: the real
// `meshrun` and `meshrun-rdzvd` on 127.0.0.1, a daemon that is stopped, an
// agent that is stopped past its lease, endpoints where no daemon answers.
// Workers are `sh -c` one-liners; every process is ended by its pid.

#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <regex>
#include <thread>

#include "rendezvous/client/rendezvous_client.h"
#include "tests/support/child_process.h"
#include "tests/support/temp_dir.h"
#include "tests/support/text.h"

namespace meshrun {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using testing::BinDir;
using testing::ChildProcess;
using testing::Count;
using testing::DaemonProcess;
using testing::ExitCode;
using testing::FreePort;
using testing::GoneWithin;
using Clock = std::chrono::steady_clock;

std::unique_ptr<ChildProcess> Launch(std::vector<std::string> args) {
  std::vector<std::string> argv{BinDir() + "/meshrun"};
  argv.insert(argv.end(), args.begin(), args.end());
  return std::make_unique<ChildProcess>(argv, /*merge_stderr=*/true);
}

pid_t PidIn(const std::string& line) {
  std::smatch m;
  if (!std::regex_search(line, m, std::regex("pid=(\\d+)"))) return -1;
  return std::stoi(m[1]);
}

// The run as the daemon reports it.
meshrun::v1::RunStatus RunStatusOf(const std::string& endpoint, const std::string& run) {
  auto channel = grpc::CreateChannel(endpoint, grpc::InsecureChannelCredentials());
  rdzv::RendezvousClient client(channel);
  meshrun::v1::StatusRequest request;
  request.set_run_id(run);
  auto reply = client.Status(request);
  if (!reply.ok() || reply->runs_size() != 1) return {};
  return reply->runs(0);
}

class AgentDaemonTest : public ::testing::Test {
 protected:
  // Orphans (workers of a killed agent) are re-parented to the test, so
  // "gone" can be checked and they are reaped.
  void SetUp() override { prctl(PR_SET_CHILD_SUBREAPER, 1); }
  void TearDown() override {
    while (waitpid(-1, nullptr, WNOHANG) > 0) {
    }
  }
};

// Issue 19 (6): a daemon that does not answer (here SIGSTOPped) must not
// delay the workers' SIGTERM, nor keep meshrun past its shutdown timeout.
TEST_F(AgentDaemonTest, SigtermReachesTheWorkersAtOnceWhileTheDaemonHangs) {
  DaemonProcess daemon;
  auto agent = Launch({"--nnodes=1", "--nproc-per-node=2", "--rdzv-backend=c10d",
                       "--rdzv-endpoint=" + daemon.endpoint(), "--rdzv-id=hung",
                       "--shutdown-timeout=5", "--no-python", "/bin/sh", "-c",
                       "echo pid=$$; exec sleep 60"});
  std::vector<pid_t> workers;
  for (int i = 0; i < 2; ++i) {
    auto line = agent->ReadUntil("pid=", seconds(30));
    ASSERT_TRUE(line) << agent->output();
    workers.push_back(PidIn(*line));
  }
  daemon.process().Signal(SIGSTOP);
  const auto signalled = Clock::now();
  agent->Signal(SIGTERM);
  for (pid_t pid : workers)
    EXPECT_TRUE(GoneWithin(pid, milliseconds(1500)))
        << "worker " << pid << " still runs 1.5 s after SIGTERM to meshrun";
  auto status = agent->Wait(seconds(20));
  const auto took = Clock::now() - signalled;
  daemon.process().Signal(SIGCONT);
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 128 + SIGTERM)
      << agent->ReadAll(seconds(5));
  EXPECT_LT(took, seconds(5)) << "meshrun took longer than its --shutdown-timeout";
}

// Issue 19 (2): an agent stopped with SIGTERM leaves the run and never
// comes back as a new node while its workers are still stopping.
TEST_F(AgentDaemonTest, AnAgentThatLeftNeverJoinsAgain) {
  DaemonProcess daemon;
  // Workers that ignore SIGTERM: the leaving agent stops them for its whole
  // --shutdown-timeout, ample time to re-join if it were going to.
  const std::string worker = "trap '' TERM; echo pid=$$ $MESHRUN_STORE_PREFIX; sleep 60";
  std::vector<std::unique_ptr<ChildProcess>> agents;
  for (int node = 0; node < 2; ++node)
    agents.push_back(
        Launch({"--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d",
                "--rdzv-endpoint=" + daemon.endpoint(), "--rdzv-id=leaver",
                "--node-rank=" + std::to_string(node), "--shutdown-timeout=3",
                "--no-python", "/bin/sh", "-c", worker}));
  for (auto& agent : agents) ASSERT_TRUE(agent->ReadUntil("pid=", seconds(30)));
  agents[0]->Signal(SIGTERM);
  EXPECT_EQ(ExitCode(*agents[0], seconds(20)), 128 + SIGTERM) << agents[0]->output();
  // The survivor re-formed once, because a node left, and waits alone.
  ASSERT_TRUE(agents[1]->ReadUntil("re-forming into round 2", seconds(10)))
      << agents[1]->output();
  const auto run = RunStatusOf(daemon.endpoint(), "leaver");
  EXPECT_EQ(run.round(), 2u) << run.DebugString();
  EXPECT_EQ(run.state(), "gathering") << run.DebugString();
  agents[1]->Signal(SIGTERM);
  EXPECT_EQ(ExitCode(*agents[1], seconds(20)), 128 + SIGTERM);
  const std::string& survivor = agents[1]->output();
  EXPECT_EQ(survivor.find("round 2: group rank"), std::string::npos) << survivor;
  EXPECT_EQ(Count(survivor, "re-forming into round"), 1u) << survivor;
  // Issue 19 (15): the reason in words, not REFORM_NODE_LEFT.
  EXPECT_NE(survivor.find("re-forming into round 2: a node left"), std::string::npos)
      << survivor;
}

// Issue 19 (13, 9): an agent frozen past its lease is expelled by the daemon;
// on waking it finds the daemon there, stops its workers and joins again
// (counted as a restart), and the job goes on. Its workers' MASTER_PORT is
// its agent's store relay both times (the relay outlives the rounds).
TEST_F(AgentDaemonTest, AnAgentExpelledWhileStalledRejoinsAndTheJobGoesOn) {
  DaemonProcess daemon;
  // Round 1's workers wait; later rounds' finish. The round is the number
  // that ends the store prefix.
  const std::string worker =
      "round=${MESHRUN_STORE_PREFIX##*r}; "
      "echo pid=$$ port=$MASTER_PORT round=$round restarts=$TORCHELASTIC_RESTART_COUNT; "
      "if [ $round = 1 ]; then exec sleep 60; fi; echo finished";
  std::vector<std::unique_ptr<ChildProcess>> agents;
  for (int node = 0; node < 2; ++node)
    agents.push_back(Launch({"--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d",
                             "--rdzv-endpoint=" + daemon.endpoint(), "--rdzv-id=stalled",
                             "--node-rank=" + std::to_string(node), "--max-restarts=3",
                             "--rdzv-conf=keep_alive_interval=1,keep_alive_max_attempt=2",
                             "--no-python", "/bin/sh", "-c", worker}));
  auto first = agents[0]->ReadUntil("round=1", seconds(30));
  ASSERT_TRUE(first) << agents[0]->output();
  ASSERT_TRUE(agents[1]->ReadUntil("round=1", seconds(30)));
  const auto stopped = Clock::now();
  agents[0]->Signal(SIGSTOP);
  // The daemon expels it after its lease (2 s) and the other node re-forms.
  auto reform = agents[1]->ReadUntil("re-forming into round", seconds(30));
  if (!reform) agents[0]->Signal(SIGCONT);
  ASSERT_TRUE(reform) << agents[1]->output();
  // The stall itself, as long as a swap storm's: well past the lease.
  std::this_thread::sleep_until(stopped + seconds(6));
  agents[0]->Signal(SIGCONT);
  for (auto& agent : agents)
    EXPECT_EQ(ExitCode(*agent, seconds(60)), 0) << agent->output();
  const std::string& woken = agents[0]->output();
  EXPECT_NE(woken.find("expelled"), std::string::npos) << woken;
  EXPECT_EQ(woken.find("for up to -"), std::string::npos) << woken;
  EXPECT_EQ(woken.find("lost the rendezvous daemon"), std::string::npos) << woken;
  EXPECT_EQ(Count(woken, "finished"), 1u) << woken;
  // Its return restarted its workers: one restart of the budget.
  EXPECT_TRUE(std::regex_search(woken, std::regex("round=[2-9] restarts=1\n"))) << woken;
  // Both rounds' workers reach the same store: their agent's relay.
  const std::string daemon_port =
      daemon.endpoint().substr(daemon.endpoint().rfind(':') + 1);
  std::smatch before, after;
  ASSERT_TRUE(std::regex_search(*first, before, std::regex("port=(\\d+)")));
  ASSERT_TRUE(std::regex_search(woken, after, std::regex("port=(\\d+) round=[2-9]")))
      << woken;
  EXPECT_EQ(before[1], after[1]) << woken;
  EXPECT_NE(after[1], daemon_port) << woken;
}

// Issue 44 (5): a TCP reset of the agents' connections to the daemon (their
// Join streams among them) mid-run is not a node that left: the daemon keeps
// both nodes for their lease, their agents re-open the streams and resume
// the round, and no worker restarts.
TEST_F(AgentDaemonTest, AResetRendezvousStreamRestartsNoWorker) {
  if (geteuid() != 0) GTEST_SKIP() << "ss -K needs root (CAP_NET_ADMIN)";
  DaemonProcess daemon;
  testing::TempDir dir("stream-reset");
  const std::string go = dir / "go";
  // Workers run until the test says go (a file), then finish.
  const std::string worker =
      "echo pid=$$ restarts=$TORCHELASTIC_RESTART_COUNT; "
      "while [ ! -e " +
      go +
      " ]; do sleep 0.05; done; "
      "echo finished";
  std::vector<std::unique_ptr<ChildProcess>> agents;
  for (int node = 0; node < 2; ++node)
    agents.push_back(Launch({"--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d",
                             "--rdzv-endpoint=" + daemon.endpoint(), "--rdzv-id=reset",
                             "--node-rank=" + std::to_string(node), "--max-restarts=3",
                             "--no-python", "/bin/sh", "-c", worker}));
  for (auto& agent : agents)
    ASSERT_TRUE(agent->ReadUntil("pid=", seconds(30))) << agent->output();
  const std::string port = daemon.endpoint().substr(daemon.endpoint().rfind(':') + 1);
  // Every connection to the daemon's port: each agent's Join stream, its
  // heartbeats and its store relay's link. The kernel sends the daemon a
  // reset for each.
  ChildProcess ss(
      {"/usr/bin/env", "ss", "-K", "dst", "127.0.0.1", "dport", "=", ":" + port},
      /*merge_stderr=*/true);
  ASSERT_EQ(ExitCode(ss), 0) << ss.output();
  ASSERT_NE(ss.output().find("ESTAB"), std::string::npos) << ss.output();
  for (auto& agent : agents) {
    // The Join stream broke, and was re-opened.
    ASSERT_TRUE(agent->ReadUntil("lost the rendezvous daemon", seconds(30)))
        << agent->output();
    ASSERT_TRUE(agent->ReadUntil("reconnected to the rendezvous daemon", seconds(30)))
        << agent->output();
  }
  dir.Write("go", "");
  for (auto& agent : agents) {
    EXPECT_EQ(ExitCode(*agent, seconds(60)), 0) << agent->output();
    const std::string& out = agent->output();
    EXPECT_EQ(Count(out, "pid="), 1u) << out;
    EXPECT_NE(out.find("restarts=0"), std::string::npos) << out;
    EXPECT_EQ(Count(out, "finished"), 1u) << out;
    EXPECT_EQ(out.find("re-forming"), std::string::npos) << out;
  }
  const auto run = RunStatusOf(daemon.endpoint(), "reset");
  EXPECT_EQ(run.restart_count(), 0u) << run.DebugString();
  EXPECT_EQ(run.round(), 1u) << run.DebugString();
}

// Issue 19 (9): a round the daemon refused to resume stays refused only
// until the next assignment. A daemon restarted twice without its state runs
// the run from round 1 each time: each restart must restart the workers (the
// second time too, though the round number is the refused one again).
TEST_F(AgentDaemonTest, EachDaemonRestartWithoutStateRestartsTheWorkers) {
  auto daemon = std::make_unique<DaemonProcess>();
  const std::string endpoint = daemon->endpoint();
  const std::string port = endpoint.substr(endpoint.rfind(':') + 1);
  auto agent = Launch({"--nnodes=1", "--rdzv-backend=c10d", "--rdzv-endpoint=" + endpoint,
                       "--rdzv-id=again", "--no-python", "/bin/sh", "-c",
                       "echo pid=$$ started; exec sleep 60"});
  ASSERT_TRUE(agent->ReadUntil("started", seconds(30))) << agent->output();
  for (int restart = 1; restart <= 2; ++restart) {
    daemon->process().Signal(SIGKILL);
    ASSERT_TRUE(daemon->process().Wait(seconds(10)));
    daemon.reset();
    daemon = std::make_unique<DaemonProcess>(std::vector<std::string>{"--port", port});
    ASSERT_TRUE(agent->ReadUntil("started", seconds(30)))
        << "no new workers after daemon restart " << restart << "\n"
        << agent->output();
  }
  agent->Signal(SIGTERM);
  EXPECT_EQ(ExitCode(*agent, seconds(20)), 128 + SIGTERM) << agent->output();
  EXPECT_EQ(Count(agent->output(), "cannot resume round 1"), 2u) << agent->output();
}

// A tiny server on 127.0.0.1:0 that answers every connection with `reply`
// (as soon as the peer has sent something), then closes it.
class ReplyingServer {
 public:
  explicit ReplyingServer(std::string reply) : reply_(std::move(reply)) {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    listen(fd_, 16);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { Serve(); });
  }
  ~ReplyingServer() {
    stop_ = true;
    thread_.join();
    close(fd_);
  }
  std::string endpoint() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  void Serve() {
    while (!stop_) {
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, 50) <= 0) continue;
      int client = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (client < 0) continue;
      char buffer[512];
      pollfd c{client, POLLIN, 0};
      if (poll(&c, 1, 2000) > 0 && recv(client, buffer, sizeof buffer, 0) > 0)
        send(client, reply_.data(), reply_.size(), MSG_NOSIGNAL);
      close(client);
    }
  }

  std::string reply_;
  int fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// Issue 19 (14): a web server where the daemon should be cannot turn into
// one: meshrun says so in one line and exits 1 at once.
TEST_F(AgentDaemonTest, AnHttpServerOnTheEndpointFailsFast) {
  ReplyingServer http("HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n");
  const auto started = Clock::now();
  auto agent =
      Launch({"--nnodes=1", "--rdzv-backend=c10d", "--rdzv-endpoint=" + http.endpoint(),
              "--rdzv-conf=is_host=false", "--no-python", "/bin/true"});
  EXPECT_EQ(ExitCode(*agent, seconds(30)), 1) << agent->output();
  EXPECT_LT(Clock::now() - started, seconds(15)) << agent->output();
  EXPECT_NE(agent->output().find("meshrun: cannot use the rendezvous endpoint " +
                                 http.endpoint() + ": an HTTP/1 server answers"),
            std::string::npos)
      << agent->output();
  EXPECT_EQ(Count(agent->output(), "meshrun: "), 1u) << agent->output();
}

// Issue 19 (14): a refused port and an unresolvable host are named at once
// while the agent waits for the daemon to appear.
TEST_F(AgentDaemonTest, ARefusedPortOrUnknownHostIsNamedAtOnce) {
  const std::string refused = "127.0.0.1:" + std::to_string(FreePort());
  for (const auto& [endpoint, cause] : std::vector<std::pair<std::string, std::string>>{
           {refused, "connection refused: nothing listens on " + refused},
           {"no-such-host.invalid:29400", "cannot resolve host no-such-host.invalid"}}) {
    auto agent =
        Launch({"--nnodes=1", "--rdzv-backend=c10d", "--rdzv-endpoint=" + endpoint,
                "--rdzv-conf=is_host=false", "--no-python", "/bin/true"});
    EXPECT_TRUE(agent->ReadUntil(cause, seconds(15))) << agent->output();
    agent->Signal(SIGTERM);
    EXPECT_EQ(ExitCode(*agent, seconds(10)), 128 + SIGTERM) << agent->output();
  }
}

// Issue 19 (14): an agent waiting for the other nodes says how many are in
// and for how long it may still wait.
TEST_F(AgentDaemonTest, AnAgentWaitingForOtherNodesSaysSo) {
  DaemonProcess daemon;
  auto agent = Launch({"--nnodes=2", "--rdzv-backend=c10d",
                       "--rdzv-endpoint=" + daemon.endpoint(), "--rdzv-id=alone",
                       "--rdzv-conf=join_timeout=300", "--no-python", "/bin/true"});
  auto line = agent->ReadUntil("nodes joined round", seconds(15));
  ASSERT_TRUE(line) << agent->output();
  EXPECT_TRUE(std::regex_search(
      *line,
      std::regex("1 of 2 nodes joined round 1, waiting up to (5m00|4m5\\d)s more")))
      << *line;
  agent->Signal(SIGTERM);
  EXPECT_EQ(ExitCode(*agent, seconds(10)), 128 + SIGTERM) << agent->output();
}

}  // namespace
}  // namespace meshrun
