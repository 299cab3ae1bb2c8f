// meshrun-rdzvd replicas on etcd, end to end: a real three-member etcd
// cluster (Debian's etcd-server) and three real daemons, each on a "control
// host" of its own (a network namespace; netns_lab.h), and clients on a
// worker host. The leader's host is cut off and its daemon SIGKILLed, a
// leader is paused past its lease, etcd is cut off from every daemon, and
// bad etcd settings are given: what a daemon acknowledged is never lost, a
// daemon that lost its lease never serves again once another leads, and bad
// input is refused with one line and exit 2 before anything is written.
// Needs root, iproute2 and etcd (skipped, with the reason, otherwise).

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/e2e/netns_lab.h"
#include "tests/support/child_process.h"
#include "tests/support/text.h"

namespace meshrun {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using testing::BinDir;
using testing::ChildProcess;
using testing::Count;
using testing::ExitCode;
using testing::NetnsLab;
namespace fs = std::filesystem;

constexpr char kEtcd[] = "/usr/bin/etcd";
constexpr char kEtcdctl[] = "/usr/bin/etcdctl";
// Hosts of the lab: etcd members, daemons, then a client host and a second
// worker host (the client host is the first).
constexpr int kMembers = 3;
constexpr int kDaemons = 3;
constexpr int kFirstDaemonHost = kMembers;
constexpr int kClientHost = kMembers + kDaemons;
constexpr int kWorkerHosts[] = {kClientHost, kClientHost + 1};
constexpr int kHosts = kClientHost + 2;
const std::string kFtProgram =
    std::string(MESHRUN_SOURCE_DIR) + "/bench/recovery/ft_python_recovery.py";
const std::string kDdpScript = std::string(MESHRUN_SOURCE_DIR) + "/examples/ddp_train.py";
const std::string kFollowWorker =
    std::string(MESHRUN_SOURCE_DIR) + "/tests/integration/workers/follow_worker.py";
constexpr int kDaemonPort = 29400;

class EtcdFailoverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (auto why = NetnsLab::Unavailable()) GTEST_SKIP() << *why;
    if (access(kEtcd, X_OK) != 0 || access(kEtcdctl, X_OK) != 0)
      GTEST_SKIP() << "no etcd here (install etcd-server and etcd-client)";
    lab_ = std::make_unique<NetnsLab>(kHosts);
    char dir[] = "/tmp/meshrun-etcd-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
  }

  void TearDown() override {
    if (HasFailure()) {
      for (int i = 0; i < kDaemons; ++i) {
        if (!daemons_[i]) continue;
        daemons_[i]->ReadLine(milliseconds(100));
        std::printf("daemon %d:\n%s\n", i, daemons_[i]->output().c_str());
      }
    }
    for (auto& daemon : daemons_)
      daemon.reset();  // ended by pid before their namespaces go
    clients_.clear();
    members_.clear();
    lab_.reset();
    if (!dir_.empty()) fs::remove_all(dir_);
  }

  std::string MemberUrl(int member, int port) const {
    return "http://" + lab_->node_address(member) + ":" + std::to_string(port);
  }
  std::string EtcdEndpoints(int members = kMembers) const {
    std::string list;
    for (int i = 0; i < members; ++i)
      list += (i ? "," : "") + lab_->node_address(i) + ":2379";
    return list;
  }

  // A cluster of `members` members, one per host from host 0. Fast
  // heartbeats, so that losing a member's raft leader costs about a second.
  void StartEtcd(int members = kMembers) {
    std::string cluster;
    for (int i = 0; i < members; ++i)
      cluster += (i ? "," : "") + ("e" + std::to_string(i) + "=" + MemberUrl(i, 2380));
    for (int i = 0; i < members; ++i) {
      const std::string name = "e" + std::to_string(i);
      // Its log to a file: etcd writes much at start, and a pipe nobody
      // reads would stop it. (exec: the pid stays etcd's.)
      const std::string command =
          std::string("exec ") + kEtcd + " --name " + name + " --data-dir " + dir_ + "/" +
          name + " --listen-client-urls " + MemberUrl(i, 2379) +
          " --advertise-client-urls " + MemberUrl(i, 2379) + " --listen-peer-urls " +
          MemberUrl(i, 2380) + " --initial-advertise-peer-urls " + MemberUrl(i, 2380) +
          " --initial-cluster " + cluster +
          " --initial-cluster-state new --heartbeat-interval 100 --election-timeout 1000"
          " --auto-compaction-mode revision --auto-compaction-retention 1000 > " +
          dir_ + "/" + name + ".log 2>&1";
      members_.push_back(
          std::make_unique<ChildProcess>(lab_->InNode(i, {"/bin/sh", "-c", command})));
    }
    // Until every member serves (etcdctl's calls here need it; daemons do
    // not: DaemonsStartedBeforeEtcdLeadOnceItServes).
    const auto deadline = std::chrono::steady_clock::now() + seconds(60);
    int code = -1;
    while (std::chrono::steady_clock::now() < deadline) {
      Etcdctl({"endpoint", "health"}, &code, EtcdEndpoints(members));
      if (code == 0) break;
      std::this_thread::sleep_for(milliseconds(200));
    }
    ASSERT_EQ(code, 0) << "etcd did not come up";
  }

  // etcdctl on the client host; its output.
  std::string Etcdctl(const std::vector<std::string>& args, int* code = nullptr,
                      const std::string& endpoints = "") {
    std::vector<std::string> argv{"/usr/bin/env",
                                  "ETCDCTL_API=3",
                                  kEtcdctl,
                                  "--endpoints",
                                  endpoints.empty() ? EtcdEndpoints() : endpoints,
                                  "--dial-timeout",
                                  "5s"};
    argv.insert(argv.end(), args.begin(), args.end());
    ChildProcess ctl(lab_->InNode(kClientHost, argv), /*merge_stderr=*/true);
    int exit_code = ExitCode(ctl, seconds(60));
    if (code) *code = exit_code;
    return ctl.output();
  }

  // The daemon on control host `index`; its stdout and stderr merged.
  // The lease: the daemon's default, 3 s. (At 2 s, four torch workers
  // starting on two cores beside three etcd members delayed the leader's
  // keep-alives past its lease once: a needless failover.)
  ChildProcess& StartDaemon(int index, const std::vector<std::string>& extra = {},
                            int members = kMembers, int lease_s = 3) {
    std::vector<std::string> argv{BinDir() + "/meshrun-rdzvd",
                                  "--host",
                                  lab_->node_address(kFirstDaemonHost + index),
                                  "--port",
                                  std::to_string(kDaemonPort),
                                  "--metrics-port",
                                  "9400",
                                  "--etcd-endpoints",
                                  EtcdEndpoints(members),
                                  "--etcd-lease-ttl",
                                  std::to_string(lease_s)};
    argv.insert(argv.end(), extra.begin(), extra.end());
    daemons_[index] =
        std::make_unique<ChildProcess>(lab_->InNode(kFirstDaemonHost + index, argv),
                                       /*merge_stderr=*/true);
    return *daemons_[index];
  }
  std::string DaemonEndpoint(int index) const {
    return lab_->node_address(kFirstDaemonHost + index) + ":" +
           std::to_string(kDaemonPort);
  }

  // Whether `process` has printed `needle` (ever), reading its output for up
  // to `timeout`.
  static bool Saw(ChildProcess& process, const std::string& needle,
                  milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (process.output().find(needle) == std::string::npos) {
      if (std::chrono::steady_clock::now() >= deadline) return false;
      process.ReadLine(milliseconds(20));
    }
    return true;
  }

  // Which daemon serves, once one does within `timeout`: -1 if none. (A
  // daemon that served before, now gone, is named in `except`.)
  int WaitForLeader(seconds timeout, std::vector<int> except = {}) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      for (int i = 0; i < kDaemons; ++i) {
        if (std::find(except.begin(), except.end(), i) != except.end() || !daemons_[i])
          continue;
        if (Saw(*daemons_[i], "MESHRUN_RDZVD_ENDPOINT=", milliseconds(20))) return i;
      }
    }
    for (int i = 0; i < kDaemons; ++i) {
      if (daemons_[i]) std::printf("daemon %d:\n%s\n", i, daemons_[i]->output().c_str());
    }
    for (size_t i = 0; i < members_.size(); ++i) {
      std::ifstream log(dir_ + "/e" + std::to_string(i) + ".log");
      std::string out((std::istreambuf_iterator<char>(log)), {});
      std::printf("etcd member %zu (the end of its log):\n%s\n", i,
                  out.substr(out.size() > 3000 ? out.size() - 3000 : 0).c_str());
    }
    return -1;
  }

  // Three etcd members and three daemons (lease `lease_s`); the leader's
  // index, -1 if none leads.
  int StartReplicas(int lease_s) {
    StartEtcd();
    for (int i = 0; i < kDaemons; ++i) StartDaemon(i, {}, kMembers, lease_s);
    return WaitForLeader(seconds(60));
  }
  // Every daemon, as agents' --rdzv-endpoint lists them.
  std::string DaemonList() const {
    std::string list;
    for (int i = 0; i < kDaemons; ++i) list += (i ? "," : "") + DaemonEndpoint(i);
    return list;
  }
  // `meshrun` on worker host `node` of an `nnodes`-node, two-worker job over
  // every daemon, with a 30 s reconnect grace; `env` before it (env(1)),
  // `tail` (flags, then the program) after it.
  std::unique_ptr<ChildProcess> StartAgent(int node, const std::string& run_id,
                                           const std::vector<std::string>& env,
                                           const std::vector<std::string>& tail,
                                           int nnodes = 2) {
    const int host = kWorkerHosts[node];
    std::vector<std::string> argv{"/usr/bin/env", "PYTHON_EXEC=" MESHRUN_PYTHON,
                                  "GLOO_SOCKET_IFNAME=" + lab_->node_interface(host),
                                  "OMP_NUM_THREADS=1"};
    argv.insert(argv.end(), env.begin(), env.end());
    for (const std::string& arg :
         {BinDir() + "/meshrun", "--nnodes=" + std::to_string(nnodes),
          std::string("--nproc-per-node=2"), std::string("--rdzv-backend=c10d"),
          "--rdzv-endpoint=" + DaemonList(), "--rdzv-id=" + run_id,
          std::string("--rdzv-conf=keep_alive_interval=1,keep_alive_max_attempt=30"),
          "--node-rank=" + std::to_string(node),
          "--local-addr=" + lab_->node_address(host)})
      argv.push_back(arg);
    argv.insert(argv.end(), tail.begin(), tail.end());
    return std::make_unique<ChildProcess>(lab_->InNode(host, argv),
                                          /*merge_stderr=*/true);
  }
  // The leader's host goes (link down, daemon SIGKILLed); the next leader.
  int LoseLeadersHost(int leader) {
    lab_->Cut(kFirstDaemonHost + leader);
    daemons_[leader]->Signal(SIGKILL);
    return WaitForLeader(seconds(30), {leader});
  }

  // The store tool on the client host: `args` after ENDPOINT NAMESPACE.
  ChildProcess& Store(int daemon, const std::vector<std::string>& args) {
    std::vector<std::string> argv{BinDir() + "/store_tool", DaemonEndpoint(daemon),
                                  "run/"};
    argv.insert(argv.end(), args.begin(), args.end());
    clients_.push_back(
        std::make_unique<ChildProcess>(lab_->InNode(kClientHost, argv), true));
    return *clients_.back();
  }
  void Set(int daemon, const std::string& key, const std::string& value) {
    ChildProcess& set = Store(daemon, {"set", key, value});
    ASSERT_EQ(ExitCode(set, seconds(30)), 0) << set.output();
  }
  // Whether `key` is in the store of `daemon` (a wait that returns at once).
  bool Has(int daemon, const std::string& key) {
    ChildProcess& wait = Store(daemon, {"wait", key, "2000"});
    return ExitCode(wait, seconds(30)) == 0;
  }

  // `path` (/metrics, /api/status) of a daemon's HTTP port, fetched on the
  // client host.
  std::string Http(int daemon, const std::string& path) {
    ChildProcess curl(
        lab_->InNode(
            kClientHost,
            {"/usr/bin/curl", "-s", "--max-time", "5",
             "http://" + lab_->node_address(kFirstDaemonHost + daemon) + ":9400" + path}),
        true);
    ExitCode(curl, seconds(20));
    return curl.output();
  }
  std::string Metrics(int daemon) { return Http(daemon, "/metrics"); }

  std::unique_ptr<NetnsLab> lab_;
  std::string dir_;
  std::vector<std::unique_ptr<ChildProcess>> members_;
  std::unique_ptr<ChildProcess> daemons_[kDaemons];
  std::vector<std::unique_ptr<ChildProcess>> clients_;
};

