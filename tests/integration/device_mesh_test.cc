// DeviceMesh across real processes: the real `meshrun` launcher starts N
// workers (mesh_worker, mesh_example) that build their process groups with
// Gloo through meshrun's store. Checks each dimension's groups against
// PyTorch's layout (written out literally), collectives on every dimension,
// seed 000's printout, and PyTorch's error messages.

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "tests/support/child_process.h"

namespace meshrun {
namespace {

using std::chrono::milliseconds;
using testing::BinDir;
using testing::ChildProcess;
using Groups = std::vector<std::vector<int>>;

// Runs `program args...` under meshrun with `n` workers; returns the exit code
// and fills `output` (stdout and stderr of the launcher and the workers).
int RunUnderMeshrun(int n, const std::string& program,
                    const std::vector<std::string>& args, std::string* output) {
  std::vector<std::string> argv{"/usr/bin/env",
                                "PYTHON_EXEC=" MESHRUN_PYTHON,
                                BinDir() + "/meshrun",
                                "--standalone",
                                "--nproc-per-node=" + std::to_string(n),
                                "--no-python",
                                BinDir() + "/" + program};
  argv.insert(argv.end(), args.begin(), args.end());
  ChildProcess run(argv, /*merge_stderr=*/true);
  const milliseconds timeout(120000);
  *output = run.ReadAll(timeout);
  auto status = run.Wait(timeout);
  if (!status) return -1;
  return WIFEXITED(*status) ? WEXITSTATUS(*status) : 128 + WTERMSIG(*status);
}

std::vector<int> Ints(const std::string& text) {
  std::vector<int> values;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) values.push_back(std::stoi(item));
  return values;
}

// Lines "<TAG> <rank> <rest>" (after the launcher's "[defaultN]:" prefix).
std::multimap<int, std::string> Tagged(const std::string& output,
                                       const std::string& tag) {
  std::multimap<int, std::string> lines;
  std::regex re("(?:^|:)" + tag + " (\\d+) ?(.*)$");
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);) {
    std::smatch m;
    if (std::regex_search(line, m, re)) lines.emplace(std::stoi(m[1]), m[2]);
  }
  return lines;
}

struct MeshCase {
  std::string shape;
  std::string names;
  int world;
  std::vector<Groups> dim_groups;  // PyTorch's layout, per dimension
  Groups flat_groups;              // the last two dimensions flattened
};

class MeshGroupsTest : public ::testing::TestWithParam<MeshCase> {};

