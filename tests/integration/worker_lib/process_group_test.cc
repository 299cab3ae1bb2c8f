// InitProcessGroup and NewGroup across real processes: pg_worker under the
// real launcher (meshrun --standalone, two meshrun agents on one daemon, and
// torchrun 2, the venv's, as the peer), every rank checking its own results.

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <memory>
#include <ostream>
#include <regex>
#include <string>
#include <vector>

#include "tests/support/child_process.h"
#include "tests/support/text.h"

namespace meshrun {
namespace {

using std::chrono::milliseconds;
using testing::BinDir;
using testing::ChildProcess;
using testing::Count;
using testing::DaemonProcess;
using testing::ExitCode;

const std::string kWorker = PG_WORKER_BINARY;
constexpr milliseconds kRunTimeout{180000};

std::unique_ptr<ChildProcess> Launch(std::vector<std::string> launcher_args,
                                     std::vector<std::string> worker_args) {
  std::vector<std::string> argv{"/usr/bin/env", "PYTHON_EXEC=" MESHRUN_PYTHON,
                                BinDir() + "/meshrun"};
  argv.insert(argv.end(), launcher_args.begin(), launcher_args.end());
  argv.push_back("--no-python");
  argv.push_back(kWorker);
  argv.insert(argv.end(), worker_args.begin(), worker_args.end());
  return std::make_unique<ChildProcess>(argv, /*merge_stderr=*/true);
}

// Every rank printed PASS and none FAIL.
void ExpectAllPassed(const std::string& output, int world_size) {
  EXPECT_EQ(Count(output, "FAIL rank="), 0u) << output;
  for (int rank = 0; rank < world_size; ++rank)
    EXPECT_NE(output.find("PASS rank=" + std::to_string(rank) + " "), std::string::npos)
        << "rank " << rank << "\n"
        << output;
}

struct Layout {
  int nproc;
  std::string store;
};

void PrintTo(const Layout& layout, std::ostream* os) {
  *os << layout.nproc << " ranks, " << layout.store << " store";
}

class Collectives : public ::testing::TestWithParam<Layout> {};

TEST_P(Collectives, StandaloneEveryGroupComputesTheRightValues) {
  const Layout& layout = GetParam();
  auto run = Launch({"--standalone", "--nproc-per-node=" + std::to_string(layout.nproc)},
                    {"collectives", "--store", layout.store});
  ASSERT_EQ(ExitCode(*run, kRunTimeout), 0) << run->output();
  ExpectAllPassed(run->output(), layout.nproc);
  EXPECT_EQ(Count(run->output(), "store=" + layout.store),
            static_cast<size_t>(layout.nproc))
      << run->output();
}

INSTANTIATE_TEST_SUITE_P(Layouts, Collectives,
                         ::testing::Values(Layout{4, "meshrun"}, Layout{4, "tcpstore"},
                                           Layout{2, "meshrun"}, Layout{3, "meshrun"}),
                         [](const auto& info) {
                           return std::to_string(info.param.nproc) + "ranks_" +
                                  info.param.store;
                         });

TEST(ProcessGroupTest, TwoAgentsOnOneDaemonFormOneWorld) {
  DaemonProcess daemon;
  std::vector<std::unique_ptr<ChildProcess>> agents;
  for (int node = 0; node < 2; ++node) {
    agents.push_back(Launch({"--nnodes=2", "--nproc-per-node=2", "--rdzv-backend=c10d",
                             "--rdzv-endpoint=" + daemon.endpoint(), "--rdzv-id=pgjob",
                             "--node-rank=" + std::to_string(node)},
                            {"collectives", "--store", "meshrun"}));
  }
  std::string output;
  for (auto& agent : agents) {
    EXPECT_EQ(ExitCode(*agent, kRunTimeout), 0) << agent->output();
    output += agent->output();
  }
  ExpectAllPassed(output, 4);
}

TEST(ProcessGroupTest, ErrorCasesAreReportedClearly) {
  auto run = Launch({"--standalone", "--nproc-per-node=4"}, {"errors"});
  ASSERT_EQ(ExitCode(*run, kRunTimeout), 0) << run->output();
  ExpectAllPassed(run->output(), 4);
  // Ranks that disagree on a NewGroup: a member is told which lists differ;
  // the others fail their rendezvous or are not members, nobody hangs.
  const std::string& out = run->output();
  EXPECT_EQ(Count(out, "DISAGREE rank="), 4u) << out;
  EXPECT_TRUE(std::regex_search(
      out,
      std::regex("DISAGREE rank=\\d FAILED_PRECONDITION: NewGroup #\\d+: rank \\d was "
                 "called with ranks \\[[0-9,]+\\] but another member with \\[[0-9,]+\\]: "
                 "every rank must call NewGroup with the same ranks in the same order")))
      << out;
}

// NewGroup ends with a barrier of the whole world (as torch's new_group):
// rank 0, not a member, and the fast members return only once the slow
// member has formed the group, so their exiting at once breaks nobody. Before
// the barrier, rank 0 left at once and, serving the TCPStore, took the
// members' rendezvous down with it.
class ExitRightAfterNewGroup : public ::testing::TestWithParam<std::string> {};

TEST_P(ExitRightAfterNewGroup, BreaksNoPeer) {
  auto run = Launch({"--standalone", "--nproc-per-node=4"},
                    {"exit-after-newgroup", "--store", GetParam()});
  EXPECT_EQ(ExitCode(*run, kRunTimeout), 0) << run->output();
  const std::string& out = run->output();
  EXPECT_EQ(Count(out, "NEWGROUP rank="), 4u) << out;
  EXPECT_EQ(Count(out, "NEWGROUP rank=0 not a member"), 1u) << out;
  for (int rank = 1; rank < 4; ++rank)
    EXPECT_EQ(Count(out, "NEWGROUP rank=" + std::to_string(rank) + " member"), 1u) << out;
}

INSTANTIATE_TEST_SUITE_P(Stores, ExitRightAfterNewGroup,
                         ::testing::Values("tcpstore", "meshrun"),
                         [](const auto& info) { return info.param; });

TEST(ProcessGroupTest, OutsideALauncherTheErrorNamesWhatIsMissing) {
  ChildProcess run({"/usr/bin/env", "-i", kWorker, "collectives"}, /*merge_stderr=*/true);
  run.ReadAll(kRunTimeout);
  auto status = run.Wait(kRunTimeout);
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(WEXITSTATUS(*status), 1);
  EXPECT_EQ(
      run.output(),
      "pg_worker: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT are not set: "
      "start this program with meshrun (or torchrun)\n");
}

// torchrun 2 sets no MESHRUN_STORE_*: the library falls back to a TCPStore served by
// rank 0 at MASTER_ADDR:MASTER_PORT, as env:// does.
TEST(ProcessGroupTest, UnderTorchrunTheTcpStoreFallbackWorks) {
  ChildProcess run({MESHRUN_TORCHRUN, "--standalone", "--nproc_per_node=2", "--no_python",
                    kWorker, "collectives"},
                   /*merge_stderr=*/true);
  run.ReadAll(kRunTimeout);
  auto status = run.Wait(kRunTimeout);
  ASSERT_TRUE(status.has_value());
  EXPECT_EQ(WEXITSTATUS(*status), 0) << run.output();
  ExpectAllPassed(run.output(), 2);
  EXPECT_EQ(Count(run.output(), "store=tcpstore"), 2u) << run.output();
}

}  // namespace
}  // namespace meshrun