TEST_F(EtcdFailoverTest, LeadersHostLostThenAnEtcdMemberAndNothingAcknowledgedIsLost) {
  StartEtcd();
  for (int i = 0; i < kDaemons; ++i) StartDaemon(i);
  const int first = WaitForLeader(seconds(60));
  ASSERT_GE(first, 0) << "no daemon leads";
  for (int i = 0; i < kDaemons; ++i) {
    if (i == first) continue;
    ASSERT_TRUE(Saw(*daemons_[i], "MESHRUN_RDZVD_STANDBY=", seconds(30)))
        << daemons_[i]->output();
    EXPECT_FALSE(Saw(*daemons_[i], "MESHRUN_RDZVD_ENDPOINT=", milliseconds(100)));
  }
  for (int k = 0; k < 20; ++k) Set(first, "k" + std::to_string(k), "v");

  // The leader's host goes: its link down, its daemon SIGKILLed.
  lab_->Cut(kFirstDaemonHost + first);
  daemons_[first]->Signal(SIGKILL);
  const auto lost = std::chrono::steady_clock::now();
  const int second = WaitForLeader(seconds(30), {first});
  ASSERT_GE(second, 0) << "no standby took over";
  const double takeover_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - lost).count();
  std::printf("takeover after %.2f s (lease 3 s)\n", takeover_s);
  for (int k = 0; k < 20; ++k)
    EXPECT_TRUE(Has(second, "k" + std::to_string(k))) << "k" << k << " lost";
  Set(second, "after-first", "v");

  // Then an etcd member too (the one the new leader talks to first, as
  // likely as any other): two of three keep the quorum.
  members_[0]->Signal(SIGKILL);
  Set(second, "after-member", "v");
  EXPECT_TRUE(Has(second, "k0"));
  EXPECT_TRUE(Has(second, "after-first"));

  // And the last standby takes over from the second leader with all of it.
  daemons_[second]->Signal(SIGKILL);
  const int third = WaitForLeader(seconds(30), {first, second});
  ASSERT_GE(third, 0);
  for (const char* key : {"k0", "k19", "after-first", "after-member"})
    EXPECT_TRUE(Has(third, key)) << key << " lost";

  // The first leader's host comes back with a new daemon: it stands by.
  lab_->Heal(kFirstDaemonHost + first);
  ChildProcess& back = StartDaemon(first);
  ASSERT_TRUE(
      Saw(back, "standing by: the leader is " + DaemonEndpoint(third), seconds(30)))
      << back.output();
  EXPECT_FALSE(Saw(back, "MESHRUN_RDZVD_ENDPOINT=", seconds(3))) << back.output();
}

