// A real 2-node job (two real `meshrun` agents, two Python workers each)
// while its real meshrun-rdzvd is SIGKILLed or stopped with SIGTERM:
// restarted with --state-dir on the same port, the job finishes with no
// worker restart; restarted without it, the job restarts from round 1 (the
// documented behaviour); never restarted, the agents stop their workers
// within the reconnect grace and exit 75. And a second launch under the id of
// a run that ended runs its own workers.

#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "rendezvous/client/rendezvous_client.h"
#include "rendezvous/client/store_client.h"
#include "tests/support/child_process.h"
#include "tests/support/temp_dir.h"

namespace meshrun {
namespace {

namespace fs = std::filesystem;
namespace v1 = meshrun::v1;
using std::chrono::milliseconds;
using std::chrono::seconds;
using testing::BinDir;
using testing::ChildProcess;
using testing::ExitCode;
using testing::ProcessAlive;
using Clock = std::chrono::steady_clock;

const std::string kWorker =
    std::string(MESHRUN_SOURCE_DIR) + "/tests/integration/workers/resume_worker.py";

// Every directory of this file's tests is named after it.
class TempDir : public testing::TempDir {
 public:
  TempDir() : testing::TempDir("meshrun-restart") {}
};

struct Daemon {
  std::unique_ptr<ChildProcess> process;
  std::string endpoint;
  int port = 0;
};

// A real meshrun-rdzvd on 127.0.0.1:`port` (0: kernel-assigned).
Daemon StartDaemon(int port, const std::string& state_dir) {
  std::vector<std::string> argv{
      BinDir() + "/meshrun-rdzvd", "--host",      "127.0.0.1", "--port",
      std::to_string(port),        "--log-level", "warn"};
  if (!state_dir.empty()) {
    argv.push_back("--state-dir");
    argv.push_back(state_dir);
  }
  Daemon d;
  d.process = std::make_unique<ChildProcess>(argv);
  const std::string prefix = "MESHRUN_RDZVD_ENDPOINT=";
  auto line = d.process->ReadLine(seconds(20));
  if (!line || line->rfind(prefix, 0) != 0) return d;
  d.endpoint = line->substr(prefix.size());
  d.port = std::stoi(d.endpoint.substr(d.endpoint.rfind(':') + 1));
  return d;
}

std::unique_ptr<ChildProcess> LaunchAgent(const std::string& endpoint, int node_rank,
                                          const std::string& go, int limit_s,
                                          std::vector<std::string> extra = {}) {
  std::vector<std::string> argv{
      "/usr/bin/env",
      "PYTHON_EXEC=" MESHRUN_PYTHON,
      BinDir() + "/meshrun",
      "--nnodes=2",
      "--nproc-per-node=2",
      "--rdzv-backend=c10d",
      "--rdzv-endpoint=" + endpoint,
      "--rdzv-id=resume-job",
      "--rdzv-conf=keep_alive_interval=1,keep_alive_max_attempt=5",
      "--node-rank=" + std::to_string(node_rank),
      "--shutdown-timeout=5"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  argv.push_back(kWorker);
  argv.push_back(go);
  argv.push_back(std::to_string(limit_s));
  return std::make_unique<ChildProcess>(argv, /*merge_stderr=*/true);
}

struct WorkerStart {
  int rank;
  pid_t pid;
  int restart;
};

// "WORKER rank=R pid=P restart=C" lines, in order.
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

// Reads until `count` worker starts were printed by `agent`.
std::vector<WorkerStart> AwaitStarts(ChildProcess& agent, size_t count) {
  const auto deadline = Clock::now() + seconds(60);
  while (Starts(agent.output()).size() < count && Clock::now() < deadline) {
    if (!agent.ReadLine(milliseconds(200)) && !agent.Running()) break;
  }
  return Starts(agent.output());
}

std::unique_ptr<rdzv::StoreClient> Store(const std::string& endpoint) {
  rdzv::StoreClientOptions options;
  options.target = endpoint;
  options.ns = "resume-job/test";
  options.timeout = seconds(20);
  auto client = rdzv::StoreClient::Connect(options);
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? std::move(*client) : nullptr;
}

class DaemonRestartTest : public ::testing::Test {
 protected:
  // Workers of an agent that died are re-parented to the test, so "gone"
  // can be checked, and reaped.
  void SetUp() override { prctl(PR_SET_CHILD_SUBREAPER, 1); }
  void TearDown() override {
    while (waitpid(-1, nullptr, WNOHANG) > 0) {
    }
  }
  TempDir dir_;
  const std::string go_ = dir_.path() + "/go";
};

class DaemonRestartBySignalTest : public DaemonRestartTest,
                                  public ::testing::WithParamInterface<int> {};

// SIGKILL persists nothing more; a graceful stop (SIGTERM) must not persist
// its own shutdown as every node leaving, or every resume is refused.
TEST_P(DaemonRestartBySignalTest, DaemonWithStateDirResumesWithoutRestartingWorkers) {
  const int stop_signal = GetParam();
  const std::string state = dir_.path() + "/state";
  Daemon daemon = StartDaemon(0, state);
  ASSERT_FALSE(daemon.endpoint.empty());
  // The daemon is gone from the signal until the restarted one serves: a
  // graceful stop (its calls' grace, 2 s) and a start, which took 5 s under
  // a load average of 6, past the keep-alive's 5 s (stopped workers). This
  // case is about the resume, not the grace (DaemonGoneLonger... is).
  const std::vector<std::string> grace = {"--rdzv-reconnect-grace=60"};
  std::unique_ptr<ChildProcess> agents[2] = {
      LaunchAgent(daemon.endpoint, 0, go_, 90, grace),
      LaunchAgent(daemon.endpoint, 1, go_, 90, grace)};
  std::map<int, pid_t> pids;  // global rank -> worker pid
  for (auto& agent : agents) {
    auto starts = AwaitStarts(*agent, 2);
    ASSERT_EQ(starts.size(), 2u) << agent->output();
    for (const WorkerStart& s : starts) {
      EXPECT_EQ(s.restart, 0);
      pids[s.rank] = s.pid;
    }
  }
  ASSERT_EQ(pids.size(), 4u);
  ASSERT_TRUE(Store(daemon.endpoint)->Set("written-before-the-kill", "42").ok());

  daemon.process->Signal(stop_signal);
  std::optional<int> status = daemon.process->Wait(seconds(10));
  ASSERT_TRUE(status);
  if (stop_signal == SIGTERM) {
    EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << *status;
  }
  for (auto& agent : agents) {
    ASSERT_TRUE(agent->ReadUntil("lost the rendezvous daemon", seconds(20)))
        << agent->output();
  }
  Daemon restarted = StartDaemon(daemon.port, state);
  ASSERT_EQ(restarted.endpoint, daemon.endpoint) << "rebinding the port";
  for (auto& agent : agents) {
    ASSERT_TRUE(agent->ReadUntil("reconnected to the rendezvous daemon", seconds(20)))
        << agent->output();
  }
  auto value = Store(restarted.endpoint)->Get("written-before-the-kill");
  ASSERT_TRUE(value.ok()) << value.status();
  EXPECT_EQ(*value, "42");
  for (const auto& [rank, pid] : pids) EXPECT_TRUE(ProcessAlive(pid)) << "rank " << rank;

  std::ofstream(go_) << "go\n";
  for (auto& agent : agents) {
    EXPECT_EQ(ExitCode(*agent, seconds(60)), 0) << agent->output();
    // The same workers finished: no second start, no restart.
    auto starts = Starts(agent->output());
    EXPECT_EQ(starts.size(), 2u) << agent->output();
    for (const WorkerStart& s : starts) EXPECT_EQ(pids[s.rank], s.pid);
    EXPECT_NE(agent->output().find("run succeeded"), std::string::npos)
        << agent->output();
    EXPECT_EQ(agent->output().find("cannot resume"), std::string::npos)
        << agent->output();
  }
}

INSTANTIATE_TEST_SUITE_P(Signals, DaemonRestartBySignalTest,
                         ::testing::Values(SIGKILL, SIGTERM),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return std::string(info.param == SIGKILL ? "Sigkill"
                                                                    : "Sigterm");
                         });

TEST_F(DaemonRestartTest, WithoutStateDirTheJobStartsAgainFromRoundOne) {
  Daemon daemon = StartDaemon(0, "");
  ASSERT_FALSE(daemon.endpoint.empty());
  std::unique_ptr<ChildProcess> agents[2] = {LaunchAgent(daemon.endpoint, 0, go_, 90),
                                             LaunchAgent(daemon.endpoint, 1, go_, 90)};
  std::set<pid_t> first_pids;
  for (auto& agent : agents) {
    auto starts = AwaitStarts(*agent, 2);
    ASSERT_EQ(starts.size(), 2u) << agent->output();
    for (const WorkerStart& s : starts) first_pids.insert(s.pid);
  }
  ASSERT_TRUE(Store(daemon.endpoint)->Set("written-before-the-kill", "42").ok());
  daemon.process->Signal(SIGKILL);
  ASSERT_TRUE(daemon.process->Wait(seconds(10)));
  Daemon restarted = StartDaemon(daemon.port, "");
  ASSERT_EQ(restarted.endpoint, daemon.endpoint);

  // The new daemon knows nothing: each agent stops its workers and joins
  // afresh; the workers start again in a new round 1, restart count 0.
  for (auto& agent : agents) {
    auto starts = AwaitStarts(*agent, 4);
    ASSERT_EQ(starts.size(), 4u) << agent->output();
    EXPECT_NE(agent->output().find("cannot resume round 1"), std::string::npos)
        << agent->output();
    for (size_t i = 2; i < 4; ++i) {
      EXPECT_EQ(first_pids.count(starts[i].pid), 0u) << "a new process";
      EXPECT_EQ(starts[i].restart, 0);
    }
  }
  for (pid_t pid : first_pids) EXPECT_FALSE(ProcessAlive(pid)) << pid;
  EXPECT_FALSE(*Store(restarted.endpoint)->Check({"written-before-the-kill"}));

  std::ofstream(go_) << "go\n";
  for (auto& agent : agents)
    EXPECT_EQ(ExitCode(*agent, seconds(60)), 0) << agent->output();
}

TEST_F(DaemonRestartTest, DaemonGoneLongerThanTheGraceStopsTheWorkers) {
  Daemon daemon = StartDaemon(0, dir_.path() + "/state");
  ASSERT_FALSE(daemon.endpoint.empty());
  const milliseconds grace(2000);
  std::unique_ptr<ChildProcess> agents[2] = {
      LaunchAgent(daemon.endpoint, 0, go_, 90, {"--rdzv-reconnect-grace=2"}),
      LaunchAgent(daemon.endpoint, 1, go_, 90, {"--rdzv-reconnect-grace=2"})};
  std::vector<pid_t> pids;
  for (auto& agent : agents) {
    auto starts = AwaitStarts(*agent, 2);
    ASSERT_EQ(starts.size(), 2u) << agent->output();
    for (const WorkerStart& s : starts) pids.push_back(s.pid);
  }
  const auto killed = Clock::now();
  daemon.process->Signal(SIGKILL);
  ASSERT_TRUE(daemon.process->Wait(seconds(10)));
  for (auto& agent : agents) {
    EXPECT_EQ(ExitCode(*agent, seconds(30)), 75) << agent->output();
    const auto took = Clock::now() - killed;
    // The message below says the grace (2.0 s) was the reason; this bound
    // only tells "stopped on the grace" from "ran on to the workers' own
    // 90 s", with room for a loaded machine (the lease counts from the last
    // heartbeat before the kill, and SIGTERM's stop and the exit follow).
    EXPECT_LT(took, grace + seconds(15)) << agent->output();
    EXPECT_NE(
        agent->output().find("meshrun: lost the rendezvous daemon at " + daemon.endpoint +
                             ": no successful heartbeat for 2.0 s"),
        std::string::npos)
        << agent->output();
    EXPECT_EQ(agent->output().find("done"), std::string::npos) << agent->output();
  }
  EXPECT_GE(Clock::now() - killed, grace - seconds(1)) << "stopped before the grace";
  for (pid_t pid : pids) EXPECT_FALSE(ProcessAlive(pid)) << pid;
}

// Two launches with one --rdzv-id, one after the other, against one daemon:
// the second is not told the first one's outcome, it runs its own workers
// (a new incarnation), with its own options and restart count.
TEST_F(DaemonRestartTest, RelaunchOfAnEndedRunIdRunsItsOwnWorkers) {
  Daemon daemon = StartDaemon(0, dir_.path() + "/state");
  ASSERT_FALSE(daemon.endpoint.empty());
  // Fails at its first start, so the first launch uses a restart.
  const std::string worker = dir_.path() + "/worker.sh";
  std::ofstream(worker)
      << "#!/bin/sh\n"
         "echo \"RAN launch=$1 restart=$TORCHELASTIC_RESTART_COUNT\"\n"
         "[ \"$1\" = 2 ] || [ \"$TORCHELASTIC_RESTART_COUNT\" -ge 1 ]\n";
  fs::permissions(worker, fs::perms::owner_all);
  auto launch = [&](int number, const std::string& max_restarts) {
    return std::make_unique<ChildProcess>(
        std::vector<std::string>{BinDir() + "/meshrun", "--nnodes=2",
                                 "--nproc-per-node=1", "--rdzv-backend=c10d",
                                 "--rdzv-endpoint=" + daemon.endpoint, "--rdzv-id=reused",
                                 "--max-restarts=" + max_restarts, "--no-python", worker,
                                 std::to_string(number)},
        /*merge_stderr=*/true);
  };
  std::unique_ptr<ChildProcess> first[2] = {launch(1, "1"), launch(1, "1")};
  for (auto& agent : first) {
    EXPECT_EQ(ExitCode(*agent, seconds(60)), 0) << agent->output();
    EXPECT_NE(agent->output().find("RAN launch=1 restart=1"), std::string::npos)
        << agent->output();
  }
  // Other options (--max-restarts) than the ended run's.
  std::unique_ptr<ChildProcess> second[2] = {launch(2, "2"), launch(2, "2")};
  for (auto& agent : second) {
    EXPECT_EQ(ExitCode(*agent, seconds(60)), 0) << agent->output();
    EXPECT_NE(agent->output().find("RAN launch=2 restart=0"), std::string::npos)
        << agent->output();
    EXPECT_EQ(agent->output().find("already ended"), std::string::npos)
        << agent->output();
  }
}

// A second launch under the id of a job that is still running waits (the
// run is full) and, when the first one succeeds, is told it took part in
// nothing: exit 1 with one line, never the first job's success.
TEST_F(DaemonRestartTest, LaunchJoiningARunningJobIsNeverToldItsSuccess) {
  Daemon daemon = StartDaemon(0, "");
  ASSERT_FALSE(daemon.endpoint.empty());
  const std::string worker = dir_.path() + "/worker.sh";
  std::ofstream(worker) << "#!/bin/sh\n"
                           "echo \"RAN launch=$1\"\n"
                           "while [ ! -e \"$2\" ]; do sleep 0.05; done\n";
  fs::permissions(worker, fs::perms::owner_all);
  auto launch = [&](int number) {
    return std::make_unique<ChildProcess>(
        std::vector<std::string>{BinDir() + "/meshrun", "--nnodes=2",
                                 "--nproc-per-node=1", "--rdzv-backend=c10d",
                                 "--rdzv-endpoint=" + daemon.endpoint, "--rdzv-id=shared",
                                 "--no-python", worker, std::to_string(number), go_},
        /*merge_stderr=*/true);
  };
  std::unique_ptr<ChildProcess> first[2] = {launch(1), launch(1)};
  for (auto& agent : first)
    ASSERT_TRUE(agent->ReadUntil("RAN launch=1", seconds(60))) << agent->output();
  std::unique_ptr<ChildProcess> second[2] = {launch(2), launch(2)};
  // Both are enrolled (waiting) before the first job may finish.
  rdzv::RendezvousClient client(
      grpc::CreateChannel(daemon.endpoint, grpc::InsecureChannelCredentials()));
  auto waiting = [&client] {
    v1::StatusRequest request;
    request.set_run_id("shared");
    auto reply = client.Status(request);
    int n = 0;
    if (reply.ok() && reply->runs_size() == 1)
      for (const auto& node : reply->runs(0).nodes()) n += node.state() == "waiting";
    return n;
  };
  const auto deadline = Clock::now() + seconds(30);
  while (waiting() < 2) {
    ASSERT_LT(Clock::now(), deadline) << "the second launch never joined";
    std::this_thread::sleep_for(milliseconds(50));
  }
  std::ofstream(go_) << "go\n";
  for (auto& agent : first)
    EXPECT_EQ(ExitCode(*agent, seconds(60)), 0) << agent->output();
  for (auto& agent : second) {
    EXPECT_EQ(ExitCode(*agent, seconds(60)), 1) << agent->output();
    EXPECT_EQ(agent->output().find("RAN launch=2"), std::string::npos) << agent->output();
    EXPECT_EQ(agent->output().find("run succeeded"), std::string::npos)
        << agent->output();
    EXPECT_NE(agent->output().find("before this node took part; nothing ran on it"),
              std::string::npos)
        << agent->output();
  }
}

}  // namespace
}  // namespace meshrun
