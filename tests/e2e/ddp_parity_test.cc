// A real PyTorch DDP script (gloo, env://) runs unchanged under meshrun as 2
// agents x 2 workers and ends with the same losses as under torchrun 2
// (the venv's, torch 2.15) with the same world size.

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <regex>

#include "tests/support/child_process.h"

namespace meshrun {
namespace {

using std::chrono::seconds;
using testing::BinDir;
using testing::ChildProcess;
using testing::FreePort;

const std::string kSource = MESHRUN_SOURCE_DIR;
const std::string kScript = kSource + "/examples/ddp_train.py";
const std::vector<std::string> kScriptArgs{"--epochs", "3", "--batch-size", "16"};

int Finish(ChildProcess& process) {
  process.ReadAll(seconds(240));
  auto status = process.Wait(seconds(240));
  if (!status) return -1;
  return WIFEXITED(*status) ? WEXITSTATUS(*status) : 128 + WTERMSIG(*status);
}

std::vector<std::string> Losses(const std::string& output) {
  std::vector<std::string> losses;
  std::regex loss_re("epoch (\\d+) loss ([0-9.]+)");
  for (std::sregex_iterator it(output.begin(), output.end(), loss_re), end; it != end;
       ++it)
    losses.push_back((*it)[2]);
  return losses;
}

TEST(DdpParityTest, TwoAgentsOfTwoWorkersMatchTorchrunWithFour) {
  std::vector<std::string> torchrun{MESHRUN_TORCHRUN, "--standalone",
                                    "--nproc_per_node=4", "--monitor_interval=0.1",
                                    kScript};
  torchrun.insert(torchrun.end(), kScriptArgs.begin(), kScriptArgs.end());
  ChildProcess peer(torchrun, /*merge_stderr=*/true);
  ASSERT_EQ(Finish(peer), 0) << peer.output();
  auto expected = Losses(peer.output());
  ASSERT_EQ(expected.size(), 3u) << peer.output();

  testing::DaemonProcess daemon;
  std::vector<std::unique_ptr<ChildProcess>> agents;
  for (int node = 0; node < 2; ++node) {
    std::vector<std::string> argv{"/usr/bin/env",
                                  "PYTHON_EXEC=" MESHRUN_PYTHON,
                                  BinDir() + "/meshrun",
                                  "--nnodes=2",
                                  "--nproc-per-node=2",
                                  "--rdzv-backend=c10d",
                                  "--rdzv-endpoint=" + daemon.endpoint(),
                                  "--rdzv-id=ddp",
                                  "--node-rank=" + std::to_string(node),
                                  kScript};
    argv.insert(argv.end(), kScriptArgs.begin(), kScriptArgs.end());
    agents.push_back(std::make_unique<ChildProcess>(argv, /*merge_stderr=*/true));
  }
  std::string output;
  for (auto& agent : agents) {
    ASSERT_EQ(Finish(*agent), 0) << agent->output();
    output += agent->output();
  }
  EXPECT_NE(output.find("world_size=4"), std::string::npos) << output;
  EXPECT_EQ(Losses(output), expected) << output;
}

}  // namespace
}  // namespace meshrun