// How many times `process` has printed `needle`, reading its output until
// that is `want` or `timeout` passed.
size_t AwaitCount(ChildProcess& process, const std::string& needle, size_t want,
                  seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (Count(process.output(), needle) < want &&
         std::chrono::steady_clock::now() < deadline)
    process.ReadLine(milliseconds(200));
  return Count(process.output(), needle);
}

TEST_F(EtcdFailoverTest, AgentsFollowTheNewLeaderWithoutRestartingWorkers) {
  const int first = StartReplicas(/*lease_s=*/5);
  ASSERT_GE(first, 0);
  // Two nodes of two workers; each does store traffic through its agent's
  // relay and through the list (follow_worker.py), until the test says go.
  // Their store_tool runs wait for the next leader (a dead first address
  // costs a 3 s connect on each pass of the list).
  const std::string go = dir_ + "/go";
  std::unique_ptr<ChildProcess> agents[2];
  for (int node = 0; node < 2; ++node) {
    agents[node] = StartAgent(
        node, "etcd-job", {"STORE_TOOL_CONNECT_MS=30000"},
        {"--shutdown-timeout=5", kFollowWorker, go, "240", BinDir() + "/store_tool"});
  }
  for (auto& agent : agents) {
    ASSERT_EQ(AwaitCount(*agent, "STORED rank=", 2, seconds(300)), 2u) << agent->output();
  }

  // The leader's host goes; a standby leads within about the lease (5 s).
  ASSERT_GE(LoseLeadersHost(first), 0);
  for (auto& agent : agents) {
    ASSERT_TRUE(Saw(*agent, "reconnected to the rendezvous daemon", seconds(60)))
        << agent->output();
  }
  // For the record: when each agent lost the leader and found the next.
  for (auto& agent : agents) {
    std::istringstream lines(agent->output());
    for (std::string line; std::getline(lines, line);) {
      if (line.find("rendezvous daemon") != std::string::npos)
        std::printf("%s\n", line.c_str());
    }
  }
  std::ofstream(go) << "go\n";
  for (auto& agent : agents) {
    EXPECT_EQ(ExitCode(*agent, seconds(120)), 0) << agent->output();
    // The same two workers ran to the end (no restart), having read every
    // key written before the failover.
    EXPECT_EQ(Count(agent->output(), "WORKER rank="), 4u) << agent->output();
    EXPECT_EQ(Count(agent->output(), "restart=0"), 2u) << agent->output();
    EXPECT_EQ(Count(agent->output(), " done reads="), 2u) << agent->output();
  }
}

