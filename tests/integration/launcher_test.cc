// The `meshrun` launcher end to end: the real binary, real worker processes
// (a shell script, so most tests take well under a second), a real daemon on
// 127.0.0.1 (embedded, agent-hosted, or a separate meshrun-rdzvd).

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
#include <regex>
#include <set>
#include <sstream>
#include <thread>

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
using testing::ProcessAlive;
using testing::TempDir;
namespace fs = std::filesystem;

const std::string kWorker =
    std::string(MESHRUN_SOURCE_DIR) + "/tests/integration/workers/worker.sh";

// `env`: more "KEY=VALUE"s for meshrun's environment.
std::unique_ptr<ChildProcess> Launch(std::vector<std::string> args,
                                     const std::vector<std::string>& env = {}) {
  std::vector<std::string> argv{"/usr/bin/env", "PYTHON_EXEC=" MESHRUN_PYTHON};
  argv.insert(argv.end(), env.begin(), env.end());
  argv.push_back(BinDir() + "/meshrun");
  argv.insert(argv.end(), args.begin(), args.end());
  return std::make_unique<ChildProcess>(argv, /*merge_stderr=*/true);
}

std::vector<pid_t> Pids(const std::string& output) {
  std::vector<pid_t> pids;
  std::regex pid_re("pid=(\\d+)");
  for (std::sregex_iterator it(output.begin(), output.end(), pid_re), end; it != end;
       ++it)
    pids.push_back(std::stoi((*it)[1]));
  return pids;
}

// "ENV <rank> KEY=VALUE" lines -> rank -> key -> value.
std::map<int, std::map<std::string, std::string>> Envs(const std::string& output) {
  std::map<int, std::map<std::string, std::string>> envs;
  std::regex env_re("ENV (\\d+) ([A-Z_]+)=(.*)");
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);) {
    std::smatch m;
    if (std::regex_search(line, m, env_re)) envs[std::stoi(m[1])][m[2]] = m[3];
  }
  return envs;
}

class LauncherTest : public ::testing::Test {
 protected:
  // Orphans (workers of a killed agent) are re-parented to the test, so
  // "gone" can be checked and they are reaped.
  void SetUp() override { prctl(PR_SET_CHILD_SUBREAPER, 1); }
  void TearDown() override {
    while (waitpid(-1, nullptr, WNOHANG) > 0) {
    }
  }
};

class StandaloneWorkers : public LauncherTest,
                          public ::testing::WithParamInterface<int> {};

TEST_P(StandaloneWorkers, EveryWorkerGetsTorchrunsEnvironment) {
  const int n = GetParam();
  auto run = Launch({"--standalone", "--nproc-per-node=" + std::to_string(n),
                     "--no-python", kWorker, "env"});
  ASSERT_EQ(ExitCode(*run), 0) << run->output();
  auto envs = Envs(run->output());
  ASSERT_EQ(envs.size(), static_cast<size_t>(n)) << run->output();
  for (int rank = 0; rank < n; ++rank) {
    auto& env = envs[rank];
    EXPECT_EQ(env["LOCAL_RANK"], std::to_string(rank));
    EXPECT_EQ(env["WORLD_SIZE"], std::to_string(n));
    EXPECT_EQ(env["LOCAL_WORLD_SIZE"], std::to_string(n));
    EXPECT_EQ(env["GROUP_RANK"], "0");
    // The embedded daemon's TCPStore, as torchrun 2's agent store.
    EXPECT_EQ(env["TORCHELASTIC_USE_AGENT_STORE"], "True");
    EXPECT_EQ(env["MASTER_ADDR"] + ":" + env["MASTER_PORT"],
              env["MESHRUN_STORE_ENDPOINT"]);
    EXPECT_NE(env["MASTER_PORT"], "0");
    EXPECT_EQ(env["OMP_NUM_THREADS"], n > 1 ? "1" : "<unset>");
  }
  // As under torchrun 2, a stream that is not tee'd reaches the console as the
  // worker wrote it: no "[default0]:" prefix (LogDirHoldsEachWorkersStreams
  // checks the prefix of a tee'd one).
  EXPECT_NE(run->output().find("\nENV 0 LOCAL_RANK=0"), std::string::npos)
      << run->output();
  EXPECT_EQ(run->output().find("[default"), std::string::npos) << run->output();
}

