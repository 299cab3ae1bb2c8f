#pragma once

// The rank layout of a DeviceMesh, computed as PyTorch's
// torch/distributed/device_mesh.py computes it, as pure data: no libtorch, no
// process groups, no I/O. DeviceMesh (device_mesh.h) pairs it with groups.
//
// A root layout is init_device_mesh's `arange(prod(shape)).view(shape)`: the
// global ranks in row-major order. Slicing (`mesh["tp"]`, `mesh[{"dp","tp"}]`)
// and flattening give views of the root: each view dimension covers one root
// dimension, or several after a flatten, and a view holds the ranks of the
// sub-mesh that contains a given rank, as each rank's PyTorch DeviceMesh does.
//
// Errors carry PyTorch's messages word for word. Where PyTorch raises with
// several arguments (`RuntimeError("a.", "b")`) the parts are joined by a
// space. The Python exception maps to a status code: RuntimeError ->
// FailedPrecondition, KeyError -> NotFound, ValueError -> InvalidArgument,
// IndexError -> OutOfRange, NotImplementedError -> Unimplemented.
//
// Thread-safety: a MeshLayout is an immutable value; share it freely.

#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace meshrun::worker {

// Python's repr() of a str, a tuple of str and a list of str, as PyTorch's
// f-strings print them: 'tp', ('tp',), ('dp', 'tp'), ['dp', 'tp'].
std::string PyRepr(const std::string& text);
std::string PyTuple(const std::vector<std::string>& items);
std::string PyList(const std::vector<std::string>& items);

// A mesh dimension named by index or by name: PyTorch's `mesh_dim: int | str`.
class MeshDim {
 public:
  MeshDim(int index) : value_(index) {}  // NOLINT(google-explicit-constructor)
  MeshDim(std::string name) : value_(std::move(name)) {}    // NOLINT
  MeshDim(const char* name) : value_(std::string(name)) {}  // NOLINT
  bool is_name() const { return std::holds_alternative<std::string>(value_); }
  int index() const { return std::get<int>(value_); }
  const std::string& name() const { return std::get<std::string>(value_); }

 private:
  std::variant<int, std::string> value_;
};

// A dimension made by DeviceMesh._flatten, registered with its root mesh:
// its name and the root dimensions it covers (ascending).
struct FlattenedDim {
  std::string name;
  std::vector<int> root_dims;
};

// Whose process group get_group / get_local_rank's `mesh_dim` means: a root
// dimension's, or a flattened dimension's (then `flattened` is its name).
struct DimRef {
  int root_dim = -1;
  std::string flattened;
};

struct FlattenPlan;

class MeshLayout {
 public:
  // init_device_mesh(device_type, shape, mesh_dim_names) on a world of
  // `world_size` ranks. Validates as PyTorch does, in its order. Beyond
  // PyTorch (which fails obscurely), an empty shape or a size < 1 is refused.
  static absl::StatusOr<MeshLayout> Create(
      const std::string& device_type, int world_size, const std::vector<int>& shape,
      const std::optional<std::vector<std::string>>& dim_names = std::nullopt);

  int world_size() const { return world_size_; }
  int ndim() const { return static_cast<int>(shape_.size()); }
  int numel() const { return static_cast<int>(ranks_.size()); }
  const std::vector<int>& shape() const { return shape_; }
  // The global ranks of this mesh in row-major order.
  const std::vector<int>& ranks() const { return ranks_; }
  const std::optional<std::vector<std::string>>& dim_names() const { return dim_names_; }
  // True for init_device_mesh's mesh; false for slices and flattened meshes.
  bool is_root() const { return is_root_; }
  // For each dimension, the root dimensions it covers.
  const std::vector<std::vector<int>>& root_dims() const { return root_dims_; }
  const std::vector<int>& root_shape() const { return root_shape_; }
  const std::optional<std::vector<std::string>>& root_dim_names() const {
    return root_dim_names_;
  }
  // A 1-D root mesh as large as the world: PyTorch uses the default group for
  // its only dimension instead of creating one.
  bool IsWholeWorld() const { return ndim() == 1 && numel() == world_size_; }