// "epoch E loss L" lines of rank 0, in order.
std::vector<double> EpochLosses(const std::string& output) {
  std::vector<double> losses;
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);) {
    int epoch = 0;
    double loss = 0;
    const size_t at = line.find("epoch ");
    if (at != std::string::npos &&
        std::sscanf(line.c_str() + at, "epoch %d loss %lf", &epoch, &loss) == 2)
      losses.push_back(loss);
  }
  return losses;
}

// A PyTorch DDP script, unchanged (examples/ddp_train.py, Gloo between the
// two worker hosts), under the default restart scope: the leader's host is
// lost mid-training, then an etcd member. No worker restarts, and the run
// trains to the losses of the same job run on one host with nothing lost.
TEST_F(EtcdFailoverTest, DdpJobLosesTheLeadersHostAndAnEtcdMemberWithoutARestart) {
  const int first = StartReplicas(/*lease_s=*/5);
  ASSERT_GE(first, 0);
  const std::vector<std::string> script = {kDdpScript, "--epochs", "80", "--samples",
                                           "2048"};
  std::unique_ptr<ChildProcess> agents[2];
  for (int node = 0; node < 2; ++node)
    agents[node] = StartAgent(node, "etcd-ddp", {}, script);
  ASSERT_TRUE(Saw(*agents[0], "epoch 2 loss", seconds(240))) << agents[0]->output();

  ASSERT_GE(LoseLeadersHost(first), 0);
  for (auto& agent : agents) {
    ASSERT_TRUE(Saw(*agent, "reconnected to the rendezvous daemon", seconds(60)))
        << agent->output();
  }
  members_[0]->Signal(SIGKILL);  // two of three members keep etcd's quorum
  for (auto& agent : agents)
    EXPECT_EQ(ExitCode(*agent, seconds(300)), 0) << agent->output();
  const std::string& out = agents[0]->output();
  EXPECT_EQ(Count(out, "restart_count="), 1u) << out;
  EXPECT_NE(out.find("world_size=4 restart_count=0"), std::string::npos) << out;
  // Trained on through the failover: its last epoch came after it.
  EXPECT_LT(out.find("lost the rendezvous daemon"), out.find("epoch 79 loss")) << out;

  // The same job on one host (the same ranks and world): the same losses.
  std::vector<std::string> standalone{"/usr/bin/env",      "PYTHON_EXEC=" MESHRUN_PYTHON,
                                      "OMP_NUM_THREADS=1", BinDir() + "/meshrun",
                                      "--standalone",      "--nproc-per-node=4"};
  standalone.insert(standalone.end(), script.begin(), script.end());
  auto alone = std::make_unique<ChildProcess>(lab_->InNode(kClientHost, standalone),
                                              /*merge_stderr=*/true);
  ASSERT_EQ(ExitCode(*alone, seconds(300)), 0) << alone->output();
  const std::vector<double> want = EpochLosses(alone->output());
  const std::vector<double> got = EpochLosses(out);
  ASSERT_EQ(want.size(), 80u) << alone->output();
  ASSERT_EQ(got.size(), want.size()) << out;
  for (size_t e = 0; e < want.size(); ++e)
    EXPECT_NEAR(got[e], want[e], 1e-5 + 1e-4 * want[e]) << "epoch " << e;
}