INSTANTIATE_TEST_SUITE_P(OneTwoFour, StandaloneWorkers, ::testing::Values(1, 2, 4));

TEST_F(LauncherTest, TwoStandaloneJobsNeverCollide) {
  auto a = Launch({"--standalone", "--nproc-per-node=2", "--no-python", kWorker, "env"});
  auto b = Launch({"--standalone", "--nproc-per-node=2", "--no-python", kWorker, "env"});
  EXPECT_EQ(ExitCode(*a), 0) << a->output();
  EXPECT_EQ(ExitCode(*b), 0) << b->output();
  EXPECT_NE(Envs(a->output())[0]["TORCHELASTIC_RUN_ID"],
            Envs(b->output())[0]["TORCHELASTIC_RUN_ID"]);
}

TEST_F(LauncherTest, ExactEnvironmentOfATwoNodeLayout) {
  DaemonProcess daemon;
  std::vector<std::unique_ptr<ChildProcess>> agents;
  for (int node = 0; node < 2; ++node)
    agents.push_back(Launch({"--nnodes=2", "--nproc-per-node=2", "--rdzv-backend=c10d",
                             "--rdzv-endpoint=" + daemon.endpoint(), "--rdzv-id=envjob",
                             "--node-rank=" + std::to_string(node), "--max-restarts=3",
                             "--no-python", kWorker, "env"}));
  std::string output;
  for (auto& agent : agents) {
    ASSERT_EQ(ExitCode(*agent), 0) << agent->output();
    output += agent->output();
  }
  auto envs = Envs(output);
  ASSERT_EQ(envs.size(), 4u) << output;
  // The agent store, as under torchrun 2: each node's agent's relay (the
  // same port for a node's ranks, not the daemon's).
  const std::string daemon_port =
      daemon.endpoint().substr(daemon.endpoint().rfind(':') + 1);
  for (int rank = 0; rank < 4; ++rank) {
    const int node = rank / 2, local = rank % 2;
    std::map<std::string, std::string> expected{
        {"LOCAL_RANK", std::to_string(local)},
        {"RANK", std::to_string(rank)},
        {"GROUP_RANK", std::to_string(node)},
        {"GROUP_WORLD_SIZE", "2"},
        {"ROLE_RANK", std::to_string(rank)},
        {"ROLE_NAME", "default"},
        {"ROLE_WORLD_SIZE", "4"},
        {"LOCAL_WORLD_SIZE", "2"},
        {"WORLD_SIZE", "4"},
        {"MASTER_ADDR", "127.0.0.1"},
        {"MASTER_PORT", envs[node * 2]["MASTER_PORT"]},
        {"TORCHELASTIC_RESTART_COUNT", "0"},
        {"TORCHELASTIC_MAX_RESTARTS", "3"},
        {"TORCHELASTIC_RUN_ID", "envjob"},
        {"TORCHELASTIC_USE_AGENT_STORE", "True"},
        {"OMP_NUM_THREADS", "1"},
        {"MESHRUN_STORE_ENDPOINT", daemon.endpoint()},
        {"MESHRUN_STORE_PREFIX", "envjob/e1.r1"},
    };
    for (const auto& [key, value] : expected)
      EXPECT_EQ(envs[rank][key], value) << "rank " << rank << " " << key;
    EXPECT_TRUE(std::regex_search(
        envs[rank]["TORCHELASTIC_ERROR_FILE"],
        std::regex("/envjob/attempt_0/" + std::to_string(local) + "/error.json$")))
        << envs[rank]["TORCHELASTIC_ERROR_FILE"];
    EXPECT_NE(envs[rank]["MASTER_PORT"], daemon_port);
    EXPECT_NE(envs[rank]["MASTER_PORT"], "0");
  }
  EXPECT_NE(envs[0]["MASTER_PORT"], envs[2]["MASTER_PORT"]);
}

