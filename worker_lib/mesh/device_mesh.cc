#include "worker_lib/mesh/device_mesh.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace meshrun::worker {

// What a root mesh and every mesh sliced or flattened from it share.
struct DeviceMesh::Root {
  std::shared_ptr<World> world;
  std::string device_type;
  MeshLayout layout;
  // This rank's group along each root dimension; null when not a member.
  std::vector<ProcessGroupPtr> dim_groups;
  // Dimensions flattened from this root, and this rank's group of each.
  std::vector<FlattenedDim> flattened;
  std::map<std::string, ProcessGroupPtr> flattened_groups;
};

namespace {

// Creates one group per row, on every rank, in order; returns this rank's
// (null if it is in none). `whole_world`: the only row is the world, whose
// group PyTorch reuses.
absl::StatusOr<ProcessGroupPtr> CreateGroups(World& world,
                                             const std::vector<std::vector<int>>& rows,
                                             bool whole_world) {
  if (whole_world) return world.group();
  ProcessGroupPtr mine;
  for (const auto& row : rows) {
    auto group = NewGroup(world, row);
    if (!group.ok()) return group.status();
    if (*group) mine = *group;
  }
  return mine;
}

}  // namespace

absl::StatusOr<DeviceMesh> InitDeviceMesh(
    const std::shared_ptr<World>& world, const std::string& device_type,
    const std::vector<int>& shape, const std::optional<std::vector<std::string>>& names) {
  if (!world) return absl::InvalidArgumentError("InitDeviceMesh: no world");
  auto layout = MeshLayout::Create(device_type, world->size(), shape, names);
  if (!layout.ok()) return layout.status();
  auto root = std::make_shared<DeviceMesh::Root>(
      DeviceMesh::Root{world, device_type, *layout, {}, {}, {}});
  for (int dim = 0; dim < layout->ndim(); ++dim) {
    auto group = CreateGroups(*world, layout->DimGroups(dim), layout->IsWholeWorld());
    if (!group.ok()) return group.status();
    root->dim_groups.push_back(*group);
  }
  return DeviceMesh(root, *layout);
}

const std::string& DeviceMesh::device_type() const { return root_->device_type; }

int DeviceMesh::GetRank() const { return root_->world->rank(); }

World& DeviceMesh::world() const { return *root_->world; }

absl::StatusOr<ProcessGroupPtr> DeviceMesh::GroupOf(const DimRef& ref) const {
  ProcessGroupPtr group;
  if (!ref.flattened.empty()) {
    auto it = root_->flattened_groups.find(ref.flattened);
    if (it != root_->flattened_groups.end()) group = it->second;
  } else {
    group = root_->dim_groups.at(ref.root_dim);
  }
  if (!group) {
    return absl::FailedPreconditionError(
        absl::StrCat("Rank ", GetRank(), " is not in ", root_->layout.ToString(),
                     ", so it has no process group along ",
                     ref.flattened.empty() ? absl::StrCat("dimension ", ref.root_dim)
                                           : PyRepr(ref.flattened)));
  }
  return group;
}

absl::StatusOr<ProcessGroupPtr> DeviceMesh::GetGroup() const {
  auto ref = layout_.ResolveGroupDim(std::nullopt, root_->flattened);
  if (!ref.ok()) return ref.status();
  return GroupOf(*ref);
}

absl::StatusOr<ProcessGroupPtr> DeviceMesh::GetGroup(const MeshDim& mesh_dim) const {
  auto ref = layout_.ResolveGroupDim(mesh_dim, root_->flattened);
  if (!ref.ok()) return ref.status();
  return GroupOf(*ref);
}

absl::StatusOr<std::vector<ProcessGroupPtr>> DeviceMesh::GetAllGroups() const {
  std::vector<ProcessGroupPtr> groups;
  for (int dim = 0; dim < ndim(); ++dim) {
    auto group = GetGroup(dim);
    if (!group.ok()) return group.status();
    groups.push_back(*group);
  }
  return groups;
}

absl::StatusOr<int> DeviceMesh::GetLocalRank() const {
  auto ref = layout_.ResolveLocalRankDim(std::nullopt, root_->flattened);
  if (!ref.ok()) return ref.status();
  auto group = GroupOf(*ref);
  if (!group.ok()) return group.status();
  return (*group)->getRank();
}

absl::StatusOr<int> DeviceMesh::GetLocalRank(const MeshDim& mesh_dim) const {
  auto ref = layout_.ResolveLocalRankDim(mesh_dim, root_->flattened);
  if (!ref.ok()) return ref.status();
  auto group = GroupOf(*ref);
  if (!group.ok()) return group.status();
  return (*group)->getRank();
}

std::optional<std::vector<int>> DeviceMesh::GetCoordinate() const {
  return layout_.Coordinate(GetRank());
}

absl::StatusOr<DeviceMesh> DeviceMesh::operator[](const std::string& name) const {
  return Slice({name});
}

absl::StatusOr<DeviceMesh> DeviceMesh::operator[](
    std::initializer_list<std::string> names) const {
  return Slice(std::vector<std::string>(names));
}

absl::StatusOr<DeviceMesh> DeviceMesh::Slice(
    const std::vector<std::string>& names) const {
  auto sub = layout_.Slice(names, GetRank(), root_->flattened);
  if (!sub.ok()) return sub.status();
  return DeviceMesh(root_, *std::move(sub));
}

absl::StatusOr<DeviceMesh> DeviceMesh::Flatten(const std::optional<std::string>& name) {
  auto plan = layout_.Flatten(name, GetRank(), root_->flattened);
  if (!plan.ok()) return plan.status();
  if (plan->kind == FlattenPlan::Kind::kSelf) return *this;
  if (plan->kind == FlattenPlan::Kind::kNew) {
    auto group = CreateGroups(*root_->world, plan->groups, plan->whole_world);
    if (!group.ok()) return group.status();
    root_->flattened.push_back(plan->dim);
    root_->flattened_groups[plan->dim.name] = *group;
  }
  if (!plan->layout) return NotInMeshError();
  return DeviceMesh(root_, *std::move(plan->layout));
}

at::Tensor DeviceMesh::MeshTensor() const {
  std::vector<int64_t> sizes(shape().begin(), shape().end());
  return at::tensor(mesh(), at::TensorOptions().dtype(at::kInt)).view(sizes);
}

}  // namespace meshrun::worker
