#pragma once

// DeviceMesh for C++ workers, with PyTorch's semantics
// (torch.distributed.device_mesh): a row-major n-d layout of the world's
// ranks with one process group per row of each dimension, sliced by name
// (`mesh["tp"]`, `mesh[{"dp", "tp"}]`) and flattened (`Flatten()`).
//
//   auto world = InitProcessGroup("gloo");
//   auto mesh = InitDeviceMesh(*world, "cpu", {2, 3}, {{"dp", "tp"}});
//   auto tp = (*mesh)["tp"];                  // DeviceMesh([3, 4, 5], ...) on rank 4
//   auto group = tp->GetGroup();              // the tp group of this rank
//
// The layout and every error message come from MeshLayout (mesh_layout.h).
// Errors are returned as statuses, never thrown.
//
// Collective calls: InitDeviceMesh, and Flatten when it creates groups, call
// NewGroup for every group of the world in the same order on every rank, as
// PyTorch does; every rank of the world must make them, in the same order.
// Slicing, GetGroup and the other accessors are local: a slice reuses its
// parent's groups.
//
// Ranks outside the mesh (world larger than the mesh, which PyTorch allows)
// take part in the collective calls, have no coordinate and no groups, and
// cannot slice.
//
// Thread-safety: a DeviceMesh and the meshes sliced or flattened from it
// share their root's state (its groups and flattened dimensions); use them
// from one thread, as collective order requires anyway.

#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <vector>

#include "absl/status/statusor.h"
#include "worker_lib/mesh/mesh_layout.h"
#include "worker_lib/mesh/process_group.h"

namespace meshrun::worker {

using ProcessGroupPtr = c10::intrusive_ptr<c10d::ProcessGroup>;

class DeviceMesh {
 public:
  // "cpu" or "cuda" (the device type given to InitDeviceMesh).
  const std::string& device_type() const;
  // The global ranks of this mesh in row-major order, and its shape.
  const std::vector<int>& mesh() const { return layout_.ranks(); }
  const std::vector<int>& shape() const { return layout_.shape(); }
  const std::optional<std::vector<std::string>>& mesh_dim_names() const {
    return layout_.dim_names();
  }
  int ndim() const { return layout_.ndim(); }
  // Number of ranks in the mesh.
  int Size() const { return layout_.numel(); }
  // Size along `dim` (negative counts from the end).
  absl::StatusOr<int> Size(int dim) const { return layout_.Size(dim); }
  // This process's global rank.
  int GetRank() const;
  const MeshLayout& layout() const { return layout_; }
  World& world() const;

  // The group of this rank along `mesh_dim` (index or name; a name flattened
  // from the root mesh also works). Without `mesh_dim` the mesh must be 1-D.
  absl::StatusOr<ProcessGroupPtr> GetGroup() const;
  absl::StatusOr<ProcessGroupPtr> GetGroup(const MeshDim& mesh_dim) const;
  // One group per dimension.
  absl::StatusOr<std::vector<ProcessGroupPtr>> GetAllGroups() const;
  // This rank's rank in GetGroup(mesh_dim).
  absl::StatusOr<int> GetLocalRank() const;
  absl::StatusOr<int> GetLocalRank(const MeshDim& mesh_dim) const;
  // This rank's index along each dimension; nullopt if it is not in the mesh.
  std::optional<std::vector<int>> GetCoordinate() const;

  // mesh[names]: the sub-mesh of the named dimensions (in the mesh's order)
  // that contains this rank, with the parent's groups. Local.
  absl::StatusOr<DeviceMesh> operator[](const std::string& name) const;
  absl::StatusOr<DeviceMesh> operator[](std::initializer_list<std::string> names) const;
  absl::StatusOr<DeviceMesh> Slice(const std::vector<std::string>& names) const;

  // mesh._flatten(name): a 1-D mesh of all this mesh's dimensions, named
  // `name` (default: the names joined by "_"), registered with the root mesh
  // so that root[name] and GetGroup(name) find it. Collective over the world
  // when it creates the groups (the first time for a name).
  absl::StatusOr<DeviceMesh> Flatten(
      const std::optional<std::string>& name = std::nullopt);

  // The mesh as an int32 tensor of shape(), as PyTorch's `mesh.mesh`.
  at::Tensor MeshTensor() const;

  // PyTorch's repr: DeviceMesh([3, 4, 5], mesh_dim_names=('tp',)).
  std::string ToString() const { return layout_.ToString(); }

 private:
  struct Root;
  friend absl::StatusOr<DeviceMesh> InitDeviceMesh(
      const std::shared_ptr<World>& world, const std::string& device_type,
      const std::vector<int>& shape,
      const std::optional<std::vector<std::string>>& names);

  DeviceMesh(std::shared_ptr<Root> root, MeshLayout layout)
      : root_(std::move(root)), layout_(std::move(layout)) {}
  absl::StatusOr<ProcessGroupPtr> GroupOf(const DimRef& ref) const;

  std::shared_ptr<Root> root_;
  MeshLayout layout_;
};

// init_device_mesh(device_type, shape, mesh_dim_names): the mesh
// arange(prod(shape)).view(shape) over `world`, with one group per row of
// each dimension (a 1-D mesh of the whole world uses the world's group).
// Groups use the world's backend. Collective over the world. `world` is kept
// alive by the mesh.
absl::StatusOr<DeviceMesh> InitDeviceMesh(
    const std::shared_ptr<World>& world, const std::string& device_type,
    const std::vector<int>& shape,
    const std::optional<std::vector<std::string>>& names = std::nullopt);

}  // namespace meshrun::worker