TEST_P(MeshGroupsTest, GroupsMatchPyTorchAndCollectivesWorkOnEveryDimension) {
  const MeshCase& c = GetParam();
  std::string output;
  int code = RunUnderMeshrun(c.world, "mesh_worker",
                             {"--shape", c.shape, "--names", c.names}, &output);
  ASSERT_EQ(code, 0) << output;
  EXPECT_EQ(Tagged(output, "FAIL").size(), 0u) << output;
  EXPECT_EQ(Tagged(output, "DONE").size(), static_cast<size_t>(c.world)) << output;

  // Every rank's group along each dimension is the row of PyTorch's layout
  // that contains it.
  std::map<std::pair<int, int>, std::vector<int>> groups;
  for (const auto& [rank, rest] : Tagged(output, "GROUP")) {
    auto space = rest.find(' ');
    groups[{rank, std::stoi(rest.substr(0, space))}] = Ints(rest.substr(space + 1));
  }
  const int ndim = static_cast<int>(c.dim_groups.size());
  ASSERT_EQ(groups.size(), static_cast<size_t>(c.world * ndim)) << output;
  for (int dim = 0; dim < ndim; ++dim) {
    for (const auto& row : c.dim_groups[dim]) {
      for (int rank : row)
        EXPECT_EQ(groups[std::make_pair(rank, dim)], row) << "rank " << rank;
    }
  }
  // Coordinates are row-major.
  std::vector<int> shape = Ints(c.shape);
  for (const auto& [rank, rest] : Tagged(output, "COORD")) {
    std::vector<int> coordinate = Ints(rest);
    int linear = 0;
    for (size_t i = 0; i < shape.size(); ++i) linear = linear * shape[i] + coordinate[i];
    EXPECT_EQ(linear, rank);
  }
  // Flattened groups.
  std::map<int, std::vector<int>> flat;
  for (const auto& [rank, rest] : Tagged(output, "FLAT"))
    flat[rank] = Ints(rest.substr(rest.find(' ') + 1));
  ASSERT_EQ(flat.size(), static_cast<size_t>(c.world)) << output;
  for (const auto& row : c.flat_groups)
    for (int rank : row) EXPECT_EQ(flat[rank], row) << "rank " << rank;
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, MeshGroupsTest,
    ::testing::Values(
        MeshCase{"2,2", "dp,tp", 4, {{{0, 2}, {1, 3}}, {{0, 1}, {2, 3}}}, {{0, 1, 2, 3}}},
        MeshCase{"2,3",
                 "dp,tp",
                 6,
                 {{{0, 3}, {1, 4}, {2, 5}}, {{0, 1, 2}, {3, 4, 5}}},
                 {{0, 1, 2, 3, 4, 5}}},
        MeshCase{"3,2",
                 "dp,tp",
                 6,
                 {{{0, 2, 4}, {1, 3, 5}}, {{0, 1}, {2, 3}, {4, 5}}},
                 {{0, 1, 2, 3, 4, 5}}},
        MeshCase{"2,2,2",
                 "dp,cp,tp",
                 8,
                 {{{0, 4}, {2, 6}, {1, 5}, {3, 7}},
                  {{0, 2}, {1, 3}, {4, 6}, {5, 7}},
                  {{0, 1}, {2, 3}, {4, 5}, {6, 7}}},
                 {{0, 1, 2, 3}, {4, 5, 6, 7}}}),
    [](const auto& info) {
      std::string name = info.param.shape;
      std::replace(name.begin(), name.end(), ',', 'x');
      return name;
    });

// "Rank: N, DeviceMesh(...)" lines, without the launcher's prefix.
std::set<std::string> RankLines(const std::string& output) {
  std::set<std::string> lines;
  std::regex re("Rank: \\d+, DeviceMesh\\(.*\\)$");
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);) {
    std::smatch m;
    if (std::regex_search(line, m, re)) lines.insert(m[0]);
  }
  return lines;
}

// Seed 000's printouts, line for line (order aside).
TEST(MeshExample, SeedPrintout2x3) {
  std::string output;
  ASSERT_EQ(RunUnderMeshrun(6, "mesh_example", {"--shape", "2,3"}, &output), 0) << output;
  EXPECT_EQ(RankLines(output),
            (std::set<std::string>{
                "Rank: 0, DeviceMesh([0, 1, 2], mesh_dim_names=('tp',))",
                "Rank: 5, DeviceMesh([3, 4, 5], mesh_dim_names=('tp',))",
                "Rank: 4, DeviceMesh([3, 4, 5], mesh_dim_names=('tp',))",
                "Rank: 2, DeviceMesh([0, 1, 2], mesh_dim_names=('tp',))",
                "Rank: 1, DeviceMesh([0, 1, 2], mesh_dim_names=('tp',))",
                "Rank: 3, DeviceMesh([3, 4, 5], mesh_dim_names=('tp',))",
            }))
      << output;
}

TEST(MeshExample, SeedPrintout3x2) {
  std::string output;
  ASSERT_EQ(
      RunUnderMeshrun(6, "mesh_example", {"--shape", "3,2", "--names", "dp,tp"}, &output),
      0)
      << output;
  EXPECT_EQ(RankLines(output), (std::set<std::string>{
                                   "Rank: 0, DeviceMesh([0, 1], mesh_dim_names=('tp',))",
                                   "Rank: 1, DeviceMesh([0, 1], mesh_dim_names=('tp',))",
                                   "Rank: 5, DeviceMesh([4, 5], mesh_dim_names=('tp',))",
                                   "Rank: 2, DeviceMesh([2, 3], mesh_dim_names=('tp',))",
                                   "Rank: 4, DeviceMesh([4, 5], mesh_dim_names=('tp',))",
                                   "Rank: 3, DeviceMesh([2, 3], mesh_dim_names=('tp',))",
                               }))
      << output;
}