// A meshrun.ft program (the recovery benchmark's GPT, four replica groups of
// one worker on two hosts) under --restart-scope=replica: the leader's host
// is lost mid-training, then an etcd member. No worker restarts and no
// committed step is trained twice: rank 0's step lines rise one by one,
// except across a heal (its group voted a step down that the others
// committed when the leader went, and copied their state), to the last.
TEST_F(EtcdFailoverTest, FtProgramLosesTheLeadersHostAndAnEtcdMemberWithoutARestart) {
  const int first = StartReplicas(/*lease_s=*/5);
  ASSERT_GE(first, 0);
  constexpr int kSteps = 40;
  std::unique_ptr<ChildProcess> agents[2];
  for (int node = 0; node < 2; ++node) {
    agents[node] =
        StartAgent(node, "etcd-ft", {"PYTHONPATH=" MESHRUN_PYTHONPATH},
                   {"--restart-scope=replica", "--replica-size=1", "--no-python",
                    MESHRUN_PYTHON, "-u", kFtProgram, "--system=meshrun",
                    "--sizes=parity", "--steps=" + std::to_string(kSteps)});
  }
  // Rank 0 (on the first host) prints the steps.
  ASSERT_TRUE(Saw(*agents[0], "step 10 loss", seconds(240))) << agents[0]->output();
  ASSERT_GE(LoseLeadersHost(first), 0);
  ASSERT_TRUE(Saw(*agents[0], "reconnected to the rendezvous daemon", seconds(60)))
      << agents[0]->output();
  members_[0]->Signal(SIGKILL);
  for (auto& agent : agents)
    EXPECT_EQ(ExitCode(*agent, seconds(300)), 0) << agent->output();
  const std::string& out = agents[0]->output();
  EXPECT_EQ(Count(out, "incarnation 0"), 2u) << out;
  EXPECT_EQ(Count(out, "incarnation 1"), 0u) << out;
  // A step voted down everywhere at the failover is trained again under its
  // own number (a discard, not a loss): its line comes once.
  int last = -1;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    int step = 0, healed_at = 0;
    if (line.rfind("step ", 0) == 0 && line.find(" loss ") != std::string::npos &&
        std::sscanf(line.c_str(), "step %d loss", &step) == 1) {
      EXPECT_EQ(step, last + 1) << line << "\n" << out;
      last = step;
    } else if (const size_t at = line.find(" at step ");
               line.find("replica 0 member 0 healed from replica") != std::string::npos &&
               std::sscanf(line.c_str() + at, " at step %d", &healed_at) == 1) {
      EXPECT_GT(healed_at, last) << line << "\n" << out;  // forward, never back
      last = healed_at - 1;
    }
  }
  EXPECT_EQ(last, kSteps - 1) << out;
  EXPECT_LT(out.find("lost the rendezvous daemon"),
            out.find("step " + std::to_string(kSteps - 1) + " loss"))
      << out;
}

