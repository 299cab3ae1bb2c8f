#include "worker_lib/mesh/mesh_layout.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <functional>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace meshrun::worker {
namespace {

// Python exception -> status code (see the header).
absl::Status RuntimeError(std::string message) {
  return absl::FailedPreconditionError(std::move(message));
}
absl::Status KeyError(std::string message) {
  return absl::NotFoundError(std::move(message));
}
absl::Status ValueError(std::string message) {
  return absl::InvalidArgumentError(std::move(message));
}
absl::Status IndexError(std::string message) {
  return absl::OutOfRangeError(std::move(message));
}
absl::Status NotImplementedError(std::string message) {
  return absl::UnimplementedError(std::move(message));
}

std::string PyIntTuple(const std::vector<int>& items) {
  if (items.size() == 1) return absl::StrCat("(", items[0], ",)");
  return absl::StrCat("(", absl::StrJoin(items, ", "), ")");
}

int64_t Product(const std::vector<int>& sizes) {
  int64_t product = 1;
  for (int size : sizes) {
    if (size > 0 && product > INT64_MAX / size) return INT64_MAX;  // saturate
    product *= size;
  }
  return product;
}

std::vector<int> Unravel(int64_t index, const std::vector<int>& shape) {
  std::vector<int> coordinate(shape.size());
  for (size_t i = shape.size(); i-- > 0;) {
    coordinate[i] = static_cast<int>(index % shape[i]);
    index /= shape[i];
  }
  return coordinate;
}

int64_t Ravel(const std::vector<int>& coordinate, const std::vector<int>& shape) {
  int64_t index = 0;
  for (size_t i = 0; i < shape.size(); ++i) index = index * shape[i] + coordinate[i];
  return index;
}

// The row-major elements of `values.view(shape).permute(perm)`.
std::vector<int> Permute(const std::vector<int>& values, const std::vector<int>& shape,
                         const std::vector<int>& perm) {
  std::vector<int> permuted_shape;
  for (int axis : perm) permuted_shape.push_back(shape[axis]);
  std::vector<int> out;
  out.reserve(values.size());
  std::vector<int> source(shape.size());
  for (size_t i = 0; i < values.size(); ++i) {
    std::vector<int> at = Unravel(static_cast<int64_t>(i), permuted_shape);
    for (size_t k = 0; k < perm.size(); ++k) source[perm[k]] = at[k];
    out.push_back(values[Ravel(source, shape)]);
  }
  return out;
}

std::vector<std::vector<int>> Rows(const std::vector<int>& values, int row_size) {
  std::vector<std::vector<int>> rows;
  for (size_t at = 0; at < values.size(); at += row_size)
    rows.emplace_back(values.begin() + at, values.begin() + at + row_size);
  return rows;
}

// Python's list repr of `ranks` viewed with `shape`, nested.
std::string NestedList(const std::vector<int>& ranks, const std::vector<int>& shape) {
  std::string out;
  std::function<void(size_t, size_t)> emit = [&](size_t axis, size_t offset) {
    out += '[';
    int64_t stride = 1;
    for (size_t k = axis + 1; k < shape.size(); ++k) stride *= shape[k];
    for (int i = 0; i < shape[axis]; ++i) {
      if (i > 0) out += ", ";
      if (axis + 1 == shape.size()) {
        absl::StrAppend(&out, ranks[offset + i]);
      } else {
        emit(axis + 1, offset + i * stride);
      }
    }
    out += ']';
  };
  emit(0, 0);
  return out;
}

std::string Repr(const std::vector<int>& ranks, const std::vector<int>& shape,
                 const std::optional<std::vector<std::string>>& names) {
  std::string out = absl::StrCat("DeviceMesh(", NestedList(ranks, shape));
  if (names) absl::StrAppend(&out, ", mesh_dim_names=", PyTuple(*names));
  return out + ")";
}

const FlattenedDim* FindFlattened(const std::vector<FlattenedDim>& flattened,
                                  const std::string& name) {
  for (const auto& dim : flattened)
    if (dim.name == name) return &dim;
  return nullptr;
}

bool Contains(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

}  // namespace

std::string PyRepr(const std::string& text) {
  const bool has_single = text.find('\'') != std::string::npos;
  const bool has_double = text.find('"') != std::string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (unsigned char c : text) {
    if (c == '\\' || c == quote) {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      static const char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 0xf];
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + quote;
}

std::string PyTuple(const std::vector<std::string>& items) {
  std::vector<std::string> reprs;
  for (const auto& item : items) reprs.push_back(PyRepr(item));
  if (reprs.size() == 1) return absl::StrCat("(", reprs[0], ",)");
  return absl::StrCat("(", absl::StrJoin(reprs, ", "), ")");
}

std::string PyList(const std::vector<std::string>& items) {
  std::vector<std::string> reprs;
  for (const auto& item : items) reprs.push_back(PyRepr(item));
  return absl::StrCat("[", absl::StrJoin(reprs, ", "), "]");
}

absl::Status NotInMeshError() {
  return RuntimeError(
      "In order to get the mesh Tensor of a DeviceMesh it needs to either have all its "
      "original dimensions (e.g., no slicing) or it needs to contain the local rank");
}

absl::StatusOr<MeshLayout> MeshLayout::Create(
    const std::string& device_type, int world_size, const std::vector<int>& shape,
    const std::optional<std::vector<std::string>>& dim_names) {
  if (dim_names) {
    std::set<std::string> unique(dim_names->begin(), dim_names->end());
    if (unique.size() != dim_names->size()) {
      return RuntimeError(
          absl::StrCat("Each mesh_dim_name must be unique. Found repeated mesh_dim_name "
                       "in mesh_dim_names ",
                       PyTuple(*dim_names)));
    }
    if (shape.size() != dim_names->size()) {
      return RuntimeError(
          absl::StrCat("mesh_shape and mesh_dim_names should have same length! Found "
                       "len(mesh_dim_names): ",
                       dim_names->size(), " and len(mesh_shape):", shape.size(), "."));
    }
  }
  if (!device_type.empty() &&
      !std::all_of(device_type.begin(), device_type.end(),
                   [](unsigned char c) { return std::isalpha(c) != 0; })) {
    return RuntimeError(absl::StrCat(
        "Device type with index is not supported but got ", device_type,
        ". If you maintained a 'torch.device' object, it's recommended to pass in "
        "'device.type'."));
  }
  if (shape.empty()) return ValueError("mesh_shape must not be empty");
  if (std::any_of(shape.begin(), shape.end(), [](int size) { return size < 1; })) {
    return ValueError(absl::StrCat(
        "mesh_shape must contain only positive sizes, but got ", PyIntTuple(shape)));
  }
  if (world_size < 1) {
    return ValueError(absl::StrCat("world size must be positive, but got ", world_size));
  }
  const int64_t numel = Product(shape);
  if (numel > world_size) {
    return RuntimeError(absl::StrCat("Mesh should not be bigger than default world size ",
                                     world_size, ", but found ", numel, " ranks!"));
  }
  MeshLayout layout;
  layout.world_size_ = world_size;
  layout.root_shape_ = shape;
  layout.shape_ = shape;
  layout.root_dim_names_ = dim_names;
  layout.dim_names_ = dim_names;
  layout.is_root_ = true;
  layout.ranks_.resize(numel);
  for (int rank = 0; rank < numel; ++rank) layout.ranks_[rank] = rank;
  for (int dim = 0; dim < static_cast<int>(shape.size()); ++dim)
    layout.root_dims_.push_back({dim});
  return layout;
}

absl::StatusOr<int> MeshLayout::Size(int dim) const {
  const int n = ndim();
  if (dim < -n || dim >= n) {
    return IndexError(absl::StrCat("Dimension out of range (expected to be in range of [",
                                   -n, ", ", n - 1, "], but got ", dim, ")"));
  }
  return shape_[dim < 0 ? dim + n : dim];
}

std::vector<std::vector<int>> MeshLayout::DimGroups(int dim) const {
  std::vector<int> perm(shape_.size());
  for (size_t i = 0; i < perm.size(); ++i) perm[i] = static_cast<int>(i);
  std::swap(perm[dim], perm.back());
  return Rows(Permute(ranks_, shape_, perm), shape_[dim]);
}

std::optional<std::vector<int>> MeshLayout::GroupOf(int rank, int dim) const {
  for (auto& group : DimGroups(dim))
    if (std::find(group.begin(), group.end(), rank) != group.end()) return group;
  return std::nullopt;
}

std::optional<std::vector<int>> MeshLayout::Coordinate(int rank) const {
  auto it = std::find(ranks_.begin(), ranks_.end(), rank);
  if (it == ranks_.end()) return std::nullopt;
  return Unravel(it - ranks_.begin(), shape_);
}

absl::StatusOr<int> MeshLayout::DimIndex(const std::string& name) const {
  if (!dim_names_ || dim_names_->empty()) return KeyError("No `mesh_dim_names` found.");
  auto it = std::find(dim_names_->begin(), dim_names_->end(), name);
  if (it == dim_names_->end()) {
    return KeyError(absl::StrCat("Mesh dimension ", PyRepr(name),
                                 " does not exist. Available mesh dimensions are: "
                                 "mesh_dim_names=",
                                 PyTuple(*dim_names_)));
  }
  return static_cast<int>(it - dim_names_->begin());
}

absl::StatusOr<DimRef> MeshLayout::ResolveGroupDim(
    const std::optional<MeshDim>& mesh_dim,
    const std::vector<FlattenedDim>& flattened) const {
  if (ndim() > 1 && !mesh_dim) {
    return RuntimeError(absl::StrCat(
        "Found the DeviceMesh have ", ndim(),
        " dimensions Optional kwarg `mesh_dim` needs to be specified when "
        "device_mesh.ndim > 1. If you want to get the list of all the ProcessGroups in "
        "the DeviceMesh,please use `get_all_groups()` instead."));
  }
  int dim = 0;
  if (mesh_dim && mesh_dim->is_name()) {
    if (FindFlattened(flattened, mesh_dim->name())) return DimRef{-1, mesh_dim->name()};
    auto index = DimIndex(mesh_dim->name());
    if (!index.ok()) return index.status();
    dim = *index;
  } else if (mesh_dim) {
    dim = mesh_dim->index();
    if (dim < -ndim() || dim >= ndim()) return IndexError("list index out of range");
    if (dim < 0) dim += ndim();
  }
  // A dimension that came from a flatten keeps the flattened group.
  if (dim_names_ && FindFlattened(flattened, (*dim_names_)[dim]))
    return DimRef{-1, (*dim_names_)[dim]};
  if (root_dims_[dim].size() != 1) {
    return absl::InternalError(absl::StrCat("dimension ", dim, " of ", ToString(),
                                            " is flattened but not registered"));
  }
  return DimRef{root_dims_[dim][0], ""};
}

absl::StatusOr<DimRef> MeshLayout::ResolveLocalRankDim(
    const std::optional<MeshDim>& mesh_dim,
    const std::vector<FlattenedDim>& flattened) const {
  if (ndim() > 1 && !mesh_dim) {
    return RuntimeError(
        absl::StrCat("Found the DeviceMesh have ", ndim(),
                     " dimensions Optional kwarg `mesh_dim` needs to be specified when "
                     "device_mesh.ndim > 1."));
  }
  return ResolveGroupDim(mesh_dim ? *mesh_dim : MeshDim(0), flattened);
}

std::optional<int> MeshLayout::LocalRank(
    int rank, const DimRef& ref, const std::vector<FlattenedDim>& flattened) const {
  if (!InRoot(rank)) return std::nullopt;
  if (ref.flattened.empty()) return RootCoordinate(rank)[ref.root_dim];
  const FlattenedDim* dim = FindFlattened(flattened, ref.flattened);
  if (!dim) return std::nullopt;
  std::vector<int> row = RootRow(rank, dim->root_dims);
  return static_cast<int>(std::find(row.begin(), row.end(), rank) - row.begin());
}

absl::StatusOr<MeshLayout> MeshLayout::Slice(
    const std::vector<std::string>& names, int rank,
    const std::vector<FlattenedDim>& flattened) const {
  if (!dim_names_)
    return RuntimeError("Cannot slice a DeviceMesh without mesh_dim_names!");
  if (names == *dim_names_) return *this;
  if (names.empty()) return ValueError("mesh_dim_names to slice must not be empty");
  // Only the root mesh knows its flattened dimensions.
  const std::vector<FlattenedDim> none;
  const std::vector<FlattenedDim>& registry = is_root_ ? flattened : none;

  std::vector<std::string> valid = *dim_names_;
  for (const auto& dim : registry) valid.push_back(dim.name);
  for (const auto& name : names) {
    if (!Contains(valid, name)) {
      return KeyError(absl::StrCat("Invalid mesh_dim_names ", PyTuple(names),
                                   " specified. Valid mesh_dim_names are ", PyList(valid),
                                   "."));
    }
  }

  // Dimensions must be in ascending order; a flattened one counts as its last.
  std::vector<std::vector<int>> slice_dims;
  std::vector<std::vector<int>> picked_root_dims;
  int current = -1;
  for (const auto& name : names) {
    int next;
    if (const FlattenedDim* dim = FindFlattened(registry, name)) {
      slice_dims.push_back(dim->root_dims);
      picked_root_dims.push_back(dim->root_dims);
      next = dim->root_dims.back();
    } else {
      next = static_cast<int>(std::find(dim_names_->begin(), dim_names_->end(), name) -
                              dim_names_->begin());
      slice_dims.push_back({next});
      picked_root_dims.push_back(root_dims_[next]);
    }
    if (next <= current) {
      std::vector<std::string> tuples;
      for (const auto& dims : slice_dims) tuples.push_back(PyIntTuple(dims));
      return KeyError(absl::StrCat("Invalid mesh_dim_names ", PyTuple(names),
                                   " specified. Found mesh dim indices to slice: [",
                                   absl::StrJoin(tuples, ", "),
                                   "]. Mesh dim indices should be in ascending order."));
    }
    current = next;
  }

  // A flattened dimension must be contiguous in the root and not overlap the
  // others, or PyTorch refuses (or silently builds the wrong sub-mesh).
  std::set<int> seen;
  std::vector<int> all_root_dims;
  for (const auto& dims : picked_root_dims) {
    for (size_t i = 0; i < dims.size(); ++i) {
      if (!seen.insert(dims[i]).second || (i > 0 && dims[i] != dims[i - 1] + 1)) {
        return NotImplementedError(
            "Currently, this only allows slicing out a contiguous flattened dim.");
      }
      all_root_dims.push_back(dims[i]);
    }
  }

  if (!InRoot(rank) || std::find(ranks_.begin(), ranks_.end(), rank) == ranks_.end()) {
    return NotInMeshError();
  }
  MeshLayout sub = *this;
  sub.is_root_ = false;
  sub.dim_names_ = names;
  sub.root_dims_ = picked_root_dims;
  sub.shape_.clear();
  for (const auto& dims : picked_root_dims) {
    int size = 1;
    for (int dim : dims) size *= root_shape_[dim];
    sub.shape_.push_back(size);
  }
  sub.ranks_ = RootRow(rank, all_root_dims);
  return sub;
}

absl::StatusOr<FlattenPlan> MeshLayout::Flatten(
    const std::optional<std::string>& name, int rank,
    const std::vector<FlattenedDim>& flattened) const {
  if (!dim_names_)
    return RuntimeError("Cannot flatten a DeviceMesh without mesh_dim_names!");
  FlattenPlan plan;
  plan.dim.name = name && !name->empty() ? *name : absl::StrJoin(*dim_names_, "_");
  for (const auto& dims : root_dims_)
    plan.dim.root_dims.insert(plan.dim.root_dims.end(), dims.begin(), dims.end());

  if (ndim() == 1 && Contains(*dim_names_, plan.dim.name)) {
    plan.kind = FlattenPlan::Kind::kSelf;
    plan.layout = *this;
    return plan;
  }
  if (Contains(*root_dim_names_, plan.dim.name)) {
    return ValueError(absl::StrCat(
        plan.dim.name, " already exists for submesh of the ", RootToString(),
        ". The mesh_dim_names of submesh and flattened mesh are ",
        PyTuple(*root_dim_names_), ". Please specify another valid mesh_dim_name."));
  }
  if (const FlattenedDim* existing = FindFlattened(flattened, plan.dim.name)) {
    if (existing->root_dims != plan.dim.root_dims) {
      return ValueError(absl::StrCat("Flatten mesh with mesh_dim_name ", plan.dim.name,
                                     " has been created before, Please specify another "
                                     "valid mesh_dim_name."));
    }
    plan.kind = FlattenPlan::Kind::kExisting;
  } else {
    plan.kind = FlattenPlan::Kind::kNew;
    std::vector<int> perm;
    for (int dim = 0; dim < static_cast<int>(root_shape_.size()); ++dim) {
      if (!std::count(plan.dim.root_dims.begin(), plan.dim.root_dims.end(), dim))
        perm.push_back(dim);
    }
    perm.insert(perm.end(), plan.dim.root_dims.begin(), plan.dim.root_dims.end());
    int row_size = 1;
    for (int dim : plan.dim.root_dims) row_size *= root_shape_[dim];
    std::vector<int> root_ranks(Product(root_shape_));
    for (size_t r = 0; r < root_ranks.size(); ++r) root_ranks[r] = static_cast<int>(r);
    plan.groups = Rows(Permute(root_ranks, root_shape_, perm), row_size);
    plan.whole_world = row_size == world_size_;
  }
  if (InRoot(rank)) {
    MeshLayout flat = *this;
    flat.is_root_ = false;
    flat.dim_names_ = std::vector<std::string>{plan.dim.name};
    flat.root_dims_ = {plan.dim.root_dims};
    flat.ranks_ = RootRow(rank, plan.dim.root_dims);
    flat.shape_ = {static_cast<int>(flat.ranks_.size())};
    plan.layout = std::move(flat);
  }
  return plan;
}

std::string MeshLayout::ToString() const { return Repr(ranks_, shape_, dim_names_); }

std::string MeshLayout::RootToString() const {
  std::vector<int> root_ranks(Product(root_shape_));
  for (size_t r = 0; r < root_ranks.size(); ++r) root_ranks[r] = static_cast<int>(r);
  return Repr(root_ranks, root_shape_, root_dim_names_);
}

bool MeshLayout::InRoot(int rank) const {
  return rank >= 0 && rank < Product(root_shape_);
}

std::vector<int> MeshLayout::RootCoordinate(int rank) const {
  return Unravel(rank, root_shape_);
}

std::vector<int> MeshLayout::RootRow(int rank, const std::vector<int>& dims) const {
  std::vector<int> coordinate = RootCoordinate(rank);
  std::vector<int> sizes;
  for (int dim : dims) sizes.push_back(root_shape_[dim]);
  std::vector<int> row(Product(sizes));
  for (size_t i = 0; i < row.size(); ++i) {
    std::vector<int> at = Unravel(static_cast<int64_t>(i), sizes);
    for (size_t k = 0; k < dims.size(); ++k) coordinate[dims[k]] = at[k];
    row[i] = static_cast<int>(Ravel(coordinate, root_shape_));
  }
  return row;
}

}  // namespace meshrun::worker