  // mesh.size(dim): negative dims count from the end; out of range is torch's
  // "Dimension out of range" error.
  absl::StatusOr<int> Size(int dim) const;
  // The rank groups along `dim`, PyTorch's
  // `mesh.swapdims(-1, dim).reshape(-1, mesh.size(dim))` rows, in that order.
  // REQUIRES: 0 <= dim < ndim().
  std::vector<std::vector<int>> DimGroups(int dim) const;
  // The group along `dim` that holds `rank`; nullopt if the rank is not in
  // the mesh. REQUIRES: 0 <= dim < ndim().
  std::optional<std::vector<int>> GroupOf(int rank, int dim) const;
  // The rank's index along each dimension; nullopt if it is not in the mesh.
  std::optional<std::vector<int>> Coordinate(int rank) const;
  // get_mesh_dim_by_name: the index of the dimension called `name`.
  absl::StatusOr<int> DimIndex(const std::string& name) const;

  // Resolves get_group's `mesh_dim` (nullopt: not given). `flattened` is the
  // root's registry of flattened dimensions, consulted first, as PyTorch does.
  absl::StatusOr<DimRef> ResolveGroupDim(
      const std::optional<MeshDim>& mesh_dim,
      const std::vector<FlattenedDim>& flattened) const;
  // The same for get_local_rank (its own message when `mesh_dim` is missing).
  absl::StatusOr<DimRef> ResolveLocalRankDim(
      const std::optional<MeshDim>& mesh_dim,
      const std::vector<FlattenedDim>& flattened) const;
  // The rank's index in the group `ref` names; nullopt if it is not a member.
  std::optional<int> LocalRank(int rank, const DimRef& ref,
                               const std::vector<FlattenedDim>& flattened) const;

  // mesh[names]: the sub-mesh of `names` that holds `rank`. A root mesh can
  // also be sliced by the names in `flattened` (its registry); other meshes
  // ignore it, as in PyTorch.
  absl::StatusOr<MeshLayout> Slice(const std::vector<std::string>& names, int rank,
                                   const std::vector<FlattenedDim>& flattened) const;
  // mesh._flatten(name): `name` defaults to the dim names joined by "_".
  // `flattened` is the root's registry; the caller registers a kNew result.
  absl::StatusOr<FlattenPlan> Flatten(const std::optional<std::string>& name, int rank,
                                      const std::vector<FlattenedDim>& flattened) const;

  // PyTorch 2.4/2.5's repr, as seed 000 prints it:
  // DeviceMesh([[0, 1, 2], [3, 4, 5]], mesh_dim_names=('dp', 'tp')), or
  // DeviceMesh([0, 1, 2, 3]) without names. (Later PyTorch versions print the
  // device type and strides instead.)
  std::string ToString() const;

 private:
  MeshLayout() = default;
  std::string RootToString() const;
  std::vector<int> RootCoordinate(int rank) const;  // REQUIRES: rank in root
  bool InRoot(int rank) const;
  // The ranks that share `rank`'s root coordinate outside `dims`, with
  // `dims` enumerated row-major (PyTorch's permute(rest, dims) row).
  std::vector<int> RootRow(int rank, const std::vector<int>& dims) const;

  int world_size_ = 0;
  std::vector<int> root_shape_;
  std::optional<std::vector<std::string>> root_dim_names_;
  bool is_root_ = true;
  std::vector<int> shape_;
  std::vector<int> ranks_;
  std::optional<std::vector<std::string>> dim_names_;
  std::vector<std::vector<int>> root_dims_;
};

// The outcome of MeshLayout::Flatten.
struct FlattenPlan {
  enum class Kind {
    kSelf,      // a 1-D mesh flattened into its own name: the mesh itself
    kExisting,  // flattened before under this name: reuse its groups
    kNew,       // create one group per row in `groups`, in order
  };
  Kind kind = Kind::kNew;
  FlattenedDim dim;
  // kNew: every row of the flattened dimension over the root mesh, in
  // PyTorch's order. Every rank of the world creates them all, in this order.
  std::vector<std::vector<int>> groups;
  // kNew: the single row is the whole world, so PyTorch uses the default
  // group instead of creating one.
  bool whole_world = false;
  // The 1-D mesh of the row that contains the rank; nullopt when the rank is
  // not in the mesh.
  std::optional<MeshLayout> layout;
};

// The error for a rank outside a mesh asked for a part of it (PyTorch's
// wording for reading a sliced mesh's tensor on such a rank).
absl::Status NotInMeshError();

}  // namespace meshrun::worker