TEST_F(LauncherTest, ThreeAgentsWithAnAgentHostedDaemon) {
  const std::string endpoint = "127.0.0.1:" + std::to_string(FreePort());
  std::vector<std::unique_ptr<ChildProcess>> agents;
  for (int node = 0; node < 3; ++node)
    agents.push_back(Launch({"--nnodes=3", "--nproc-per-node=1", "--rdzv-backend=c10d",
                             "--rdzv-endpoint=" + endpoint, "--rdzv-id=hosted",
                             "--no-python", kWorker, "env"}));
  std::string output;
  for (auto& agent : agents) {
    ASSERT_EQ(ExitCode(*agent), 0) << agent->output();
    output += agent->output();
  }
  auto envs = Envs(output);
  ASSERT_EQ(envs.size(), 3u) << output;
  std::set<std::string> group_ranks;
  for (auto& [rank, env] : envs) group_ranks.insert(env["GROUP_RANK"]);
  EXPECT_EQ(group_ranks, (std::set<std::string>{"0", "1", "2"}));
}

TEST_F(LauncherTest, HeterogeneousNprocGivesPrefixSumRanks) {
  DaemonProcess daemon;
  auto a = Launch({"--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d",
                   "--rdzv-endpoint=" + daemon.endpoint(), "--rdzv-id=hetero",
                   "--node-rank=0", "--no-python", kWorker, "env"});
  auto b = Launch({"--nnodes=2", "--nproc-per-node=3", "--rdzv-backend=c10d",
                   "--rdzv-endpoint=" + daemon.endpoint(), "--rdzv-id=hetero",
                   "--node-rank=1", "--no-python", kWorker, "env"});
  ASSERT_EQ(ExitCode(*a), 0) << a->output();
  ASSERT_EQ(ExitCode(*b), 0) << b->output();
  auto envs_b = Envs(b->output());
  ASSERT_EQ(envs_b.size(), 3u);
  for (int rank = 1; rank <= 3; ++rank) {
    EXPECT_EQ(envs_b[rank]["WORLD_SIZE"], "4");
    EXPECT_EQ(envs_b[rank]["LOCAL_RANK"], std::to_string(rank - 1));
  }
  EXPECT_EQ(Envs(a->output())[0]["LOCAL_WORLD_SIZE"], "1");
}

TEST_F(LauncherTest, WorkerFailingOnceIsRestartedEverywhere) {
  DaemonProcess daemon;
  std::vector<std::unique_ptr<ChildProcess>> agents;
  for (int node = 0; node < 2; ++node)
    agents.push_back(Launch({"--nnodes=2", "--nproc-per-node=2", "--rdzv-backend=c10d",
                             "--rdzv-endpoint=" + daemon.endpoint(), "--rdzv-id=failonce",
                             "--node-rank=" + std::to_string(node), "--max-restarts=1",
                             "--no-python", kWorker, "fail-once", "3", "4"}));
  for (auto& agent : agents) {
    ASSERT_EQ(ExitCode(*agent), 0) << agent->output();
    // Node 0's workers did not fail, yet restarted with the world.
    EXPECT_EQ(Count(agent->output(), "attempt=1 done"), 2u) << agent->output();
  }
}

TEST_F(LauncherTest, ExhaustedBudgetFailsWithTheRootCauseFirst) {
  auto run = Launch({"--standalone", "--nproc-per-node=2", "--max-restarts=1",
                     "--no-python", kWorker, "fail-always", "1", "5"});
  EXPECT_EQ(ExitCode(*run), 5) << run->output();
  const std::string& out = run->output();
  EXPECT_EQ(Count(out, "rank=1 attempt=1 started"), 1u) << out;  // restarted once only
  auto root = out.find("Root Cause");
  ASSERT_NE(root, std::string::npos) << out;
  EXPECT_NE(out.find("rank      : 1 (local_rank: 1)", root), std::string::npos) << out;
  EXPECT_NE(out.find("exitcode  : 5", root), std::string::npos) << out;
}

