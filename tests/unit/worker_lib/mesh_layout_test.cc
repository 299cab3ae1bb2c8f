// MeshLayout against PyTorch's device_mesh.py: the expected groups are written
// out literally, as PyTorch's `mesh.swapdims(-1, d).reshape(-1, mesh.size(d))`
// gives them (checked with torch on this machine), and every error message is
// PyTorch's.

#include "worker_lib/mesh/mesh_layout.h"

#include <map>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace meshrun::worker {
namespace {

using Groups = std::vector<std::vector<int>>;
using Names = std::vector<std::string>;

MeshLayout Make(int world, std::vector<int> shape,
                std::optional<Names> names = std::nullopt) {
  auto layout = MeshLayout::Create("cpu", world, shape, names);
  EXPECT_TRUE(layout.ok()) << layout.status();
  return *layout;
}

std::string Error(const absl::Status& status) {
  EXPECT_FALSE(status.ok());
  return std::string(status.message());
}
template <typename T>
std::string Error(const absl::StatusOr<T>& result) {
  return Error(result.status());
}

struct LayoutCase {
  std::vector<int> shape;
  std::string repr;                // without names
  std::vector<Groups> dim_groups;  // per dimension, in PyTorch's order
};

class LayoutTable : public ::testing::TestWithParam<LayoutCase> {};

TEST_P(LayoutTable, GroupsEqualPyTorchsLayout) {
  const LayoutCase& c = GetParam();
  int numel = 1;
  for (int size : c.shape) numel *= size;
  MeshLayout layout = Make(numel, c.shape);
  EXPECT_EQ(layout.ToString(), c.repr);
  ASSERT_EQ(layout.ndim(), static_cast<int>(c.dim_groups.size()));
  EXPECT_EQ(layout.numel(), numel);
  for (int dim = 0; dim < layout.ndim(); ++dim) {
    EXPECT_EQ(layout.DimGroups(dim), c.dim_groups[dim]) << "dim " << dim;
    EXPECT_EQ(*layout.Size(dim), c.shape[dim]);
  }
}

TEST_P(LayoutTable, EveryRankHasOneGroupPerDimAndItsCoordinate) {
  const LayoutCase& c = GetParam();
  int numel = 1;
  for (int size : c.shape) numel *= size;
  MeshLayout layout = Make(numel, c.shape);
  for (int rank = 0; rank < numel; ++rank) {
    auto coordinate = layout.Coordinate(rank);
    ASSERT_TRUE(coordinate.has_value());
    for (int dim = 0; dim < layout.ndim(); ++dim) {
      int containing = 0;
      for (const auto& group : c.dim_groups[dim]) {
        auto at = std::find(group.begin(), group.end(), rank);
        if (at == group.end()) continue;
        ++containing;
        // Its index in the group is its coordinate along the dimension.
        EXPECT_EQ(at - group.begin(), (*coordinate)[dim]) << "rank " << rank;
        EXPECT_EQ(layout.GroupOf(rank, dim), group);
        auto ref = layout.ResolveLocalRankDim(dim, {});
        ASSERT_TRUE(ref.ok()) << ref.status();
        EXPECT_EQ(layout.LocalRank(rank, *ref, {}), (*coordinate)[dim]);
      }
      EXPECT_EQ(containing, 1) << "rank " << rank << " dim " << dim;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, LayoutTable,
    ::testing::Values(
        LayoutCase{
            {2, 2}, "DeviceMesh([[0, 1], [2, 3]])", {{{0, 2}, {1, 3}}, {{0, 1}, {2, 3}}}},
        LayoutCase{{2, 3},
                   "DeviceMesh([[0, 1, 2], [3, 4, 5]])",
                   {{{0, 3}, {1, 4}, {2, 5}}, {{0, 1, 2}, {3, 4, 5}}}},
        LayoutCase{{3, 2},
                   "DeviceMesh([[0, 1], [2, 3], [4, 5]])",
                   {{{0, 2, 4}, {1, 3, 5}}, {{0, 1}, {2, 3}, {4, 5}}}},
        LayoutCase{{2, 2, 2},
                   "DeviceMesh([[[0, 1], [2, 3]], [[4, 5], [6, 7]]])",
                   {{{0, 4}, {2, 6}, {1, 5}, {3, 7}},
                    {{0, 2}, {1, 3}, {4, 6}, {5, 7}},
                    {{0, 1}, {2, 3}, {4, 5}, {6, 7}}}},
        LayoutCase{{4}, "DeviceMesh([0, 1, 2, 3])", {{{0, 1, 2, 3}}}},
        LayoutCase{{1}, "DeviceMesh([0])", {{{0}}}},
        LayoutCase{
            {1, 4}, "DeviceMesh([[0, 1, 2, 3]])", {{{0}, {1}, {2}, {3}}, {{0, 1, 2, 3}}}},
        LayoutCase{{4, 1},
                   "DeviceMesh([[0], [1], [2], [3]])",
                   {{{0, 1, 2, 3}}, {{0}, {1}, {2}, {3}}}},
        LayoutCase{{2, 1, 2},
                   "DeviceMesh([[[0, 1]], [[2, 3]]])",
                   {{{0, 2}, {1, 3}}, {{0}, {1}, {2}, {3}}, {{0, 1}, {2, 3}}}}));

TEST(MeshLayout, ReprWithNamesIsPyTorchs) {
  EXPECT_EQ(Make(6, {2, 3}, Names{"dp", "tp"}).ToString(),
            "DeviceMesh([[0, 1, 2], [3, 4, 5]], mesh_dim_names=('dp', 'tp'))");
  EXPECT_EQ(Make(4, {4}, Names{"tp"}).ToString(),
            "DeviceMesh([0, 1, 2, 3], mesh_dim_names=('tp',))");
}

TEST(MeshLayout, PythonReprOfNames) {
  EXPECT_EQ(PyRepr("tp"), "'tp'");
  EXPECT_EQ(PyRepr("it's"), "\"it's\"");
  EXPECT_EQ(PyRepr("a'\"b"), "'a\\'\"b'");
  EXPECT_EQ(PyRepr("a\\b\n"), "'a\\\\b\\n'");
  EXPECT_EQ(PyTuple({}), "()");
  EXPECT_EQ(PyTuple({"tp"}), "('tp',)");
  EXPECT_EQ(PyTuple({"dp", "tp"}), "('dp', 'tp')");
  EXPECT_EQ(PyList({"dp", "tp"}), "['dp', 'tp']");
}

// Seed 000's first experiment: each rank's mesh["tp"].
TEST(MeshLayout, SeedTpSubMeshes) {
  const std::map<std::vector<int>, std::vector<std::string>> expected = {
      {{2, 3},
       {"DeviceMesh([0, 1, 2], mesh_dim_names=('tp',))",
        "DeviceMesh([0, 1, 2], mesh_dim_names=('tp',))",
        "DeviceMesh([0, 1, 2], mesh_dim_names=('tp',))",
        "DeviceMesh([3, 4, 5], mesh_dim_names=('tp',))",
        "DeviceMesh([3, 4, 5], mesh_dim_names=('tp',))",
        "DeviceMesh([3, 4, 5], mesh_dim_names=('tp',))"}},
      {{3, 2},
       {"DeviceMesh([0, 1], mesh_dim_names=('tp',))",
        "DeviceMesh([0, 1], mesh_dim_names=('tp',))",
        "DeviceMesh([2, 3], mesh_dim_names=('tp',))",
        "DeviceMesh([2, 3], mesh_dim_names=('tp',))",
        "DeviceMesh([4, 5], mesh_dim_names=('tp',))",
        "DeviceMesh([4, 5], mesh_dim_names=('tp',))"}},
  };
  for (const auto& [shape, reprs] : expected) {
    MeshLayout mesh = Make(6, shape, Names{"dp", "tp"});
    for (int rank = 0; rank < 6; ++rank) {
      auto tp = mesh.Slice({"tp"}, rank, {});
      ASSERT_TRUE(tp.ok()) << tp.status();
      EXPECT_EQ(tp->ToString(), reprs[rank]) << "rank " << rank;
      EXPECT_FALSE(tp->is_root());
      EXPECT_EQ(tp->Coordinate(rank), std::vector<int>{rank % shape[1]});
    }
  }
}

TEST(MeshLayout, SliceEachDimension) {
  MeshLayout mesh = Make(6, {2, 3}, Names{"dp", "tp"});
  EXPECT_EQ(mesh.Slice({"dp"}, 4, {})->ToString(),
            "DeviceMesh([1, 4], mesh_dim_names=('dp',))");
  EXPECT_EQ(mesh.Slice({"dp"}, 2, {})->ranks(), (std::vector<int>{2, 5}));
  // Slicing by all names in order is the mesh itself.
  auto same = mesh.Slice({"dp", "tp"}, 4, {});
  EXPECT_TRUE(same->is_root());
  EXPECT_EQ(same->ToString(), mesh.ToString());
}

TEST(MeshLayout, SliceSeveralDimensionsOf3D) {
  MeshLayout mesh = Make(8, {2, 2, 2}, Names{"dp", "cp", "tp"});
  // PyTorch's docstring: mesh_3d["dp", "cp"] with cp last is [[0, 1], [4, 5]]
  // on ranks 0, 1, 4, 5 -- here "tp" is the last dimension.
  for (int rank : {0, 1, 4, 5}) {
    EXPECT_EQ(mesh.Slice({"dp", "tp"}, rank, {})->ToString(),
              "DeviceMesh([[0, 1], [4, 5]], mesh_dim_names=('dp', 'tp'))");
  }
  for (int rank : {2, 3, 6, 7}) {
    EXPECT_EQ(mesh.Slice({"dp", "tp"}, rank, {})->ToString(),
              "DeviceMesh([[2, 3], [6, 7]], mesh_dim_names=('dp', 'tp'))");
  }
  EXPECT_EQ(mesh.Slice({"dp", "cp"}, 1, {})->ToString(),
            "DeviceMesh([[1, 3], [5, 7]], mesh_dim_names=('dp', 'cp'))");
  EXPECT_EQ(mesh.Slice({"cp", "tp"}, 6, {})->ToString(),
            "DeviceMesh([[4, 5], [6, 7]], mesh_dim_names=('cp', 'tp'))");

  // A sub-mesh's groups and coordinates are its own.
  auto dp_tp = mesh.Slice({"dp", "tp"}, 6, {});
  EXPECT_EQ(dp_tp->DimGroups(0), (Groups{{2, 6}, {3, 7}}));
  EXPECT_EQ(dp_tp->DimGroups(1), (Groups{{2, 3}, {6, 7}}));
  EXPECT_EQ(dp_tp->Coordinate(6), (std::vector<int>{1, 0}));
  EXPECT_EQ(dp_tp->root_dims(), (std::vector<std::vector<int>>{{0}, {2}}));
  // ... and it can be sliced again (PyTorch warns but allows it).
  EXPECT_EQ(dp_tp->Slice({"tp"}, 6, {})->ToString(),
            "DeviceMesh([6, 7], mesh_dim_names=('tp',))");
  EXPECT_EQ(dp_tp->Slice({"dp"}, 6, {})->ToString(),
            "DeviceMesh([2, 6], mesh_dim_names=('dp',))");
}

TEST(MeshLayout, CoordinatesAndLocalRanks) {
  MeshLayout mesh = Make(8, {2, 2, 2}, Names{"dp", "cp", "tp"});
  EXPECT_EQ(mesh.Coordinate(5), (std::vector<int>{1, 0, 1}));
  EXPECT_EQ(mesh.Coordinate(8), std::nullopt);
  auto ref = mesh.ResolveLocalRankDim(MeshDim("cp"), {});
  ASSERT_TRUE(ref.ok());
  EXPECT_EQ(ref->root_dim, 1);
  EXPECT_EQ(mesh.LocalRank(6, *ref, {}), 1);
  EXPECT_EQ(mesh.LocalRank(5, *ref, {}), 0);
  EXPECT_EQ(mesh.LocalRank(9, *ref, {}), std::nullopt);
  // Negative dims count from the end.
  EXPECT_EQ(mesh.ResolveGroupDim(MeshDim(-1), {})->root_dim, 2);
  EXPECT_EQ(*mesh.Size(-3), 2);
  // A 1-D mesh needs no dim.
  MeshLayout tp = *mesh.Slice({"tp"}, 3, {});
  EXPECT_EQ(tp.ResolveLocalRankDim(std::nullopt, {})->root_dim, 2);
  EXPECT_EQ(tp.ResolveGroupDim(std::nullopt, {})->root_dim, 2);
  EXPECT_EQ(tp.ResolveGroupDim(MeshDim("tp"), {})->root_dim, 2);
}

TEST(MeshLayout, WorldLargerThanMesh) {
  // PyTorch only refuses a mesh bigger than the world; ranks outside the
  // mesh have no coordinate and cannot slice.
  MeshLayout mesh = Make(8, {2, 3}, Names{"dp", "tp"});
  EXPECT_FALSE(mesh.IsWholeWorld());
  EXPECT_EQ(mesh.Coordinate(6), std::nullopt);
  EXPECT_EQ(mesh.GroupOf(7, 1), std::nullopt);
  EXPECT_EQ(Error(mesh.Slice({"tp"}, 6, {})),
            "In order to get the mesh Tensor of a DeviceMesh it needs to either have all "
            "its original dimensions (e.g., no slicing) or it needs to contain the local "
            "rank");
  auto plan = mesh.Flatten(std::nullopt, 7, {});
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->groups, (Groups{{0, 1, 2, 3, 4, 5}}));
  EXPECT_FALSE(plan->whole_world);
  EXPECT_FALSE(plan->layout.has_value());
}

TEST(MeshLayout, WholeWorld1DMeshUsesTheDefaultGroup) {
  EXPECT_TRUE(Make(4, {4}).IsWholeWorld());
  EXPECT_FALSE(Make(6, {4}).IsWholeWorld());
  EXPECT_FALSE(Make(4, {2, 2}).IsWholeWorld());
}

// init_device_mesh's errors, in PyTorch's order and wording.
struct CreateErrorCase {
  std::string device;
  int world;
  std::vector<int> shape;
  std::optional<Names> names;
  absl::StatusCode code;
  std::string message;
};

class CreateErrors : public ::testing::TestWithParam<CreateErrorCase> {};

TEST_P(CreateErrors, HavePyTorchsWording) {
  const CreateErrorCase& c = GetParam();
  auto layout = MeshLayout::Create(c.device, c.world, c.shape, c.names);
  ASSERT_FALSE(layout.ok());
  EXPECT_EQ(layout.status().message(), c.message);
  EXPECT_EQ(layout.status().code(), c.code);
}

INSTANTIATE_TEST_SUITE_P(
    Table, CreateErrors,
    ::testing::Values(
        CreateErrorCase{
            "cpu",
            4,
            {2, 3},
            Names{"dp", "tp"},
            absl::StatusCode::kFailedPrecondition,
            "Mesh should not be bigger than default world size 4, but found 6 "
            "ranks!"},
        CreateErrorCase{
            "cpu",
            4,
            {8},
            std::nullopt,
            absl::StatusCode::kFailedPrecondition,
            "Mesh should not be bigger than default world size 4, but found 8 "
            "ranks!"},
        CreateErrorCase{
            "cpu",
            4,
            {2, 2},
            Names{"dp", "dp"},
            absl::StatusCode::kFailedPrecondition,
            "Each mesh_dim_name must be unique. Found repeated mesh_dim_name in "
            "mesh_dim_names ('dp', 'dp')"},
        CreateErrorCase{"cpu",
                        4,
                        {2, 2},
                        Names{"dp"},
                        absl::StatusCode::kFailedPrecondition,
                        "mesh_shape and mesh_dim_names should have same length! Found "
                        "len(mesh_dim_names): 1 and len(mesh_shape):2."},
        CreateErrorCase{"cpu",
                        4,
                        {4},
                        Names{"dp", "tp", "pp"},
                        absl::StatusCode::kFailedPrecondition,
                        "mesh_shape and mesh_dim_names should have same length! Found "
                        "len(mesh_dim_names): 3 and len(mesh_shape):1."},
        // Duplicates are checked before the length.
        CreateErrorCase{
            "cpu",
            4,
            {4},
            Names{"a", "a"},
            absl::StatusCode::kFailedPrecondition,
            "Each mesh_dim_name must be unique. Found repeated mesh_dim_name in "
            "mesh_dim_names ('a', 'a')"},
        CreateErrorCase{"cuda:0",
                        4,
                        {4},
                        std::nullopt,
                        absl::StatusCode::kFailedPrecondition,
                        "Device type with index is not supported but got cuda:0. If you "
                        "maintained a 'torch.device' object, it's recommended to pass in "
                        "'device.type'."},
        // Beyond PyTorch, which fails obscurely on these.
        CreateErrorCase{"cpu",
                        4,
                        {},
                        std::nullopt,
                        absl::StatusCode::kInvalidArgument,
                        "mesh_shape must not be empty"},
        CreateErrorCase{"cpu",
                        4,
                        {2, 0},
                        std::nullopt,
                        absl::StatusCode::kInvalidArgument,
                        "mesh_shape must contain only positive sizes, but got (2, 0)"},
        CreateErrorCase{"cpu",
                        4,
                        {-1},
                        std::nullopt,
                        absl::StatusCode::kInvalidArgument,
                        "mesh_shape must contain only positive sizes, but got (-1,)"}));

TEST(MeshLayout, SliceErrors) {
  MeshLayout unnamed = Make(4, {2, 2});
  EXPECT_EQ(Error(unnamed.Slice({"tp"}, 0, {})),
            "Cannot slice a DeviceMesh without mesh_dim_names!");
  EXPECT_EQ(unnamed.Slice({"tp"}, 0, {}).status().code(),
            absl::StatusCode::kFailedPrecondition);

  MeshLayout mesh = Make(8, {2, 2, 2}, Names{"dp", "cp", "tp"});
  auto invalid = mesh.Slice({"pp"}, 0, {});
  EXPECT_EQ(Error(invalid),
            "Invalid mesh_dim_names ('pp',) specified. Valid mesh_dim_names are ['dp', "
            "'cp', 'tp'].");
  EXPECT_EQ(invalid.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(
      Error(mesh.Slice({"dp", "xx"}, 0, {})),
      "Invalid mesh_dim_names ('dp', 'xx') specified. Valid mesh_dim_names are ['dp', "
      "'cp', 'tp'].");
  EXPECT_EQ(Error(mesh.Slice({"tp", "dp"}, 0, {})),
            "Invalid mesh_dim_names ('tp', 'dp') specified. Found mesh dim indices to "
            "slice: [(2,), (0,)]. Mesh dim indices should be in ascending order.");
  EXPECT_EQ(
      Error(mesh.Slice({"dp", "tp", "cp"}, 0, {})),
      "Invalid mesh_dim_names ('dp', 'tp', 'cp') specified. Found mesh dim indices "
      "to slice: [(0,), (2,), (1,)]. Mesh dim indices should be in ascending order.");
  // A repeated name is out of order too.
  EXPECT_EQ(Error(mesh.Slice({"dp", "dp"}, 0, {})),
            "Invalid mesh_dim_names ('dp', 'dp') specified. Found mesh dim indices to "
            "slice: [(0,), (0,)]. Mesh dim indices should be in ascending order.");
  // A sub-mesh knows only its own names.
  auto dp_tp = mesh.Slice({"dp", "tp"}, 0, {});
  EXPECT_EQ(Error(dp_tp->Slice({"cp"}, 0, {})),
            "Invalid mesh_dim_names ('cp',) specified. Valid mesh_dim_names are ['dp', "
            "'tp'].");
}

TEST(MeshLayout, GroupDimErrors) {
  MeshLayout mesh = Make(6, {2, 3}, Names{"dp", "tp"});
  EXPECT_EQ(
      Error(mesh.ResolveGroupDim(std::nullopt, {})),
      "Found the DeviceMesh have 2 dimensions Optional kwarg `mesh_dim` needs to be "
      "specified when device_mesh.ndim > 1. If you want to get the list of all the "
      "ProcessGroups in the DeviceMesh,please use `get_all_groups()` instead.");
  EXPECT_EQ(
      Error(mesh.ResolveLocalRankDim(std::nullopt, {})),
      "Found the DeviceMesh have 2 dimensions Optional kwarg `mesh_dim` needs to be "
      "specified when device_mesh.ndim > 1.");
  EXPECT_EQ(Error(mesh.ResolveGroupDim(MeshDim("pp"), {})),
            "Mesh dimension 'pp' does not exist. Available mesh dimensions are: "
            "mesh_dim_names=('dp', 'tp')");
  EXPECT_EQ(Error(mesh.ResolveGroupDim(MeshDim(2), {})), "list index out of range");
  EXPECT_EQ(Error(mesh.ResolveGroupDim(MeshDim(-3), {})), "list index out of range");
  EXPECT_EQ(Error(Make(4, {2, 2}).ResolveGroupDim(MeshDim("tp"), {})),
            "No `mesh_dim_names` found.");
  EXPECT_EQ(Error(mesh.Size(2)),
            "Dimension out of range (expected to be in range of [-2, 1], but got 2)");
  EXPECT_EQ(Error(mesh.Size(-3)),
            "Dimension out of range (expected to be in range of [-2, 1], but got -3)");
  EXPECT_EQ(mesh.DimIndex("tp").value(), 1);
}

// Flatten on the 3-D mesh of PyTorch's _flatten docstring.
class FlattenTest : public ::testing::Test {
 protected:
  MeshLayout mesh_ = Make(8, {2, 2, 2}, Names{"dp", "cp", "tp"});
  std::vector<FlattenedDim> registry_;

  FlattenPlan FlattenAndRegister(const MeshLayout& from, std::optional<std::string> name,
                                 int rank) {
    auto plan = from.Flatten(name, rank, registry_);
    EXPECT_TRUE(plan.ok()) << plan.status();
    if (plan->kind == FlattenPlan::Kind::kNew) registry_.push_back(plan->dim);
    return *plan;
  }
};

TEST_F(FlattenTest, ContiguousDimsDefaultName) {
  MeshLayout dp_cp = *mesh_.Slice({"dp", "cp"}, 3, {});
  FlattenPlan plan = FlattenAndRegister(dp_cp, std::nullopt, 3);
  EXPECT_EQ(plan.kind, FlattenPlan::Kind::kNew);
  EXPECT_EQ(plan.dim.name, "dp_cp");
  EXPECT_EQ(plan.dim.root_dims, (std::vector<int>{0, 1}));
  EXPECT_EQ(plan.groups, (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  EXPECT_FALSE(plan.whole_world);
  ASSERT_TRUE(plan.layout.has_value());
  EXPECT_EQ(plan.layout->ToString(),
            "DeviceMesh([1, 3, 5, 7], mesh_dim_names=('dp_cp',))");
  EXPECT_EQ(plan.layout->ResolveGroupDim(std::nullopt, registry_)->flattened, "dp_cp");

  // The root can now be sliced by the flattened name, alone or with others.
  EXPECT_EQ(mesh_.Slice({"dp_cp"}, 3, registry_)->ToString(),
            "DeviceMesh([1, 3, 5, 7], mesh_dim_names=('dp_cp',))");
  auto with_tp = mesh_.Slice({"dp_cp", "tp"}, 3, registry_);
  ASSERT_TRUE(with_tp.ok()) << with_tp.status();
  EXPECT_EQ(
      with_tp->ToString(),
      "DeviceMesh([[0, 1], [2, 3], [4, 5], [6, 7]], mesh_dim_names=('dp_cp', 'tp'))");
  EXPECT_EQ(with_tp->DimGroups(0), (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  EXPECT_EQ(with_tp->ResolveGroupDim(MeshDim(0), registry_)->flattened, "dp_cp");
  EXPECT_EQ(with_tp->ResolveGroupDim(MeshDim(1), registry_)->root_dim, 2);
  EXPECT_EQ(Error(mesh_.Slice({"tp", "dp_cp"}, 3, registry_)),
            "Invalid mesh_dim_names ('tp', 'dp_cp') specified. Found mesh dim indices to "
            "slice: [(2,), (0, 1)]. Mesh dim indices should be in ascending order.");
  EXPECT_EQ(Error(mesh_.Slice({"dp", "dp_cp"}, 3, registry_)),
            "Currently, this only allows slicing out a contiguous flattened dim.");
  EXPECT_EQ(Error(mesh_.Slice({"pp"}, 3, registry_)),
            "Invalid mesh_dim_names ('pp',) specified. Valid mesh_dim_names are ['dp', "
            "'cp', 'tp', 'dp_cp'].");
  // Only the root knows flattened names.
  EXPECT_EQ(Error(with_tp->Slice({"dp_cp", "tp", "x"}, 3, registry_)),
            "Invalid mesh_dim_names ('dp_cp', 'tp', 'x') specified. Valid mesh_dim_names "
            "are ['dp_cp', 'tp'].");
  EXPECT_EQ(
      Error(dp_cp.Slice({"dp_cp"}, 3, registry_)),
      "Invalid mesh_dim_names ('dp_cp',) specified. Valid mesh_dim_names are ['dp', "
      "'cp'].");

  // get_group / get_local_rank by the flattened name, from any mesh of the root.
  auto ref = mesh_.ResolveGroupDim(MeshDim("dp_cp"), registry_);
  EXPECT_EQ(ref->flattened, "dp_cp");
  EXPECT_EQ(mesh_.LocalRank(5, *ref, registry_), 2);
  EXPECT_EQ(dp_cp.ResolveGroupDim(MeshDim("dp_cp"), registry_)->flattened, "dp_cp");

  // Flattening again under the same name reuses it.
  FlattenPlan again = FlattenAndRegister(dp_cp, std::nullopt, 3);
  EXPECT_EQ(again.kind, FlattenPlan::Kind::kExisting);
  EXPECT_TRUE(again.groups.empty());
  EXPECT_EQ(again.layout->ranks(), (std::vector<int>{1, 3, 5, 7}));
  EXPECT_EQ(registry_.size(), 1u);
}

TEST_F(FlattenTest, NonContiguousDimsAndWholeMesh) {
  MeshLayout dp_tp = *mesh_.Slice({"dp", "tp"}, 2, {});
  FlattenPlan plan = FlattenAndRegister(dp_tp, std::nullopt, 2);
  EXPECT_EQ(plan.dim.name, "dp_tp");
  EXPECT_EQ(plan.dim.root_dims, (std::vector<int>{0, 2}));
  EXPECT_EQ(plan.groups, (Groups{{0, 1, 4, 5}, {2, 3, 6, 7}}));
  EXPECT_EQ(plan.layout->ranks(), (std::vector<int>{2, 3, 6, 7}));
  // PyTorch cannot slice it back out of the root correctly; refuse.
  EXPECT_EQ(Error(mesh_.Slice({"dp_tp"}, 2, registry_)),
            "Currently, this only allows slicing out a contiguous flattened dim.");

  FlattenPlan all = FlattenAndRegister(mesh_, "world", 2);
  EXPECT_EQ(all.groups, (Groups{{0, 1, 2, 3, 4, 5, 6, 7}}));
  EXPECT_TRUE(all.whole_world);
  EXPECT_EQ(all.layout->ToString(),
            "DeviceMesh([0, 1, 2, 3, 4, 5, 6, 7], mesh_dim_names=('world',))");
  FlattenPlan named = FlattenAndRegister(mesh_, std::string(""), 2);
  EXPECT_EQ(named.dim.name, "dp_cp_tp");  // an empty name means the default
}

TEST_F(FlattenTest, OneDimensionalMeshes) {
  MeshLayout tp = *mesh_.Slice({"tp"}, 5, {});
  FlattenPlan self = FlattenAndRegister(tp, std::nullopt, 5);
  EXPECT_EQ(self.kind, FlattenPlan::Kind::kSelf);
  EXPECT_EQ(self.layout->ToString(), tp.ToString());
  FlattenPlan renamed = FlattenAndRegister(tp, "tp2", 5);
  EXPECT_EQ(renamed.kind, FlattenPlan::Kind::kNew);
  EXPECT_EQ(renamed.groups, (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(renamed.layout->ToString(), "DeviceMesh([4, 5], mesh_dim_names=('tp2',))");
  // A dimension flattened under its own name keeps its own group.
  EXPECT_EQ(renamed.layout->ResolveGroupDim(std::nullopt, registry_)->flattened, "tp2");
  EXPECT_EQ(mesh_.Slice({"tp2"}, 5, registry_)->ToString(),
            "DeviceMesh([4, 5], mesh_dim_names=('tp2',))");
}

TEST_F(FlattenTest, Errors) {
  EXPECT_EQ(Error(Make(4, {2, 2}).Flatten(std::nullopt, 0, {})),
            "Cannot flatten a DeviceMesh without mesh_dim_names!");
  MeshLayout dp_cp = *mesh_.Slice({"dp", "cp"}, 0, {});
  auto exists = dp_cp.Flatten("tp", 0, registry_);
  EXPECT_EQ(Error(exists),
            "tp already exists for submesh of the DeviceMesh([[[0, 1], [2, 3]], [[4, 5], "
            "[6, 7]]], mesh_dim_names=('dp', 'cp', 'tp')). The mesh_dim_names of submesh "
            "and flattened mesh are ('dp', 'cp', 'tp'). Please specify another valid "
            "mesh_dim_name.");
  EXPECT_EQ(exists.status().code(), absl::StatusCode::kInvalidArgument);
  FlattenAndRegister(dp_cp, "x", 0);
  MeshLayout cp_tp = *mesh_.Slice({"cp", "tp"}, 0, {});
  EXPECT_EQ(Error(cp_tp.Flatten("x", 0, registry_)),
            "Flatten mesh with mesh_dim_name x has been created before, Please specify "
            "another valid mesh_dim_name.");
}

}  // namespace
}  // namespace meshrun::worker
