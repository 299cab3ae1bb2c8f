// Several runs at once on one daemon that requires a token (issue 28): each
// run's workers reach the daemon through their own agent's store relay, which
// carries the token and names the run's round namespace, so a stock torch
// TCPStore client sees its own run's keys and none of another's
// (store_isolation_worker.py checks get, check, wait and num_keys), and every
// run succeeds.

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <string>
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
using testing::TempDir;
using Clock = std::chrono::steady_clock;
using Agents = std::vector<std::unique_ptr<ChildProcess>>;

const std::string kWorker =
    std::string(MESHRUN_SOURCE_DIR) + "/tests/e2e/store_isolation_worker.py";
constexpr int kNproc = 2;

std::map<std::string, std::string> ReadResult(const TempDir& dir,
                                              const std::string& name) {
  std::map<std::string, std::string> result;
  std::ifstream in(dir / name);
  for (std::string line; std::getline(in, line);) {
    size_t eq = line.find('=');
    if (eq != std::string::npos) result[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return result;
}

std::string Outputs(const Agents& agents) {
  std::string all;
  for (const auto& agent : agents) all += agent->output() + "\n";
  return all;
}

TEST(StoreIsolationTest, ThreeRunsOnATokenDaemonSeeOnlyTheirOwnKeys) {
  TempDir dir("store-isolation");
  const std::string token_file = dir.Write("token", "isolation-token-0123456789abcdef\n");
  DaemonProcess daemon({"--token-file", token_file});
  const std::vector<std::string> runs = {"run0", "run1", "run2"};
  Agents agents;
  for (size_t i = 0; i < runs.size(); ++i) {
    agents.push_back(std::make_unique<ChildProcess>(
        std::vector<std::string>{
            "/usr/bin/env", "PYTHON_EXEC=" MESHRUN_PYTHON, BinDir() + "/meshrun",
            "--monitor-interval=0.1", "--nnodes=1",
            "--nproc-per-node=" + std::to_string(kNproc), "--rdzv-backend=c10d",
            "--rdzv-endpoint=" + daemon.endpoint(), "--rdzv-id=" + runs[i],
            "--token-file", token_file, kWorker, dir.path(), runs[i], "run0,run1,run2",
            std::to_string(5 * (i + 1))},
        /*merge_stderr=*/true));
  }
  // Every worker of every run through each phase before any goes on, so each
  // check runs while the other runs' keys are all there.
  for (const std::string phase : {"ready", "counted", "set"}) {
    std::vector<std::string> names;
    for (const std::string& run : runs)
      for (int rank = 0; rank < kNproc; ++rank)
        names.push_back(phase + "." + run + "." + std::to_string(rank));
    ASSERT_TRUE(testing::FilesWithin(dir.path(), names, agents, seconds(120)))
        << "not every worker was " << phase << "\n"
        << Outputs(agents);
    dir.Write("go." + phase, "");
  }
  for (auto& agent : agents)
    EXPECT_EQ(ExitCode(*agent, seconds(120)), 0) << agent->output();

  std::set<std::string> relays, prefixes;
  for (const std::string& run : runs) {
    for (int rank = 0; rank < kNproc; ++rank) {
      SCOPED_TRACE(run + " rank " + std::to_string(rank));
      auto result = ReadResult(dir, "result." + run + "." + std::to_string(rank));
      EXPECT_EQ(result["result"], "ok");
      relays.insert(result["MASTER_PORT"]);
      prefixes.insert(result["MESHRUN_STORE_PREFIX"]);
      // The keys are at the daemon, in the run's namespace (c10d's client
      // puts "/" before each key), read back over gRPC with the token.
      const std::string key = "/iso/" + run + "/" + std::to_string(rank) + "/0";
      ChildProcess get({"/usr/bin/env", "MESHRUN_RDZV_TOKEN_FILE=" + token_file,
                        BinDir() + "/store_tool", daemon.endpoint(),
                        result["MESHRUN_STORE_PREFIX"], "get", key, "2000"},
                       /*merge_stderr=*/true);
      EXPECT_EQ(ExitCode(get, seconds(20)), 0) << get.output();
      EXPECT_NE(get.output().find("value=" + run + ":" + std::to_string(rank) + ":0"),
                std::string::npos)
          << get.output();
    }
  }
  // A relay a run (one node each) and a namespace a run.
  EXPECT_EQ(relays.size(), runs.size());
  EXPECT_EQ(prefixes.size(), runs.size());
}

}  // namespace
}  // namespace meshrun