TEST_F(LauncherTest, RecordTracebackAppearsInTheSummary) {
  auto run = Launch(
      {"--standalone", "--nproc-per-node=2",
       std::string(MESHRUN_SOURCE_DIR) + "/tests/integration/workers/record_failure.py"});
  EXPECT_EQ(ExitCode(*run, seconds(120)), 1) << run->output();
  const std::string& out = run->output();
  EXPECT_NE(out.find("ValueError: deliberate failure in rank 1"), std::string::npos)
      << out;
  EXPECT_NE(out.find("inner_function_that_fails"), std::string::npos) << out;
}

TEST_F(LauncherTest, ElasticRunGrowsWhenAThirdAgentJoins) {
  DaemonProcess daemon;
  auto start = [&](const std::string& name) {
    return Launch({"--nnodes=1:3", "--nproc-per-node=1", "--rdzv-backend=c10d",
                   "--rdzv-endpoint=" + daemon.endpoint(), "--rdzv-id=grow",
                   "--rdzv-conf=last_call_timeout=0.2", "--no-python", kWorker,
                   "wait-world", "3"});
    (void)name;
  };
  auto a = start("a");
  auto b = start("b");
  ASSERT_TRUE(a->ReadUntil("world=2", seconds(30))) << a->output();
  auto c = start("c");
  for (auto* agent : {a.get(), b.get(), c.get()}) {
    ASSERT_EQ(ExitCode(*agent), 0) << agent->output();
    EXPECT_NE(agent->output().find("attempt=0 done"), std::string::npos)
        << agent->output();
  }
}

TEST_F(LauncherTest, KilledAgentTakesItsWorkersAndTheOthersCarryOn) {
  DaemonProcess daemon;
  std::vector<std::unique_ptr<ChildProcess>> agents;
  for (int node = 0; node < 3; ++node)
    agents.push_back(Launch({"--nnodes=2:3", "--nproc-per-node=1", "--rdzv-backend=c10d",
                             "--rdzv-endpoint=" + daemon.endpoint(), "--rdzv-id=killed",
                             "--node-rank=" + std::to_string(node),
                             // The survivors re-form when its lease (5 s) runs out;
                             // a 2 s one expelled a survivor whose heartbeats a
                             // loaded machine (load 13) delayed past it (exit 75).
                             "--rdzv-conf=keep_alive_interval=1,keep_alive_max_attempt=5",
                             "--no-python", kWorker, "until-world-below", "3"}));
  auto line = agents[2]->ReadUntil("pid=", seconds(30));
  ASSERT_TRUE(line) << agents[2]->output();
  pid_t worker = Pids(*line).at(0);
  agents[2]->Signal(SIGKILL);
  // PR_SET_PDEATHSIG kills it as the agent dies; the bound only tells that
  // from the 60 s it would otherwise sleep, with room for a loaded machine.
  EXPECT_TRUE(GoneWithin(worker, seconds(10)));
  for (int node = 0; node < 2; ++node) {
    ASSERT_EQ(ExitCode(*agents[node]), 0) << agents[node]->output();
    EXPECT_NE(agents[node]->output().find("done"), std::string::npos);
  }
}

TEST_F(LauncherTest, SigtermLeavesNoProcessBehind) {
  auto run = Launch({"--standalone", "--nproc-per-node=2", "--shutdown-timeout=5",
                     "--no-python", kWorker, "sleep", "60"});
  std::vector<pid_t> workers;
  for (int i = 0; i < 2; ++i) {
    auto line = run->ReadUntil("pid=", seconds(30));
    ASSERT_TRUE(line) << run->output();
    workers.push_back(Pids(*line).at(0));
  }
  run->Signal(SIGTERM);
  EXPECT_EQ(ExitCode(*run, seconds(20)), 128 + SIGTERM) << run->output();
  for (pid_t pid : workers) EXPECT_TRUE(GoneWithin(pid, milliseconds(1000))) << pid;
}

