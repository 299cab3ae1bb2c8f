// meshrun under a real SLURM cluster (Debian's slurmctld, slurmd, munge; see
// slurm_cluster.h): srun and sbatch steps of scripts/meshrun-slurm form one
// world with SLURM's node order as node ranks, scancel stops every worker,
// a worker failure restarts the world, exit codes reach srun, and a real
// PyTorch DDP script trains. Skipped, with the reason, without root or the
// packages.

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <thread>

#include "tests/e2e/slurm_cluster.h"
#include "tests/support/child_process.h"

namespace meshrun {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using testing::BinDir;
using testing::ChildProcess;
using testing::RunCommand;
using testing::SlurmCluster;
using Clock = std::chrono::steady_clock;

const std::string kSource = MESHRUN_SOURCE_DIR;
const std::string kWrapper = kSource + "/scripts/meshrun-slurm";
const std::string kWorker = kSource + "/tests/e2e/slurm_worker.sh";
const std::string kSrun = "/usr/bin/srun";

// One "WORKER k=v k=v ..." line of slurm_worker.sh.
using Worker = std::map<std::string, std::string>;

std::vector<Worker> Workers(const std::string& output) {
  std::vector<Worker> workers;
  std::stringstream lines(output);
  std::string line;
  while (std::getline(lines, line)) {
    size_t at = line.find("WORKER ");
    if (at == std::string::npos) continue;
    std::stringstream fields(line.substr(at + 7));
    Worker worker;
    std::string field;
    while (fields >> field) {
      size_t eq = field.find('=');
      if (eq != std::string::npos) worker[field.substr(0, eq)] = field.substr(eq + 1);
    }
    workers.push_back(worker);
  }
  return workers;
}

std::vector<Worker> OfAttempt(const std::vector<Worker>& workers, const std::string& n) {
  std::vector<Worker> out;
  for (const Worker& worker : workers) {
    if (worker.at("ATTEMPT") == n) out.push_back(worker);
  }
  return out;
}

// Two nodes of two workers: ranks 0..3 once each, node rank = SLURM_NODEID
// (rank 0 on the first node of the step's list), local ranks consecutive, one
// run id.
void ExpectOneWorldOfFour(const std::vector<Worker>& workers) {
  ASSERT_EQ(workers.size(), 4u);
  std::set<int> ranks;
  std::map<int, std::set<std::string>> nodes;  // SLURM_NODEID -> node names
  for (const Worker& w : workers) {
    int node = std::stoi(w.at("NODEID"));
    EXPECT_EQ(w.at("WORLD_SIZE"), "4");
    EXPECT_EQ(w.at("LOCAL_WORLD_SIZE"), "2");
    EXPECT_EQ(w.at("GROUP_RANK"), w.at("NODEID")) << "node rank follows SLURM_NODEID";
    EXPECT_EQ(std::stoi(w.at("RANK")), node * 2 + std::stoi(w.at("LOCAL_RANK")));
    EXPECT_EQ(w.at("RUN"), w.at("JOB") + ".0") << "run id is <job>.<step>";
    EXPECT_EQ(w.at("RUN"), workers.front().at("RUN"));
    ranks.insert(std::stoi(w.at("RANK")));
    nodes[node].insert(w.at("NODE"));
  }
  EXPECT_EQ(ranks, (std::set<int>{0, 1, 2, 3}));
  // SLURM numbers a step's nodes in node-list order (n1 < n2 < n3).
  ASSERT_EQ(nodes.size(), 2u);
  ASSERT_EQ(nodes[0].size(), 1u);
  ASSERT_EQ(nodes[1].size(), 1u);
  EXPECT_LT(*nodes[0].begin(), *nodes[1].begin());
}

int ExitCode(std::optional<int> status) {
  if (!status) return -1;
  return WIFEXITED(*status) ? WEXITSTATUS(*status) : 128 + WTERMSIG(*status);
}

// Pids of live processes whose environment says they belong to SLURM job
// `job` (meshrun, its workers, their children).
std::set<pid_t> ProcessesOfJob(const std::string& job) {
  std::set<pid_t> pids;
  const std::string needle = "SLURM_JOB_ID=" + job;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(entry.path() / "environ", std::ios::binary);
    std::string environ((std::istreambuf_iterator<char>(in)), {});
    size_t at = environ.find(needle);
    // A whole variable: not a prefix of SLURM_JOB_ID=<job>7.
    while (at != std::string::npos) {
      size_t end = at + needle.size();
      if ((at == 0 || environ[at - 1] == '\0') &&
          (end == environ.size() || environ[end] == '\0')) {
        // A zombie still has /proc/<pid>/environ only while unreaped; its
        // state says whether it runs.
        std::ifstream stat(entry.path() / "stat");
        std::string stat_line;
        std::getline(stat, stat_line);
        size_t close = stat_line.rfind(')');
        if (close != std::string::npos && close + 2 < stat_line.size() &&
            stat_line[close + 2] != 'Z') {
          pids.insert(std::stoi(name));
        }
        break;
      }
      at = environ.find(needle, at + 1);
    }
  }
  return pids;
}

class SlurmTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    unavailable_ = new std::optional<std::string>(SlurmCluster::WhyUnavailable());
    if (*unavailable_) return;
    error_ = new std::string;
    cluster_ = SlurmCluster::Start(error_).release();
    // srun exports this process's environment to the tasks.
    setenv("MESHRUN", (BinDir() + "/meshrun").c_str(), 1);
    setenv("PYTHON_EXEC", MESHRUN_PYTHON, 1);
    if (cluster_ != nullptr) {
      std::printf("SLURM cluster n[1-3] up in %lld ms (%s)\n",
                  static_cast<long long>(cluster_->start_time().count()),
                  cluster_->dir().c_str());
    }
  }
  static void TearDownTestSuite() {
    // Out of the directory the cluster removes.
    std::filesystem::current_path("/");
    delete cluster_;
    cluster_ = nullptr;
  }

  void SetUp() override {
    if (*unavailable_) GTEST_SKIP() << "SLURM e2e: " << **unavailable_;
    ASSERT_NE(cluster_, nullptr) << "the SLURM cluster did not start: " << *error_;
    std::filesystem::current_path(cluster_->dir());
  }

  // srun ... with output merged, bounded; returns the exit code.
  int Srun(const std::vector<std::string>& args, std::string* output,
           milliseconds timeout = seconds(120)) {
    std::vector<std::string> argv{kSrun};
    argv.insert(argv.end(), args.begin(), args.end());
    int code = ExitCode(RunCommand(argv, timeout, output));
    if (code != 0) *output += "\n" + cluster_->Logs();
    return code;
  }

  // srun -N2 --ntasks-per-node=1 meshrun-slurm --nproc-per-node=2 <args>.
  int SrunTwoByTwo(const std::vector<std::string>& args, std::string* output,
                   milliseconds timeout = seconds(120)) {
    std::vector<std::string> argv{"-N2", "--ntasks-per-node=1", kWrapper,
                                  "--nproc-per-node=2"};
    argv.insert(argv.end(), args.begin(), args.end());
    return Srun(argv, output, timeout);
  }

  static std::optional<std::string>* unavailable_;
  static std::string* error_;
  static SlurmCluster* cluster_;
};

std::optional<std::string>* SlurmTest::unavailable_ = nullptr;
std::string* SlurmTest::error_ = nullptr;
SlurmCluster* SlurmTest::cluster_ = nullptr;

TEST_F(SlurmTest, SrunFormsOneWorldOfFourWithStableRanks) {
  // Twice: the same node order gives the same ranks in a new step.
  for (int step = 0; step < 2; ++step) {
    SCOPED_TRACE(step);
    std::string output;
    ASSERT_EQ(SrunTwoByTwo({"--no-python", kWorker, "env"}, &output), 0) << output;
    ExpectOneWorldOfFour(Workers(output));
    // The wrapper says what it took from SLURM.
    EXPECT_NE(output.find("--slurm: --nnodes=2 --node-rank="), std::string::npos)
        << output;
  }
}

TEST_F(SlurmTest, SbatchJobFormsOneWorldOfFour) {
  const std::string job = cluster_->dir() + "/job.sh";
  const std::string out = cluster_->dir() + "/job.out";
  {
    std::ofstream script(job);
    script << "#!/bin/sh\n"
           << "#SBATCH -N2 --ntasks-per-node=1 --time=5\n"
           << "srun " << kWrapper << " --nproc-per-node=2 --no-python " << kWorker
           << " env\n";
  }
  std::string submit;
  ASSERT_EQ(ExitCode(RunCommand({"/usr/bin/sbatch", "--parsable", "-o", out, job},
                                seconds(30), &submit)),
            0)
      << submit;
  const std::string id = submit.substr(0, submit.find_first_of(";\n"));
  // sbatch --wait polls every few seconds; scontrol shows the end at once.
  std::string state;
  auto deadline = Clock::now() + seconds(120);
  while (Clock::now() < deadline) {
    RunCommand({"/usr/bin/scontrol", "-o", "show", "job", id}, seconds(10), &state);
    bool ended = false;
    for (const char* end :
         {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}) {
      ended = ended || state.find(std::string("JobState=") + end) != std::string::npos;
    }
    if (ended) break;
    std::this_thread::sleep_for(milliseconds(100));
  }
  std::ifstream in(out);
  std::string output((std::istreambuf_iterator<char>(in)), {});
  ASSERT_NE(state.find("JobState=COMPLETED"), std::string::npos)
      << state << output << cluster_->Logs();
  EXPECT_NE(state.find("ExitCode=0:0"), std::string::npos) << state;
  ExpectOneWorldOfFour(Workers(output));
}