TEST_F(EtcdFailoverTest, PausedLeaderNeverServesAgainOnceAnotherLeads) {
  StartEtcd();
  StartDaemon(0);
  ASSERT_EQ(WaitForLeader(seconds(60)), 0);
  StartDaemon(1);
  ASSERT_TRUE(Saw(*daemons_[1], "MESHRUN_RDZVD_STANDBY=", seconds(30)));
  Set(0, "before", "v");

  // Paused past its lease (3 s): the standby takes over.
  daemons_[0]->Signal(SIGSTOP);
  ASSERT_EQ(WaitForLeader(seconds(30), {0}), 1) << daemons_[1]->output();
  Set(1, "during", "v");

  // Resumed, the old leader finds another leading and exits with 75 rather
  // than serve what it holds (which lacks "during").
  daemons_[0]->Signal(SIGCONT);
  EXPECT_EQ(ExitCode(*daemons_[0], seconds(30)), 75) << daemons_[0]->output();
  EXPECT_NE(daemons_[0]->output().find("lost the leadership"), std::string::npos)
      << daemons_[0]->output();
  EXPECT_TRUE(Has(1, "before"));
  EXPECT_TRUE(Has(1, "during"));
  Set(1, "after", "v");
  // One leader key, the second daemon's, in term 2.
  const std::string leader = Etcdctl({"get", "/meshrun/leader", "--print-value-only"});
  EXPECT_NE(leader.find(DaemonEndpoint(1) + " term=2 "), std::string::npos) << leader;
}

// etcd out of reach of the leading daemon: a two-node run keeps its round
// and its workers (agents' heartbeats need no write), a new run's round and
// a store write are held unacknowledged until etcd is back, and /metrics
// and the status say so.
TEST_F(EtcdFailoverTest, EtcdOutOfReachHoldsWritesAndLosesNothing) {
  StartEtcd();
  StartDaemon(0);
  ASSERT_EQ(WaitForLeader(seconds(60)), 0);
  ASSERT_TRUE(Saw(*daemons_[0], "MESHRUN_RDZVD_METRICS=", seconds(10)));
  Set(0, "before", "v");
  EXPECT_NE(Metrics(0).find("meshrun_etcd_reachable 1"), std::string::npos);
  EXPECT_NE(Http(0, "/api/status").find(R"("reachable":true)"), std::string::npos);

  // Workers (no torch: only the round matters) that wait for the test's go.
  const std::string go = dir_ + "/go";
  const std::string worker =
      "echo WORKER rank=$RANK restart=$TORCHELASTIC_RESTART_COUNT; "
      "while [ ! -e " +
      go + " ]; do sleep 0.1; done";
  std::unique_ptr<ChildProcess> agents[2];
  for (int node = 0; node < 2; ++node) {
    agents[node] =
        StartAgent(node, "etcd-out", {}, {"--no-python", "/bin/sh", "-c", worker});
  }
  for (auto& agent : agents) {
    ASSERT_EQ(AwaitCount(*agent, "WORKER rank=", 2, seconds(120)), 2u) << agent->output();
  }
  const std::string active = R"("run_id":"etcd-out","state":"active","outcome":"",)"
                             R"("closed_reason":"","round":1,)";
  ASSERT_NE(Http(0, "/api/status").find(active), std::string::npos)
      << Http(0, "/api/status");

  for (int i = 0; i < kMembers; ++i) lab_->Cut(i);
  // A write now is held, not acknowledged, until etcd is back.
  ChildProcess& held = Store(0, {"set", "during", "v"});
  std::string metrics;
  for (int i = 0; i < 100; ++i) {
    metrics = Metrics(0);
    if (metrics.find("meshrun_etcd_reachable 0") != std::string::npos) break;
    std::this_thread::sleep_for(milliseconds(200));
  }
  EXPECT_NE(metrics.find("meshrun_etcd_reachable 0"), std::string::npos) << metrics;
  // No new round meanwhile: a one-node run that joins now forms, but its
  // assignment waits for etcd (a round the next leader would not know must
  // not start workers).
  auto newcomer = StartAgent(0, "etcd-new", {},
                             {"--no-python", "/bin/sh", "-c", "echo NEW rank=$RANK"},
                             /*nnodes=*/1);
  // Longer than the agents' heartbeat grace would allow a daemon that
  // stopped answering them (keep_alive_interval=1 s).
  std::this_thread::sleep_for(seconds(5));
  EXPECT_FALSE(Saw(*newcomer, "round 1:", seconds(1))) << newcomer->output();
  const std::string status = Http(0, "/api/status");
  EXPECT_NE(status.find(R"("reachable":false)"), std::string::npos) << status;
  EXPECT_NE(status.find(active), std::string::npos) << status;
  EXPECT_TRUE(held.Running()) << "acknowledged while etcd was out of reach: "
                              << held.output();
  // Replies wait behind the held write (one might show it before it is
  // durable), but the daemon still leads and answers /metrics.
  EXPECT_TRUE(daemons_[0]->Running()) << daemons_[0]->output();

  for (int i = 0; i < kMembers; ++i) lab_->Heal(i);
  EXPECT_EQ(ExitCode(held, seconds(60)), 0) << held.output();
  EXPECT_TRUE(Has(0, "before"));
  EXPECT_TRUE(Has(0, "during"));
  EXPECT_TRUE(daemons_[0]->Running()) << daemons_[0]->output();
  for (int i = 0; i < 100; ++i) {
    metrics = Metrics(0);
    if (metrics.find("meshrun_etcd_reachable 1") != std::string::npos) break;
    std::this_thread::sleep_for(milliseconds(200));
  }
  EXPECT_NE(metrics.find("meshrun_etcd_reachable 1"), std::string::npos) << metrics;
  EXPECT_EQ(ExitCode(*newcomer, seconds(60)), 0) << newcomer->output();
  EXPECT_EQ(Count(newcomer->output(), "NEW rank="), 2u) << newcomer->output();

  // The run goes on in its round with its first workers, and ends.
  std::ofstream(go) << "go\n";
  for (auto& agent : agents) {
    EXPECT_EQ(ExitCode(*agent, seconds(60)), 0) << agent->output();
    EXPECT_EQ(Count(agent->output(), "restart=0"), 2u) << agent->output();
    EXPECT_EQ(Count(agent->output(), "WORKER rank="), 2u) << agent->output();
  }
}