TEST_F(LauncherTest, SigtermWhileWaitingForTheDaemonExitsAtOnce) {
  TempDir tmp;
  auto run = Launch({"--nnodes=2", "--rdzv-backend=c10d",
                     "--rdzv-endpoint=127.0.0.1:" + std::to_string(FreePort()),
                     "--rdzv-conf=is_host=false", "--no-python", "/bin/true"},
                    {"TMPDIR=" + tmp.path()});
  ASSERT_TRUE(run->ReadUntil("waiting for the rendezvous daemon", seconds(30)))
      << run->output();
  run->Signal(SIGTERM);
  auto status = run->Wait(seconds(10));
  ASSERT_TRUE(status.has_value()) << "meshrun still waits after SIGTERM";
  ASSERT_TRUE(WIFEXITED(*status)) << run->output();  // handled, not killed by it
  EXPECT_EQ(WEXITSTATUS(*status), 128 + SIGTERM);
  // Its temporary log root is gone.
  EXPECT_TRUE(fs::is_empty(tmp.path())) << fs::directory_iterator(tmp.path())->path();
}

// Shell code: `sleep 1000` in a session of its own (outside the worker's
// process group, holding its stdout), its pid in the file `escaped` once it is
// there.
const char kEscapedSleep[] =
    "mkfifo fifo.$$; setsid sh -c 'echo $$ > fifo.'$$'; exec sleep 1000' & "
    "read pid < fifo.$$; echo $pid > escaped.tmp; mv escaped.tmp escaped; ";

// The pids listed in `path`, one a line.
std::vector<pid_t> PidsIn(const std::string& path) {
  std::vector<pid_t> pids;
  std::ifstream in(path);
  for (pid_t pid; in >> pid;) pids.push_back(pid);
  return pids;
}

// Issue 19 item 11: a worker's background children end with it, after a
// failure (before the restart) as after a success.
TEST_F(LauncherTest, WorkersBackgroundChildrenEndWithIt) {
  TempDir dir;
  const std::string worker = dir.Write("worker.sh", R"sh(#!/bin/sh
cd "$(dirname "$0")"
sleep 1000 &
echo $! >> pids
if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then exit 3; fi
# The first attempt's child must be gone (or a zombie) by now.
state=$(sed 's/.*) //' /proc/$(head -n 1 pids)/stat 2>/dev/null | cut -c1)
if [ -n "$state" ] && [ "$state" != Z ]; then echo "leftover running"; exit 9; fi
exit 0
)sh",
                                       0755);
  auto run = Launch(
      {"--standalone", "--nproc-per-node=1", "--max-restarts=1", "--no-python", worker});
  EXPECT_EQ(ExitCode(*run), 0) << run->output();
  const std::vector<pid_t> pids = PidsIn(dir / "pids");
  EXPECT_EQ(pids.size(), 2u) << run->output();
  for (pid_t pid : pids) {
    EXPECT_TRUE(GoneWithin(pid, seconds(5))) << pid;
    if (ProcessAlive(pid)) kill(pid, SIGKILL);
  }
}

// Issue 19 item 11: where cgroups can be used, also what left the worker's
// process group.
TEST_F(LauncherTest, WorkersSetsidChildrenEndWithItWhereCgroupsWork) {
  TempDir dir;
  const std::string worker = dir.Write(
      "worker.sh",
      std::string("#!/bin/sh\ncd \"$(dirname \"$0\")\"\n") + kEscapedSleep + "exit 0\n",
      0755);
  auto run = Launch({"--standalone", "--nproc-per-node=1", "--no-python", worker});
  EXPECT_EQ(ExitCode(*run), 0) << run->output();
  const std::vector<pid_t> pids = PidsIn(dir / "escaped");
  ASSERT_EQ(pids.size(), 1u) << run->output();
  if (run->output().find("workers run without cgroups") != std::string::npos) {
    kill(pids[0], SIGKILL);
    GTEST_SKIP() << "no cgroups here: " << run->output();
  }
  EXPECT_TRUE(GoneWithin(pids[0], seconds(5))) << run->output();
  if (ProcessAlive(pids[0])) kill(pids[0], SIGKILL);
}

