// A daemon restart breaks no Python worker (issue 28): a 2-node torch job
// (two real `meshrun` agents, --rdzv-backend=c10d, one gloo worker each)
// whose meshrun-rdzvd (--state-dir) is SIGKILLed or stopped with SIGTERM and
// started again on its port. Torch's TCPStore client never reconnects, but it
// talks to its agent's relay, which does and sends the wait again: rank 0,
// parked in store.wait() at the old daemon, gets the key rank 1 sets (through
// the other agent's relay) after the restart; then a barrier, a new group, a
// store barrier and DDP training on the new group work, and the job exits 0
// with no worker restarted (relay_restart_worker.py).

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "tests/support/child_process.h"
#include "tests/support/http_client.h"
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
    std::string(MESHRUN_SOURCE_DIR) + "/tests/e2e/relay_restart_worker.py";

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::string Outputs(const Agents& agents) {
  std::string all;
  for (const auto& agent : agents) all += agent->output() + "\n";
  return all;
}

// Whether a store call is parked at the daemon whose metrics are on `port`
// within the deadline: rank 0's wait, the job's only blocking call then.
bool AWaitIsParked(int port) {
  const std::string last = testing::ScrapeUntil(
      port,
      [](const std::string& text) {
        auto parked = testing::MetricSample(text, "meshrun_store_waiters_parked");
        return parked && *parked >= 1;
      },
      seconds(60));
  auto parked = testing::MetricSample(last, "meshrun_store_waiters_parked");
  return parked && *parked >= 1;
}

std::unique_ptr<DaemonProcess> StartDaemon(const std::string& port,
                                           const std::string& state_dir) {
  return std::make_unique<DaemonProcess>(std::vector<std::string>{
      "--port", port, "--state-dir", state_dir, "--metrics-port", "0"});
}

class RelayRestartTest : public ::testing::TestWithParam<int> {};

TEST_P(RelayRestartTest, AWaitingWorkerGetsItsKeyAndNewGroupsAndDdpWorkAfter) {
  const int stop_signal = GetParam();
  TempDir dir("relay-restart");
  const std::string state = dir / "state";
  auto daemon = StartDaemon("0", state);
  const int metrics = daemon->ReadMetricsPort();
  ASSERT_GT(metrics, 0);
  const std::string endpoint = daemon->endpoint();
  const std::string port = endpoint.substr(endpoint.rfind(':') + 1);

  Agents agents;
  for (int node = 0; node < 2; ++node) {
    agents.push_back(std::make_unique<ChildProcess>(
        std::vector<std::string>{
            "/usr/bin/env", "PYTHON_EXEC=" MESHRUN_PYTHON, BinDir() + "/meshrun",
            "--monitor-interval=0.1", "--nnodes=2", "--nproc-per-node=1",
            "--rdzv-backend=c10d", "--rdzv-endpoint=" + endpoint,
            "--rdzv-id=relay-restart", "--node-rank=" + std::to_string(node), kWorker,
            dir.path()},
        /*merge_stderr=*/true));
  }
  ASSERT_TRUE(
      testing::FilesWithin(dir.path(), {"waiting", "ready.1"}, agents, seconds(120)))
      << Outputs(agents);
  ASSERT_TRUE(AWaitIsParked(metrics)) << "rank 0's wait never reached the daemon\n"
                                      << Outputs(agents);

  daemon->process().Signal(stop_signal);
  std::optional<int> status = daemon->process().Wait(seconds(20));
  ASSERT_TRUE(status) << "the daemon did not stop";
  if (stop_signal == SIGTERM) {
    EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << *status;
  }
  // Both relays saw their stream end before the daemon comes back.
  for (auto& agent : agents) {
    ASSERT_TRUE(agent->ReadUntil("store relay: the stream to", seconds(30)))
        << agent->output();
  }
  daemon = StartDaemon(port, state);
  ASSERT_EQ(daemon->endpoint(), endpoint) << "rebinding the port";
  const int restarted_metrics = daemon->ReadMetricsPort();
  ASSERT_GT(restarted_metrics, 0);
  // Rank 0's relay sent its wait again, and nothing has released it yet.
  ASSERT_TRUE(AWaitIsParked(restarted_metrics)) << "rank 0's wait was not sent again\n"
                                                << Outputs(agents);
  EXPECT_FALSE(std::filesystem::exists(dir / "released.0"));

  dir.Write("release", "");
  for (auto& agent : agents) {
    EXPECT_EQ(ExitCode(*agent, seconds(120)), 0) << agent->output();
    EXPECT_NE(agent->output().find("reconnected to the rendezvous daemon"),
              std::string::npos)
        << agent->output();
  }
  EXPECT_EQ(ReadFile(dir / "released.0"), "after-the-restart");
  EXPECT_EQ(ReadFile(dir / "done.0"), "ok\n");
  EXPECT_EQ(ReadFile(dir / "done.1"), "ok\n");
}

INSTANTIATE_TEST_SUITE_P(Signals, RelayRestartTest, ::testing::Values(SIGKILL, SIGTERM),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return std::string(info.param == SIGKILL ? "Sigkill"
                                                                    : "Sigterm");
                         });

}  // namespace
}  // namespace meshrun