TEST_F(SlurmTest, ScancelStopsEveryWorkerAfterForwardingUsr1) {
  ChildProcess srun({kSrun, "-N2", "--ntasks-per-node=1", kWrapper, "--nproc-per-node=2",
                     "--shutdown-timeout=5", "--no-python", kWorker, "wait"},
                    /*merge_stderr=*/true);
  std::string job;
  std::set<pid_t> workers;
  for (int i = 0; i < 4; ++i) {
    auto line = srun.ReadUntil("WORKER pid=", seconds(60));
    ASSERT_TRUE(line.has_value()) << srun.output() << cluster_->Logs();
    auto worker = Workers(*line).at(0);
    workers.insert(std::stoi(worker.at("pid")));
    job = worker.at("JOB");
  }
  ASSERT_EQ(workers.size(), 4u);
  {
    // The survivor check below can see these processes at all.
    std::set<pid_t> of_job = ProcessesOfJob(job);
    for (pid_t pid : workers) EXPECT_EQ(of_job.count(pid), 1u) << pid;
  }

  // SLURM's early warning (what --signal=USR1@N delivers) reaches every
  // worker, and the run goes on.
  std::string out;
  ASSERT_EQ(
      ExitCode(RunCommand({"/usr/bin/scancel", "--signal=USR1", job}, seconds(10), &out)),
      0)
      << out;
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(srun.ReadUntil("SIGNAL USR1", seconds(30)).has_value()) << srun.output();
  }
  for (pid_t pid : workers) EXPECT_EQ(kill(pid, 0), 0) << "USR1 stopped worker " << pid;

  ASSERT_EQ(ExitCode(RunCommand({"/usr/bin/scancel", job}, seconds(10), &out)), 0) << out;
  srun.ReadAll(seconds(60));
  EXPECT_TRUE(srun.Wait(seconds(10)).has_value()) << "srun still running after scancel";
  // None survive: not the workers, not meshrun, not their children.
  auto deadline = Clock::now() + seconds(20);
  std::set<pid_t> left = ProcessesOfJob(job);
  while (!left.empty() && Clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(50));
    left = ProcessesOfJob(job);
  }
  EXPECT_TRUE(left.empty()) << left.size() << " processes of job " << job
                            << " survived scancel, e.g. pid " << *left.begin();
  for (pid_t pid : workers) EXPECT_NE(kill(pid, 0), 0) << "worker " << pid << " survived";
}

// The real thing behind the scancel test above: srun --signal=USR1@55 with a
// one-minute limit. slurmctld sends USR1 when it next checks (about 30 s in
// here), then SIGTERM at the limit; meshrun forwards both and exits 128+15.
TEST_F(SlurmTest, TimeLimitWarningAndTimeoutReachTheWorkers) {
  ChildProcess srun(
      {kSrun, "--time=1", "--signal=USR1@55", "-N2", "--ntasks-per-node=1", kWrapper,
       "--nproc-per-node=2", "--shutdown-timeout=5", "--no-python", kWorker, "wait"},
      /*merge_stderr=*/true);
  std::string job;
  for (int i = 0; i < 4; ++i) {
    auto line = srun.ReadUntil("WORKER pid=", seconds(60));
    ASSERT_TRUE(line.has_value()) << srun.output() << cluster_->Logs();
    job = Workers(*line).at(0).at("JOB");
  }
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(srun.ReadUntil("SIGNAL USR1", seconds(90)).has_value()) << srun.output();
  }
  EXPECT_GE(ProcessesOfJob(job).size(), 4u) << "USR1 stopped workers";
  srun.ReadAll(seconds(120));
  EXPECT_EQ(ExitCode(srun.Wait(seconds(10))), 128 + SIGTERM) << srun.output();
  EXPECT_NE(srun.output().find("DUE TO TIME LIMIT"), std::string::npos) << srun.output();
  auto deadline = Clock::now() + seconds(20);
  while (!ProcessesOfJob(job).empty() && Clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(50));
  }
  EXPECT_TRUE(ProcessesOfJob(job).empty()) << "processes of job " << job << " survived";
}

TEST_F(SlurmTest, WorkerFailureRestartsTheWorldWithTheSameRanks) {
  std::string output;
  ASSERT_EQ(SrunTwoByTwo({"--max-restarts=2", "--shutdown-timeout=5", "--no-python",
                          kWorker, "fail-once", "3", "9"},
                         &output),
            0)
      << output;
  std::vector<Worker> workers = Workers(output);
  bool failed = false;
  for (const Worker& w : OfAttempt(workers, "0")) failed = failed || w.at("RANK") == "3";
  EXPECT_TRUE(failed) << output;
  ExpectOneWorldOfFour(OfAttempt(workers, "1"));
  EXPECT_TRUE(OfAttempt(workers, "2").empty()) << "one failure, one restart";
}