// Issue 19 item 12: a detached process holding a worker's output delays
// neither a SIGTERM stop nor a restart by the shutdown timeout, with cgroups
// (it is killed) or without (the 1 s output cut-off).
TEST_F(LauncherTest, DetachedChildHoldingOutputStallsNoStop) {
  for (const char* cgroups : {"MESHRUN_CGROUPS=off", "MESHRUN_CGROUPS=auto"}) {
    SCOPED_TRACE(cgroups);
    TempDir dir;
    const std::string worker =
        dir.Write("worker.sh",
                  std::string("#!/bin/sh\ncd \"$(dirname \"$0\")\"\n") + kEscapedSleep +
                      "echo ready; exec sleep 1000\n",
                  0755);
    auto run = Launch({"--standalone", "--nproc-per-node=1", "--shutdown-timeout=20",
                       "--no-python", worker},
                      {cgroups});
    ASSERT_TRUE(run->ReadUntil("ready", seconds(30))) << run->output();
    const auto signalled = std::chrono::steady_clock::now();
    run->Signal(SIGTERM);
    EXPECT_EQ(ExitCode(*run, seconds(40)), 128 + SIGTERM) << run->output();
    EXPECT_LT(std::chrono::steady_clock::now() - signalled, seconds(6)) << run->output();
    for (pid_t pid : PidsIn(dir / "escaped")) kill(pid, SIGKILL);
  }
}

TEST_F(LauncherTest, DetachedChildHoldingOutputStallsNoRestart) {
  for (const char* cgroups : {"MESHRUN_CGROUPS=off", "MESHRUN_CGROUPS=auto"}) {
    SCOPED_TRACE(cgroups);
    TempDir dir;
    // Rank 0 detaches a child, rank 1 then fails; the restart stops rank 0.
    const std::string worker = dir.Write(
        "worker.sh",
        std::string("#!/bin/sh\ncd \"$(dirname \"$0\")\"\n"
                    "[ \"$TORCHELASTIC_RESTART_COUNT\" = 0 ] || exit 0\n"
                    "if [ \"$LOCAL_RANK\" = 1 ]; then read go < go; exit 3; fi\n") +
            kEscapedSleep + "echo go > go; exec sleep 1000\n",
        0755);
    // Rank 1 must find the fifo; made here, so no rank waits for another's.
    ASSERT_EQ(mkfifo((dir / "go").c_str(), 0600), 0);
    const auto started = std::chrono::steady_clock::now();
    auto run = Launch({"--standalone", "--nproc-per-node=2", "--max-restarts=1",
                       "--shutdown-timeout=15", "--no-python", worker},
                      {cgroups});
    EXPECT_EQ(ExitCode(*run, seconds(40)), 0) << run->output();
    EXPECT_LT(std::chrono::steady_clock::now() - started, seconds(8)) << run->output();
    for (pid_t pid : PidsIn(dir / "escaped")) kill(pid, SIGKILL);
  }
}

TEST_F(LauncherTest, StaticBackendUsesNodeRanks) {
  const int port = FreePort();
  std::vector<std::unique_ptr<ChildProcess>> agents;
  for (int node = 1; node >= 0; --node)
    agents.push_back(
        Launch({"--rdzv-backend=static", "--nnodes=2", "--nproc-per-node=1",
                "--master-addr=127.0.0.1", "--master-port=" + std::to_string(port),
                "--node-rank=" + std::to_string(node), "--no-python", kWorker, "env"}));
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(ExitCode(*agents[i]), 0) << agents[i]->output();
    auto envs = Envs(agents[i]->output());
    ASSERT_EQ(envs.size(), 1u);
    EXPECT_EQ(envs.begin()->second["GROUP_RANK"], std::to_string(1 - i));
    EXPECT_EQ(envs.begin()->first, 1 - i);
  }
}

TEST_F(LauncherTest, ModuleMode) {
  auto run = Launch({"--standalone", "--nproc-per-node=1", "-m", "platform"});
  EXPECT_EQ(ExitCode(*run), 0) << run->output();
  EXPECT_NE(run->output().find("\nLinux"), std::string::npos) << run->output();
}

TEST_F(LauncherTest, ExecutablesRunAsThemselvesWithoutPython) {
  // A C++ training program (or any executable that is not a .py script).
  auto run = Launch({"--standalone", "--nproc-per-node=2", "/bin/echo", "hello", "-m"});
  ASSERT_EQ(ExitCode(*run), 0) << run->output();
  EXPECT_EQ(Count(run->output(), "\nhello -m\n"), 2u) << run->output();
}

