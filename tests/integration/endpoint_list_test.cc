// `meshrun --rdzv-endpoint=A,B`: a real 2-node job (two real agents, two
// Python workers each, doing store traffic through their agent's relay and
// the gRPC store client) follows whichever daemon of the list serves. A
// daemon that does not serve refuses connections (a port bound without
// listening stands in for a standby replica): the daemon at A is SIGKILLed
// and one at B takes over from the same --state-dir, as a replica that
// becomes the leader does; the job goes on with the same workers. And a list
// whose first endpoint refuses from the start works from the second.

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "tests/support/child_process.h"
#include "tests/support/temp_dir.h"

namespace meshrun {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using testing::BinDir;
using testing::ChildProcess;
using testing::ExitCode;
using testing::ProcessAlive;
using Clock = std::chrono::steady_clock;

const std::string kWorker =
    std::string(MESHRUN_SOURCE_DIR) + "/tests/integration/workers/follow_worker.py";

class TempDir : public testing::TempDir {
 public:
  TempDir() : testing::TempDir("meshrun-endpoint-list") {}
};

// A port of 127.0.0.1 that refuses connections for as long as this lives:
// bound, so that nothing else takes it, and not listening.
class StandbyPort {
 public:
  StandbyPort() : fd_(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof address;
    if (fd_ < 0 || bind(fd_, reinterpret_cast<sockaddr*>(&address), length) != 0 ||
        getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &length) != 0)
      return;
    port_ = ntohs(address.sin_port);
  }
  ~StandbyPort() { Release(); }
  StandbyPort(const StandbyPort&) = delete;
  StandbyPort& operator=(const StandbyPort&) = delete;
  int port() const { return port_; }
  // Frees the port for the daemon that takes over.
  void Release() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

 private:
  int fd_;
  int port_ = 0;
};

struct Daemon {
  std::unique_ptr<ChildProcess> process;
  std::string endpoint;
  int port = 0;
};

Daemon StartDaemon(int port, const std::string& state_dir) {
  Daemon d;
  d.process = std::make_unique<ChildProcess>(std::vector<std::string>{
      BinDir() + "/meshrun-rdzvd", "--host", "127.0.0.1", "--port", std::to_string(port),
      "--log-level", "warn", "--state-dir", state_dir});
  const std::string prefix = "MESHRUN_RDZVD_ENDPOINT=";
  auto line = d.process->ReadLine(seconds(30));
  if (!line || line->rfind(prefix, 0) != 0) return d;
  d.endpoint = line->substr(prefix.size());
  d.port = std::stoi(d.endpoint.substr(d.endpoint.rfind(':') + 1));
  return d;
}

std::unique_ptr<ChildProcess> LaunchAgent(const std::string& endpoints, int node_rank,
                                          const std::string& go) {
  return std::make_unique<ChildProcess>(
      std::vector<std::string>{
          "/usr/bin/env", "PYTHON_EXEC=" MESHRUN_PYTHON, BinDir() + "/meshrun",
          "--nnodes=2", "--nproc-per-node=2", "--rdzv-backend=c10d",
          "--rdzv-endpoint=" + endpoints, "--rdzv-id=follow-job",
          // A 10 s grace: under load, the next daemon may take seconds to start.
          "--rdzv-conf=keep_alive_interval=1,keep_alive_max_attempt=10",
          "--node-rank=" + std::to_string(node_rank), "--shutdown-timeout=5", kWorker, go,
          "150", BinDir() + "/store_tool"},
      /*merge_stderr=*/true);
}

struct WorkerStart {
  int rank;
  pid_t pid;
  int restart;
};

std::vector<WorkerStart> Starts(const std::string& output) {
  std::vector<WorkerStart> starts;
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);) {
    WorkerStart s{};
    auto at = line.find("WORKER rank=");
    if (at == std::string::npos) continue;
    if (std::sscanf(line.c_str() + at, "WORKER rank=%d pid=%d restart=%d", &s.rank,
                    &s.pid, &s.restart) == 3)
      starts.push_back(s);
  }
  return starts;
}

size_t Count(const std::string& text, const std::string& needle) {
  size_t count = 0;
  for (size_t at = text.find(needle); at != std::string::npos;
       at = text.find(needle, at + 1))
    ++count;
  return count;
}

// Reads `agent` until its output holds `needle` `count` times.
bool AwaitCount(ChildProcess& agent, const std::string& needle, size_t count,
                seconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (Count(agent.output(), needle) < count && Clock::now() < deadline) {
    if (!agent.ReadLine(milliseconds(200)) && !agent.Running()) break;
  }
  return Count(agent.output(), needle) >= count;
}