// Daemons started before their etcd (a whole control plane booting at once)
// dial it until it serves, and one leads. Until the etcd client polled its
// connections itself, their attempts advanced only with gRPC's 5 s backup
// poller and never completed: every daemon gave up after its dial timeout.
TEST_F(EtcdFailoverTest, DaemonsStartedBeforeEtcdLeadOnceItServes) {
  for (int i = 0; i < kDaemons; ++i) StartDaemon(i, {"--etcd-dial-timeout=60"});
  // Refused for a while: each daemon's channels are past their first
  // attempts and retry in the background.
  std::this_thread::sleep_for(seconds(3));
  for (int i = 0; i < kDaemons; ++i) ASSERT_TRUE(daemons_[i]->Running()) << i;
  StartEtcd();
  const int leader = WaitForLeader(seconds(30));
  ASSERT_GE(leader, 0);
  for (int i = 0; i < kDaemons; ++i) {
    if (i != leader)
      EXPECT_TRUE(Saw(*daemons_[i], "MESHRUN_RDZVD_STANDBY=", seconds(30))) << i;
  }
}

// etcd over TLS with client certificates (--etcd-cacert, --etcd-cert,
// --etcd-key): daemons lead, persist and take over through it; one without a
// client certificate never reaches it and gives up at its dial timeout.
TEST_F(EtcdFailoverTest, DaemonsUseEtcdOverTlsWithClientCertificates) {
  const std::string tls = dir_ + "/tls";
  fs::create_directories(tls);
  const std::string script = R"(
set -e
cd "$1"
ec="-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"
openssl req -x509 $ec -keyout ca.key -out ca.pem -days 2 -subj /CN=ca 2>/dev/null
printf 'subjectAltName=IP:%s\n' "$2" > san.ext
for name in etcd client; do
  openssl req $ec -keyout $name.key -out $name.csr -subj /CN=$name 2>/dev/null
  openssl x509 -req -in $name.csr -CA ca.pem -CAkey ca.key -CAcreateserial \
    -out $name.pem -days 2 -extfile san.ext 2>/dev/null
done
chmod 600 *.key
)";
  ChildProcess openssl({"/bin/sh", "-c", script, "sh", tls, lab_->node_address(0)},
                       /*merge_stderr=*/true);
  ASSERT_EQ(ExitCode(openssl, seconds(60)), 0) << openssl.output();

  const std::string url = "https://" + lab_->node_address(0) + ":2379";
  const std::string command =
      std::string("exec ") + kEtcd + " --name e0 --data-dir " + dir_ + "/e0" +
      " --listen-client-urls " + url + " --advertise-client-urls " + url +
      " --listen-peer-urls " + MemberUrl(0, 2380) + " --initial-advertise-peer-urls " +
      MemberUrl(0, 2380) + " --initial-cluster e0=" + MemberUrl(0, 2380) +
      " --cert-file " + tls + "/etcd.pem --key-file " + tls + "/etcd.key" +
      " --trusted-ca-file " + tls + "/ca.pem --client-cert-auth > " + dir_ +
      "/e0.log 2>&1";
  members_.push_back(
      std::make_unique<ChildProcess>(lab_->InNode(0, {"/bin/sh", "-c", command})));
  const std::vector<std::string> with_certificate{"--etcd-cacert", tls + "/ca.pem",
                                                  "--etcd-cert",   tls + "/client.pem",
                                                  "--etcd-key",    tls + "/client.key"};
  StartDaemon(0, with_certificate, /*members=*/1);
  ASSERT_EQ(WaitForLeader(seconds(60)), 0);
  Set(0, "over-tls", "v");
  StartDaemon(1, with_certificate, /*members=*/1);
  ASSERT_TRUE(Saw(*daemons_[1], "MESHRUN_RDZVD_STANDBY=", seconds(30)))
      << daemons_[1]->output();
  daemons_[0]->Signal(SIGKILL);
  ASSERT_EQ(WaitForLeader(seconds(30), {0}), 1);
  EXPECT_TRUE(Has(1, "over-tls"));

  // The CA alone: etcd asks for a client certificate, and the handshake fails.
  StartDaemon(2, {"--etcd-cacert", tls + "/ca.pem", "--etcd-dial-timeout", "3"},
              /*members=*/1);
  EXPECT_EQ(ExitCode(*daemons_[2], seconds(60)), 1) << daemons_[2]->output();
  EXPECT_EQ(daemons_[2]->output().find("MESHRUN_RDZVD_STANDBY="), std::string::npos)
      << daemons_[2]->output();
}

