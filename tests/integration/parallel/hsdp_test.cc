// HSDP (FSDP over the shard dimension, DataParallel over the replicate
// dimension): seed 000's printout on a (2, 4) mesh, and training parity on a
// (2, 2) mesh (hsdp_worker checks losses and final params itself).

#include <gtest/gtest.h>

#include <regex>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "tests/integration/parallel/driver_support.h"

namespace meshrun {
namespace {

using testing::MeshrunRun;
using testing::RunUnderMeshrun;

// Seed 000: Linear(10, 10, bias=False) with the weight arange(101., 201.),
// HSDP on mesh (2, 4) ["DP", "FSDP"]: each rank holds 25 values, fsdp_rank k
// 101+25k .. 125+25k, the same on both DP ranks.
TEST(HsdpTest, Seed000PrintoutOnMesh2x4) {
  MeshrunRun run = RunUnderMeshrun(8, "hsdp_worker", {"--seed000"});
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_TRUE(Lines(run.output, "FAIL rank").empty()) << run.output;
  auto lines = Lines(run.output, "Global rank: ");
  ASSERT_EQ(lines.size(), 8u) << run.output;
  std::regex re(
      "Global rank: (\\d+), dp_rank: (\\d+), fsdp_rank:(\\d+), Weights array: "
      "tensor\\(\\[([^\\]]*)\\], requires_grad=True\\)");
  std::set<int> ranks;
  for (const std::string& line : lines) {
    std::smatch m;
    ASSERT_TRUE(std::regex_search(line, m, re)) << line;
    const int rank = std::stoi(m[1]);
    const int dp_rank = std::stoi(m[2]);
    const int fsdp_rank = std::stoi(m[3]);
    ranks.insert(rank);
    EXPECT_EQ(dp_rank, rank / 4) << line;
    EXPECT_EQ(fsdp_rank, rank % 4) << line;
    std::string expected;
    for (int v = 101 + 25 * fsdp_rank; v <= 125 + 25 * fsdp_rank; ++v) {
      absl::StrAppend(&expected, expected.empty() ? "" : ", ", v, ".");
    }
    EXPECT_EQ(m[4].str(), expected) << line;
  }
  EXPECT_EQ(ranks.size(), 8u);
  // The seed's own line for rank 6.
  EXPECT_TRUE(Contains(run.output,
                       "Global rank: 6, dp_rank: 1, fsdp_rank:2, Weights array: "
                       "tensor([151., 152., 153."))
      << run.output;
}

TEST(HsdpTest, Mesh2x2MatchesSingleProcess) {
  MeshrunRun run = RunUnderMeshrun(
      4, "hsdp_worker", {"--dp", "2", "--fsdp", "2", "--sizes", "50,50,50,50,4"});
  ExpectTrained(run, 4, 10);
  EXPECT_TRUE(
      Contains(run.output,
               "LOCAL 3 dp 1 fsdp 1 fc3.weight [4, 50] Shard(dim=0)@fsdp local [2, 50]"))
      << run.output;
  // The replicate all-reduce starts in backward, once FSDP has the shard grads.
  EXPECT_TRUE(
      Contains(run.output, "OVERLAP at least 1 of 1 buckets started during backward"))
      << run.output;
}

TEST(HsdpTest, Mesh2x2WithoutReshardAfterForwardMatchesSingleProcess) {
  MeshrunRun run = RunUnderMeshrun(4, "hsdp_worker",
                                   {"--dp", "2", "--fsdp", "2", "--sizes",
                                    "50,50,50,50,4", "--reshard-after-forward", "false"});
  ExpectTrained(run, 4, 10);
}

}  // namespace
}  // namespace meshrun