class EndpointListTest : public ::testing::Test {
 protected:
  // Workers of an agent that died are re-parented to the test, and reaped.
  void SetUp() override { prctl(PR_SET_CHILD_SUBREAPER, 1); }
  void TearDown() override {
    while (waitpid(-1, nullptr, WNOHANG) > 0) {
    }
  }
  TempDir dir_;
  const std::string go_ = dir_.path() + "/go";
  const std::string state_ = dir_.path() + "/state";
};

TEST_F(EndpointListTest, AgentsFollowTheDaemonToTheNextEndpointWithoutRestartingWorkers) {
  Daemon a = StartDaemon(0, state_);
  ASSERT_FALSE(a.endpoint.empty());
  StandbyPort b_port;
  ASSERT_NE(b_port.port(), 0);
  const std::string b_endpoint = "127.0.0.1:" + std::to_string(b_port.port());
  const std::string list = a.endpoint + "," + b_endpoint;
  std::unique_ptr<ChildProcess> agents[2] = {LaunchAgent(list, 0, go_),
                                             LaunchAgent(list, 1, go_)};
  std::map<int, pid_t> pids;  // global rank -> worker pid
  for (auto& agent : agents) {
    ASSERT_TRUE(AwaitCount(*agent, "STORED rank=", 2, seconds(120))) << agent->output();
    for (const WorkerStart& s : Starts(agent->output())) {
      EXPECT_EQ(s.restart, 0);
      pids[s.rank] = s.pid;
    }
  }
  ASSERT_EQ(pids.size(), 4u);

  a.process->Signal(SIGKILL);
  ASSERT_TRUE(a.process->Wait(seconds(10)));
  for (auto& agent : agents) {
    ASSERT_TRUE(agent->ReadUntil("lost the rendezvous daemon", seconds(20)))
        << agent->output();
  }
  b_port.Release();
  Daemon b = StartDaemon(b_port.port(), state_);
  ASSERT_EQ(b.endpoint, b_endpoint) << "taking the standby's port";
  for (auto& agent : agents) {
    ASSERT_TRUE(agent->ReadUntil("reconnected to the rendezvous daemon", seconds(30)))
        << agent->output();
  }
  for (const auto& [rank, pid] : pids) EXPECT_TRUE(ProcessAlive(pid)) << "rank " << rank;

  std::ofstream(go_) << "go\n";
  for (auto& agent : agents) {
    EXPECT_EQ(ExitCode(*agent, seconds(90)), 0) << agent->output();
    // The same workers finished, having read every key written before the
    // switch (through the relay, and through MESHRUN_STORE_ENDPOINT's list).
    auto starts = Starts(agent->output());
    EXPECT_EQ(starts.size(), 2u) << agent->output();
    for (const WorkerStart& s : starts) EXPECT_EQ(pids[s.rank], s.pid);
    EXPECT_EQ(Count(agent->output(), " done reads="), 2u) << agent->output();
    EXPECT_NE(agent->output().find("run succeeded"), std::string::npos)
        << agent->output();
  }
  b.process->Signal(SIGTERM);
  EXPECT_TRUE(b.process->Wait(seconds(10)));
}

TEST_F(EndpointListTest, AStandbyFirstInTheListIsSkipped) {
  StandbyPort standby;
  ASSERT_NE(standby.port(), 0);
  Daemon a = StartDaemon(0, state_);
  ASSERT_FALSE(a.endpoint.empty());
  const std::string list =
      "127.0.0.1:" + std::to_string(standby.port()) + "," + a.endpoint;
  std::ofstream(go_) << "go\n";
  std::unique_ptr<ChildProcess> agents[2] = {LaunchAgent(list, 0, go_),
                                             LaunchAgent(list, 1, go_)};
  for (auto& agent : agents) {
    EXPECT_EQ(ExitCode(*agent, seconds(120)), 0) << agent->output();
    EXPECT_EQ(Count(agent->output(), " done reads="), 2u) << agent->output();
    for (const WorkerStart& s : Starts(agent->output())) EXPECT_EQ(s.restart, 0);
  }
  // `meshrun status` takes the list too.
  ChildProcess status({BinDir() + "/meshrun", "status", "--rdzv-endpoint=" + list},
                      /*merge_stderr=*/true);
  EXPECT_EQ(ExitCode(status, seconds(30)), 0) << status.output();
  EXPECT_NE(status.output().find("follow-job"), std::string::npos) << status.output();
  a.process->Signal(SIGTERM);
  EXPECT_TRUE(a.process->Wait(seconds(10)));
}

}  // namespace
}  // namespace meshrun