TEST_F(EtcdFailoverTest, BadEtcdSettingsAreRefusedWithExit2AndNothingWritten) {
  StartEtcd(1);
  auto refused = [&](const std::vector<std::string>& flags, const std::string& why) {
    std::vector<std::string> argv{BinDir() + "/meshrun-rdzvd",
                                  "--host",
                                  lab_->node_address(kFirstDaemonHost),
                                  "--port",
                                  "0",
                                  "--etcd-dial-timeout",
                                  "30"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    ChildProcess daemon(lab_->InNode(kFirstDaemonHost, argv), /*merge_stderr=*/true);
    EXPECT_EQ(ExitCode(daemon, seconds(60)), 2) << daemon.output();
    EXPECT_NE(daemon.output().find(why), std::string::npos) << daemon.output();
    // One line, no stack trace.
    EXPECT_EQ(daemon.output().find('\n'), daemon.output().size() - 1) << daemon.output();
  };
  const std::string etcd = "--etcd-endpoints=" + EtcdEndpoints(1);
  refused({"--etcd-endpoints=nohost"}, "is not HOST:PORT");
  refused({etcd, "--state-dir", dir_ + "/state"}, "excludes");
  // Something that is not etcd: a meshrun-rdzvd (gRPC) and its HTTP port.
  ChildProcess other(lab_->InNode(kClientHost, {BinDir() + "/meshrun-rdzvd", "--host",
                                                lab_->node_address(kClientHost), "--port",
                                                "29400", "--metrics-port", "9400"}),
                     true);
  ASSERT_TRUE(other.ReadUntil("MESHRUN_RDZVD_METRICS=", seconds(20)));
  refused({"--etcd-endpoints=" + lab_->node_address(kClientHost) + ":29400"},
          "does not answer as etcd");
  refused({"--etcd-endpoints=" + lab_->node_address(kClientHost) + ":9400"},
          "does not answer as etcd");
  // A prefix holding keys that are not meshrun's, and another deployment's.
  int code = -1;
  Etcdctl({"put", "/theirs/config", "x"}, &code, EtcdEndpoints(1));
  ASSERT_EQ(code, 0);
  refused({etcd, "--etcd-prefix=/theirs/"}, "did not write");
  EXPECT_EQ(
      Etcdctl({"get", "--prefix", "/theirs/", "--keys-only"}, nullptr, EtcdEndpoints(1)),
      "/theirs/config\n\n");
  StartDaemon(0, {"--etcd-deployment", "blue"}, 1);
  ASSERT_EQ(WaitForLeader(seconds(60)), 0) << daemons_[0]->output();
  daemons_[0].reset();
  refused({etcd, "--etcd-deployment=green"}, "belongs to meshrun deployment 'blue'");
  // Authentication on: no user, and a wrong password.
  Etcdctl({"user", "add", "root:right"}, &code, EtcdEndpoints(1));
  ASSERT_EQ(code, 0);
  Etcdctl({"auth", "enable"}, &code, EtcdEndpoints(1));
  ASSERT_EQ(code, 0);
  std::ofstream(dir_ + "/wrong") << "wrong\n";
  fs::permissions(dir_ + "/wrong", fs::perms::owner_read | fs::perms::owner_write);
  refused({etcd, "--etcd-user=root", "--etcd-password-file=" + dir_ + "/wrong"},
          "refused user root");
  refused({etcd, "--etcd-deployment=blue"}, "user name is empty");
}

}  // namespace
}  // namespace meshrun
