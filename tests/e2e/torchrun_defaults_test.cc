// meshrun against the pinned torchrun 2, run the same way: the workers'
// environment (a script that dumps it), the lines --duplicate-stdout-filters
// copies, and what each does with no rendezvous flags at all. The default
// tests use port 29500, which nothing else can hold inside a fresh network
// namespace of their own.

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <regex>
#include <stdexcept>
#include <string>
#include <vector>

#include "tests/support/child_process.h"
#include "tests/support/temp_dir.h"

namespace meshrun {
namespace {

using std::chrono::seconds;
using testing::BinDir;
using testing::ChildProcess;
using testing::ExitCode;
using testing::TempDir;
using Env = std::map<std::string, std::string>;

const std::string kDumpEnv = std::string(MESHRUN_SOURCE_DIR) + "/tests/e2e/dump_env.py";
constexpr int kTorchrunDefaultPort = 29500;

// Both launchers start from the same small environment, so whatever differs
// in the workers' comes from the launcher.
std::vector<std::string> CleanEnv() {
  return {"/usr/bin/env", "-i", "PATH=/usr/bin:/bin", "HOME=/root",
          "PYTHON_EXEC=" MESHRUN_PYTHON};
}

std::vector<std::string> Torchrun(std::vector<std::string> args) {
  std::vector<std::string> argv = CleanEnv();
  argv.push_back(MESHRUN_TORCHRUN);
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

std::vector<std::string> Meshrun(std::vector<std::string> args) {
  std::vector<std::string> argv = CleanEnv();
  argv.push_back(BinDir() + "/meshrun");
  argv.insert(argv.end(), args.begin(), args.end());
  return argv;
}

// dump_env.py's file for `tag` and `rank`; empty if it wrote none.
Env ReadEnv(const TempDir& dir, const std::string& tag, int rank) {
  Env env;
  std::ifstream in(dir / (tag + "." + std::to_string(rank) + ".env"));
  for (std::string line; std::getline(in, line);) {
    size_t eq = line.find('=');
    if (eq != std::string::npos) env[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return env;
}

bool IsUuid4(const std::string& id) {
  static const std::regex uuid(
      "[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}");
  return std::regex_match(id, uuid);
}

bool IsPort(const std::string& text) {
  return std::regex_match(text, std::regex("[1-9][0-9]{0,4}")) &&
         std::stoi(text) <= 65535;
}

// A network namespace with only a loopback, kept alive by a sleeping
// process; commands run inside it through nsenter. Needs root.
class FreshNetns {
 public:
  static std::optional<std::string> Unavailable() {
    if (geteuid() != 0) return "needs root (unshare --net)";
    for (const char* tool : {"/usr/bin/unshare", "/usr/bin/nsenter"})
      if (access(tool, X_OK) != 0) return std::string("needs ") + tool;
    return std::nullopt;
  }

  FreshNetns()
      : holder_({"/usr/bin/unshare", "--net", "--", "/bin/sh", "-c",
                 "ip link set lo up && echo ready && exec sleep 600"},
                /*merge_stderr=*/true) {
    if (!holder_.ReadUntil("ready", seconds(10)))
      throw std::runtime_error("no network namespace: " + holder_.output());
  }

  std::vector<std::string> In(const std::vector<std::string>& argv) const {
    std::vector<std::string> wrapped{
        "/usr/bin/nsenter", "--net=/proc/" + std::to_string(holder_.pid()) + "/ns/net",
        "--"};
    wrapped.insert(wrapped.end(), argv.begin(), argv.end());
    return wrapped;
  }

 private:
  ChildProcess holder_;
};

// --- The workers' environment ----------------------------------------------------

// `--standalone --nproc-per-node=2` under both; every variable compared, with
// the differences that must be there normalised, each with its reason.
TEST(TorchrunEnv, WorkerEnvironmentMatchesTorchrun2) {
  TempDir dir("torchrun-env");
  const std::vector<std::string> flags = {"--standalone", "--nproc-per-node=2", kDumpEnv,
                                          dir.path()};
  std::vector<std::string> torchrun_args = flags, meshrun_args = flags;
  torchrun_args.push_back("torchrun");
  meshrun_args.push_back("meshrun");
  ChildProcess torchrun(Torchrun(torchrun_args), /*merge_stderr=*/true);
  ASSERT_EQ(ExitCode(torchrun, seconds(120)), 0) << torchrun.output();
  ChildProcess meshrun(Meshrun(meshrun_args), /*merge_stderr=*/true);
  ASSERT_EQ(ExitCode(meshrun, seconds(120)), 0) << meshrun.output();

  std::string torchrun_run_id, meshrun_run_id;
  for (int rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    Env t = ReadEnv(dir, "torchrun", rank), m = ReadEnv(dir, "meshrun", rank);
    ASSERT_FALSE(t.empty()) << torchrun.output();
    ASSERT_FALSE(m.empty()) << meshrun.output();

    // Kernel-chosen ports: each launcher's own. Both are the agent store
    // (TORCHELASTIC_USE_AGENT_STORE=True, compared below): torchrun's c10d
    // rendezvous TCPStore, meshrun's embedded daemon (its TCPStore front-end
    // on the port meshrun_worker's gRPC store uses too).
    EXPECT_TRUE(IsPort(t["MASTER_PORT"])) << t["MASTER_PORT"];
    EXPECT_TRUE(IsPort(m["MASTER_PORT"])) << m["MASTER_PORT"];
    EXPECT_EQ(m["MASTER_ADDR"] + ":" + m["MASTER_PORT"], m["MESHRUN_STORE_ENDPOINT"]);
    t.erase("MASTER_PORT");
    m.erase("MASTER_PORT");
    // meshrun's own additions (DESIGN.md: the daemon's endpoint and the
    // round's store prefix, for meshrun_worker); torchrun has no such thing.
    EXPECT_EQ(m.erase("MESHRUN_STORE_ENDPOINT"), 1u);
    EXPECT_EQ(m.erase("MESHRUN_STORE_PREFIX"), 1u);
    // meshrun.heartbeat()'s socket (--hang-timeout, on by default).
    EXPECT_EQ(m["MESHRUN_HEARTBEAT_SOCKET"].rfind("@meshrun-heartbeat-", 0), 0u)
        << m["MESHRUN_HEARTBEAT_SOCKET"];
    m.erase("MESHRUN_HEARTBEAT_SOCKET");
    // torchrun names rank 0's host by socket.getfqdn() (its c10d rendezvous
    // node address); meshrun --standalone its daemon by 127.0.0.1, which
    // needs no name service.
    EXPECT_FALSE(t["MASTER_ADDR"].empty());
    EXPECT_EQ(m["MASTER_ADDR"], "127.0.0.1");
    t.erase("MASTER_ADDR");
    m.erase("MASTER_ADDR");
    // --standalone: a fresh UUIDv4 per run, one per launcher.
    EXPECT_TRUE(IsUuid4(t["TORCHELASTIC_RUN_ID"])) << t["TORCHELASTIC_RUN_ID"];
    EXPECT_TRUE(IsUuid4(m["TORCHELASTIC_RUN_ID"])) << m["TORCHELASTIC_RUN_ID"];
    if (rank == 0) {
      torchrun_run_id = t["TORCHELASTIC_RUN_ID"];
      meshrun_run_id = m["TORCHELASTIC_RUN_ID"];
    }
    EXPECT_EQ(t["TORCHELASTIC_RUN_ID"], torchrun_run_id);
    EXPECT_EQ(m["TORCHELASTIC_RUN_ID"], meshrun_run_id);
    t.erase("TORCHELASTIC_RUN_ID");
    m.erase("TORCHELASTIC_RUN_ID");
    // Each launcher's temporary log directory; the layout below it is the same.
    const std::string error_tail = "/attempt_0/" + std::to_string(rank) + "/error.json";
    for (Env* env : {&t, &m}) {
      const std::string& file = (*env)["TORCHELASTIC_ERROR_FILE"];
      EXPECT_TRUE(file.size() > error_tail.size() &&
                  file.compare(file.size() - error_tail.size(), std::string::npos,
                               error_tail) == 0)
          << file;
      env->erase("TORCHELASTIC_ERROR_FILE");
    }
    // Everything else, the same keys with the same values: LOCAL_RANK, RANK,
    // GROUP_*, ROLE_*, *WORLD_SIZE, TORCHELASTIC_{RESTART_COUNT,MAX_RESTARTS,
    // SIGNALS_TO_HANDLE,USE_AGENT_STORE}, TORCH_NCCL_ASYNC_ERROR_HANDLING,
    // OMP_NUM_THREADS, and what both inherit.
    EXPECT_EQ(m, t);
    EXPECT_EQ(t["TORCHELASTIC_USE_AGENT_STORE"], "True");
    EXPECT_EQ(t.count("TORCH_NCCL_ASYNC_ERROR_HANDLING"), 1u);
    EXPECT_EQ(t.count("OMP_NUM_THREADS"), 1u);
  }
}

// --- --duplicate-stdout-filters ------------------------------------------------------

// Every line of `path`, sorted (workers' lines interleave in any order).
std::vector<std::string> SortedLines(const std::string& path) {
  std::vector<std::string> lines;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  std::sort(lines.begin(), lines.end());
  return lines;
}

// The one file called `name` below `dir`, or "".
std::string FindFile(const std::string& dir, const std::string& name) {
  std::error_code error;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir, error))
    if (entry.path().filename() == name) return entry.path().string();
  return "";
}

// Tee'd lines holding a filter (",," a literal comma) are copied, prefixed,
// to attempt_0/filtered_stdout.log; stderr has no filter, so no file.
TEST(TorchrunLogs, DuplicateStdoutFiltersMatchTorchrun2) {
  TempDir dir("torchrun-filters");
  const std::string script =
      dir.Write("fruit.py",
                "import os, sys\n"
                "r = os.environ['LOCAL_RANK']\n"
                "print(f'apple from {r}'); print(f'banana from {r}'); print(f'a,b {r}')\n"
                "print(f'apple on stderr {r}', file=sys.stderr)\n");
  std::map<std::string, std::vector<std::string>> copied;
  for (const std::string launcher : {"torchrun", "meshrun"}) {
    SCOPED_TRACE(launcher);
    const std::string log_dir = dir / launcher;
    std::vector<std::string> args = {"--standalone",
                                     "--nproc-per-node=2",
                                     "--log-dir",
                                     log_dir,
                                     "-t",
                                     "3",
                                     "--duplicate-stdout-filters=apple,a,,b",
                                     script};
    ChildProcess run(launcher == "torchrun" ? Torchrun(args) : Meshrun(args),
                     /*merge_stderr=*/true);
    ASSERT_EQ(ExitCode(run, seconds(120)), 0) << run.output();
    const std::string file = FindFile(log_dir, "filtered_stdout.log");
    ASSERT_NE(file, "") << run.output();
    EXPECT_NE(file.find("/attempt_0/"), std::string::npos) << file;
    EXPECT_EQ(FindFile(log_dir, "filtered_stderr.log"), "");
    copied[launcher] = SortedLines(file);
  }
  EXPECT_EQ(copied["meshrun"], copied["torchrun"]);
  EXPECT_EQ(copied["meshrun"],
            (std::vector<std::string>{"[default0]:a,b 0", "[default0]:apple from 0",
                                      "[default1]:a,b 1", "[default1]:apple from 1"}));
}

// --- No rendezvous flags -------------------------------------------------------------

// One node, no --rdzv-endpoint, no --master-port: torchrun 2 runs c10d on
// localhost:0 with a fresh run id, not static on 29500; so does meshrun.
// 29500 is held (by a listener that never answers) to show neither uses it.
TEST(TorchrunDefaults, OneNodeWithoutRendezvousFlagsIsStandalone) {
  if (auto why = FreshNetns::Unavailable()) GTEST_SKIP() << *why;
  FreshNetns netns;
  ChildProcess squatter(
      netns.In({MESHRUN_PYTHON, "-c",
                "import socket,time; s=socket.socket(); s.bind(('127.0.0.1', 29500)); "
                "s.listen(); print('held', flush=True); time.sleep(600)"}),
      /*merge_stderr=*/true);
  ASSERT_TRUE(squatter.ReadUntil("held", seconds(30))) << squatter.output();

  TempDir dir("torchrun-default");
  for (const std::string launcher : {"torchrun", "meshrun"}) {
    SCOPED_TRACE(launcher);
    std::vector<std::string> args = {"--nproc-per-node=2", kDumpEnv, dir.path(),
                                     launcher};
    ChildProcess run(netns.In(launcher == "torchrun" ? Torchrun(args) : Meshrun(args)),
                     /*merge_stderr=*/true);
    ASSERT_EQ(ExitCode(run, seconds(120)), 0) << run.output();
    for (int rank = 0; rank < 2; ++rank) {
      Env env = ReadEnv(dir, launcher, rank);
      ASSERT_FALSE(env.empty()) << run.output();
      EXPECT_TRUE(IsUuid4(env["TORCHELASTIC_RUN_ID"])) << env["TORCHELASTIC_RUN_ID"];
      EXPECT_EQ(env["WORLD_SIZE"], "2");
      EXPECT_NE(env["MASTER_PORT"], std::to_string(kTorchrunDefaultPort));
    }
  }
}

// Two nodes, no --rdzv-endpoint and no --master-*: torchrun 2's static
// backend on 127.0.0.1:29500, node ranks from --node-rank. meshrun's static
// backend serves its rendezvous there too (the workers find a listener on
// 29500 and run id "none"), and its workers use that daemon's TCPStore as
// their agent store: MASTER_PORT 29500 under both.
TEST(TorchrunDefaults, TwoNodesWithoutEndpointAreStaticOnPort29500) {
  if (auto why = FreshNetns::Unavailable()) GTEST_SKIP() << *why;
  TempDir dir("torchrun-static");
  for (const std::string launcher : {"torchrun", "meshrun"}) {
    SCOPED_TRACE(launcher);
    FreshNetns netns;  // 29500 is free here, and nothing is left from the last one
    std::vector<std::unique_ptr<ChildProcess>> nodes;
    for (int node = 0; node < 2; ++node) {
      std::vector<std::string> args = {"--nnodes=2",
                                       "--node-rank=" + std::to_string(node),
                                       "--nproc-per-node=1",
                                       kDumpEnv,
                                       dir.path(),
                                       launcher,
                                       "--probe",
                                       std::to_string(kTorchrunDefaultPort)};
      nodes.push_back(std::make_unique<ChildProcess>(
          netns.In(launcher == "torchrun" ? Torchrun(args) : Meshrun(args)),
          /*merge_stderr=*/true));
    }
    for (auto& node : nodes)
      ASSERT_EQ(ExitCode(*node, seconds(120)), 0) << node->output();
    for (int rank = 0; rank < 2; ++rank) {
      SCOPED_TRACE("rank " + std::to_string(rank));
      Env env = ReadEnv(dir, launcher, rank);
      ASSERT_FALSE(env.empty());
      EXPECT_EQ(env["_PROBE"], "1");  // the rendezvous listens on 29500
      EXPECT_EQ(env["TORCHELASTIC_RUN_ID"], "none");
      EXPECT_EQ(env["GROUP_RANK"], std::to_string(rank));
      EXPECT_EQ(env["WORLD_SIZE"], "2");
      EXPECT_EQ(env["MASTER_ADDR"], "127.0.0.1");
      EXPECT_EQ(env["MASTER_PORT"], std::to_string(kTorchrunDefaultPort));
      EXPECT_EQ(env["TORCHELASTIC_USE_AGENT_STORE"], "True");
    }
  }
}

}  // namespace
}  // namespace meshrun