TEST_F(SlurmTest, ExitCodeOfTheFailedWorkerReachesSrun) {
  std::string output;
  // Rank 2 (node 1) fails in every attempt: the budget runs out, node 1's
  // meshrun exits with the worker's code, node 0's with 1; srun reports the
  // highest.
  EXPECT_EQ(SrunTwoByTwo({"--max-restarts=1", "--shutdown-timeout=5", "--no-python",
                          kWorker, "fail-always", "2", "7"},
                         &output),
            7)
      << output;
  // Restarted once before giving up (the others may be stopped before they
  // print, so only the failing rank is sure to say so).
  bool restarted = false;
  for (const Worker& w : OfAttempt(Workers(output), "1")) {
    restarted = restarted || w.at("RANK") == "2";
  }
  EXPECT_TRUE(restarted) << output;
  EXPECT_TRUE(OfAttempt(Workers(output), "2").empty()) << output;
}

TEST_F(SlurmTest, TwoTasksPerNodeAreRefusedWithTheReason) {
  std::string output;
  EXPECT_EQ(Srun({"-N2", "--ntasks-per-node=2", kWrapper, "--no-python", kWorker, "env"},
                 &output),
            2)
      << output;
  EXPECT_NE(output.find("this srun step runs 2 tasks on a node"), std::string::npos)
      << output;
  EXPECT_TRUE(Workers(output).empty()) << output;
}

TEST_F(SlurmTest, PytorchDdpScriptTrainsAsUnderStandalone) {
  const std::vector<std::string> script{kSource + "/examples/ddp_train.py", "--epochs",
                                        "3", "--batch-size", "16"};
  std::string output;
  ASSERT_EQ(SrunTwoByTwo(script, &output, seconds(240)), 0) << output;
  EXPECT_NE(output.find("world_size=4"), std::string::npos) << output;

  std::vector<std::string> standalone{BinDir() + "/meshrun", "--standalone",
                                      "--nproc-per-node=4"};
  standalone.insert(standalone.end(), script.begin(), script.end());
  std::string reference;
  ASSERT_EQ(ExitCode(RunCommand(standalone, seconds(240), &reference)), 0) << reference;

  // Rank 0's "epoch N loss X" lines, X as printed.
  auto losses = [](const std::string& text) {
    std::vector<std::string> found;
    std::stringstream lines(text);
    std::string line;
    while (std::getline(lines, line)) {
      size_t epoch = line.find("epoch ");
      size_t loss = line.find(" loss ", epoch == std::string::npos ? 0 : epoch);
      if (epoch != std::string::npos && loss != std::string::npos) {
        found.push_back(line.substr(loss + 6));
      }
    }
    return found;
  };
  std::vector<std::string> under_slurm = losses(output);
  ASSERT_EQ(under_slurm.size(), 3u) << output;
  EXPECT_EQ(under_slurm, losses(reference)) << output << reference;
  EXPECT_LT(std::stod(under_slurm.back()), std::stod(under_slurm.front()))
      << "the loss goes down";
}

// The README's SLURM example, as written, inside a 2-node allocation (salloc,
// as a user would run it), with its `train.py` a real PyTorch DDP script.
TEST_F(SlurmTest, ReadmeExample) {
  std::ifstream in(kSource + "/README.md");
  const std::string readme((std::istreambuf_iterator<char>(in)), {});
  const size_t marker = readme.find("<!-- runnable by SlurmTest.ReadmeExample");
  ASSERT_NE(marker, std::string::npos) << "README.md: no block marked for this test";
  const size_t begin = readme.find("```sh\n", marker);
  ASSERT_NE(begin, std::string::npos);
  const size_t end = readme.find("```", begin + 6);
  ASSERT_NE(end, std::string::npos);
  std::string command = readme.substr(begin + 6, end - begin - 6);
  const size_t train = command.find(" train.py");
  ASSERT_NE(train, std::string::npos) << command;
  command.replace(train, 9, " examples/ddp_train.py --epochs 2 --batch-size 16");

  std::string output;
  const int code = ExitCode(RunCommand(
      {"/usr/bin/salloc", "-N2", "/bin/sh", "-c", "cd " + kSource + " && " + command},
      seconds(240), &output));
  ASSERT_EQ(code, 0) << command << "\n" << output << cluster_->Logs();
  // One task a node, one worker a task: a world of two.
  EXPECT_NE(output.find("world_size=2"), std::string::npos) << output;
}

}  // namespace
}  // namespace meshrun