TEST_F(LauncherTest, ScriptArgumentsPassThroughUntouched) {
  auto run = Launch({"--standalone", "--nproc-per-node=1", "--no-python", kWorker, "args",
                     "--nproc-per-node", "8", "-m", "a b", "", "--standalone"});
  ASSERT_EQ(ExitCode(*run), 0) << run->output();
  EXPECT_NE(run->output().find("ARG[--nproc-per-node]\nARG[8]\nARG[-m]\nARG[a b]\nARG[]\n"
                               "ARG[--standalone]"),
            std::string::npos)
      << run->output();
}

TEST_F(LauncherTest, LogDirHoldsEachWorkersStreams) {
  fs::path dir = fs::temp_directory_path() / ("meshrun-logs-" + std::to_string(getpid()));
  fs::remove_all(dir);
  auto run = Launch({"--standalone", "--nproc-per-node=2", "--rdzv-id=ignored",
                     "--log-dir=" + dir.string(), "--redirects=3", "--tee=0:1",
                     "--no-python", kWorker, "env"});
  ASSERT_EQ(ExitCode(*run), 0) << run->output();
  std::vector<fs::path> stdout_logs;
  for (auto& entry : fs::recursive_directory_iterator(dir))
    if (entry.path().filename() == "stdout.log") stdout_logs.push_back(entry.path());
  ASSERT_EQ(stdout_logs.size(), 2u);
  for (const auto& path : stdout_logs) {
    EXPECT_EQ(path.parent_path().parent_path().filename(), "attempt_0");
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    EXPECT_NE(text.str().find("WORLD_SIZE=2"), std::string::npos) << path;
  }
  // Local rank 0 is teed to the console, local rank 1 only redirected.
  EXPECT_NE(run->output().find("[default0]:ENV 0 WORLD_SIZE=2"), std::string::npos);
  EXPECT_EQ(run->output().find("ENV 1 WORLD_SIZE=2"), std::string::npos) << run->output();
  fs::remove_all(dir);
}

TEST_F(LauncherTest, BadFlagsGiveOneLineAndExitTwo) {
  // Run ids the daemon would refuse, an endpoint nobody can reach and a
  // filter hiding every worker's output are refused here too, not when the
  // agent joins (exit 1, or no message at all for a long run id).
  for (std::vector<std::string> args : std::vector<std::vector<std::string>>{
           {"--nnodes=3:1", "x.py"},
           {"--no-such-flag", "x.py"},
           {"--standalone"},
           {"--rdzv-backend=c10d", "--rdzv-id=my job", "x.py"},
           {"--rdzv-backend=c10d", "--rdzv-id=" + std::string(300, 'j'), "x.py"},
           {"--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:0", "x.py"},
           {"--nproc-per-node=2", "--local-ranks-filter=2", "x.py"}}) {
    auto run = Launch(args);
    EXPECT_EQ(ExitCode(*run), 2) << run->output();
    EXPECT_EQ(Count(run->output(), "\n"), 1u) << run->output();
    EXPECT_EQ(run->output().rfind("meshrun: ", 0), 0u) << run->output();
  }
  auto run = Launch({"--rdzv-backend=c10d", "--rdzv-id=caf\xc3\xa9", "x.py"});
  EXPECT_EQ(ExitCode(*run), 2);
  EXPECT_EQ(run->output(),
            "meshrun: --rdzv-id: byte 0xc3 at offset 3 is not allowed (printable ASCII "
            "without spaces only)\n");
}

// `meshrun` under prlimit's `limits` (e.g. "--nofile=10:10") against
// `daemon`, one node and one /bin/true worker, with `tmpdir` as its TMPDIR
// (where its temporary log root goes).
std::unique_ptr<ChildProcess> LaunchLimited(const std::vector<std::string>& limits,
                                            DaemonProcess& daemon, const std::string& id,
                                            const std::string& tmpdir) {
  std::vector<std::string> argv{"/usr/bin/env", "TMPDIR=" + tmpdir, "/usr/bin/prlimit"};
  argv.insert(argv.end(), limits.begin(), limits.end());
  for (const std::string& arg :
       {std::string("--"), BinDir() + "/meshrun", std::string("--nnodes=1"),
        std::string("--rdzv-backend=c10d"), "--rdzv-endpoint=" + daemon.endpoint(),
        "--rdzv-id=" + id, std::string("--no-python"), std::string("/bin/true")})
    argv.push_back(arg);
  return std::make_unique<ChildProcess>(argv, /*merge_stderr=*/true);
}