TEST(MeshExample, SlicesOtherDimensions) {
  std::string output;
  ASSERT_EQ(
      RunUnderMeshrun(4, "mesh_example", {"--shape", "2,2", "--slice", "dp"}, &output), 0)
      << output;
  EXPECT_EQ(RankLines(output), (std::set<std::string>{
                                   "Rank: 0, DeviceMesh([0, 2], mesh_dim_names=('dp',))",
                                   "Rank: 1, DeviceMesh([1, 3], mesh_dim_names=('dp',))",
                                   "Rank: 2, DeviceMesh([0, 2], mesh_dim_names=('dp',))",
                                   "Rank: 3, DeviceMesh([1, 3], mesh_dim_names=('dp',))",
                               }))
      << output;
}

struct ErrorCase {
  std::string label;
  int world;
  std::vector<std::string> args;
  std::string message;
};

class MeshExampleErrors : public ::testing::TestWithParam<ErrorCase> {};

TEST_P(MeshExampleErrors, PrintPyTorchsMessageAndFail) {
  const ErrorCase& c = GetParam();
  std::string output;
  EXPECT_NE(RunUnderMeshrun(c.world, "mesh_example", c.args, &output), 0) << output;
  EXPECT_NE(output.find(c.message), std::string::npos) << output;
}

INSTANTIATE_TEST_SUITE_P(
    Table, MeshExampleErrors,
    ::testing::Values(
        ErrorCase{
            "MeshBiggerThanWorld",
            4,
            {"--shape", "2,3"},
            "Mesh should not be bigger than default world size 4, but found 6 ranks!"},
        // One worker suffices for the others.
        ErrorCase{"NoNames",
                  1,
                  {"--shape", "1", "--no-names"},
                  "Cannot slice a DeviceMesh without mesh_dim_names!"},
        ErrorCase{"RepeatedNames",
                  1,
                  {"--shape", "1,1", "--names", "dp,dp"},
                  "Each mesh_dim_name must be unique. Found repeated mesh_dim_name in "
                  "mesh_dim_names ('dp', 'dp')"},
        ErrorCase{"NamesCount",
                  1,
                  {"--shape", "1,1", "--names", "dp"},
                  "mesh_shape and mesh_dim_names should have same length! Found "
                  "len(mesh_dim_names): 1 and len(mesh_shape):2."},
        ErrorCase{
            "UnknownName",
            1,
            {"--shape", "1,1", "--slice", "pp"},
            "Invalid mesh_dim_names ('pp',) specified. Valid mesh_dim_names are ['dp', "
            "'tp']."},
        ErrorCase{
            "NamesOutOfOrder",
            1,
            {"--shape", "1,1", "--slice", "tp,dp"},
            "Invalid mesh_dim_names ('tp', 'dp') specified. Found mesh dim indices to "
            "slice: [(1,), (0,)]. Mesh dim indices should be in ascending order."},
        ErrorCase{
            "DeviceWithIndex",
            1,
            {"--shape", "1", "--device", "cuda:0"},
            "Device type with index is not supported but got cuda:0. If you maintained "
            "a 'torch.device' object, it's recommended to pass in 'device.type'."},
        // PyTorch allows a world larger than the mesh; rank 2, outside it,
        // cannot slice.
        ErrorCase{
            "RankOutsideTheMesh",
            3,
            {"--shape", "1,2"},
            "In order to get the mesh Tensor of a DeviceMesh it needs to either have "
            "all its original dimensions (e.g., no slicing) or it needs to contain the "
            "local rank"}),
    [](const auto& info) { return info.param.label; });

TEST(DeviceMeshErrors, RuntimeErrorsCarryPyTorchsMessages) {
  std::string output;
  int code = RunUnderMeshrun(4, "mesh_worker",
                             {"--shape", "2,2", "--names", "dp,tp", "--errors"}, &output);
  EXPECT_EQ(code, 0) << output;
  EXPECT_EQ(Tagged(output, "FAIL").size(), 0u) << output;
  EXPECT_EQ(Tagged(output, "DONE").size(), 4u) << output;
}

}  // namespace
}  // namespace meshrun