// The lines of `output` that are not the agent's log lines ("[time] [name]").
std::vector<std::string> NonLogLines(const std::string& output) {
  std::vector<std::string> lines;
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);)
    if (line.rfind("[", 0) != 0) lines.push_back(line);
  return lines;
}

// Issue 27 item 11: 1,000 agents on one machine ran it out of threads
// (kernel.pid_max), and agents died of SIGABRT (std::thread throwing) or hung
// in gRPC. An agent that cannot get a thread says so in one line and exits
// kResourceExitCode (71). Here no thread can get its stack: each needs 1 GiB
// (RLIMIT_STACK) and the process may map 512 MiB in all.
TEST_F(LauncherTest, AgentThatCannotGetAThreadSaysSoInOneLine) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "ASan's shadow memory does not fit in RLIMIT_AS";
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
  GTEST_SKIP() << "ASan's shadow memory does not fit in RLIMIT_AS";
#endif
#endif
  DaemonProcess daemon;
  TempDir tmp;
  auto run = LaunchLimited({"--stack=1073741824", "--as=536870912"}, daemon, "threads",
                           tmp.path());
  EXPECT_EQ(ExitCode(*run, seconds(30)), 71) << run->output();
  auto lines = NonLogLines(run->output());
  ASSERT_EQ(lines.size(), 1u) << run->output();
  EXPECT_EQ(lines[0].rfind(
                "meshrun: cannot create a thread: Resource temporarily unavailable (", 0),
            0u)
      << lines[0];
  EXPECT_NE(lines[0].find("kernel.pid_max"), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find("RLIMIT_AS 512 MiB"), std::string::npos) << lines[0];
  // Its temporary log root is gone, as after an orderly exit.
  EXPECT_TRUE(fs::is_empty(tmp.path())) << fs::directory_iterator(tmp.path())->path();
  EXPECT_TRUE(daemon.process().Running());
}

// Issue 27 item 11: with too few descriptors gRPC aborted at its start; the
// launcher checks RLIMIT_NOFILE first.
TEST_F(LauncherTest, AgentThatCannotGetDescriptorsSaysSoInOneLine) {
  DaemonProcess daemon;
  TempDir tmp;
  auto run = LaunchLimited({"--nofile=10:10"}, daemon, "descriptors", tmp.path());
  EXPECT_EQ(ExitCode(*run, seconds(30)), 71) << run->output();
  auto lines = NonLogLines(run->output());
  ASSERT_EQ(lines.size(), 1u) << run->output();
  EXPECT_EQ(lines[0].rfind("meshrun: cannot get the file descriptors it needs: "
                           "RLIMIT_NOFILE allows 10 (hard limit 10)",
                           0),
            0u)
      << lines[0];
  EXPECT_NE(lines[0].find("raise `ulimit -n`"), std::string::npos) << lines[0];
}

// The daemon an agent hosts raises the agent's descriptor limit (to the
// hard one); workers still start with the soft limit the agent was given,
// as under torchrun.
TEST_F(LauncherTest, WorkersGetTheDescriptorLimitTheLauncherStartedWith) {
  ChildProcess run({"/usr/bin/prlimit", "--nofile=1024:8192", "--", BinDir() + "/meshrun",
                    "--standalone", "--nproc-per-node=1", "--no-python", "/bin/sh", "-c",
                    "echo SOFT=$(ulimit -Sn) HARD=$(ulimit -Hn)"},
                   /*merge_stderr=*/true);
  ASSERT_EQ(ExitCode(run, seconds(60)), 0) << run.output();
  EXPECT_NE(run.output().find("SOFT=1024 HARD=8192"), std::string::npos) << run.output();
}

}  // namespace
}  // namespace meshrun
