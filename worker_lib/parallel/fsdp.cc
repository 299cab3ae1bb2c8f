#include "worker_lib/parallel/fsdp.h"

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/StorageImpl.h>

#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"
#include "worker_lib/mesh/collectives.h"

namespace meshrun::worker::parallel {

namespace {

// A fresh tensor over `storage` (its own TensorImpl and version counter, so
// refilling the storage is not seen by autograd as an in-place change of a
// saved tensor).
at::Tensor AliasOf(const at::Tensor& base, int64_t offset, at::IntArrayRef sizes) {
  at::Tensor alias = at::empty({0}, base.options());
  alias.set_(base.storage(), base.storage_offset() + offset, sizes);
  return alias;
}

void FreeStorage(const at::Tensor& tensor) {
  c10::StorageImpl* storage = tensor.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(at::DataPtr(nullptr, tensor.device()));
  storage->set_nbytes(0);
}

// `full` ([rows, ...], dim 0 unpadded) into `flat` ([parts, segment]) at
// column `offset`: chunk r of its rows (padded_rows each) into row r. The
// padding is left as it is (the caller zeroes it).
void CopyChunksIn(const at::Tensor& flat, int64_t offset, int64_t padded_rows,
                  const at::Tensor& full) {
  const int64_t rows = full.size(0);
  const int64_t row_numel = rows == 0 ? 0 : full.numel() / rows;
  const int64_t chunk_numel = padded_rows * row_numel;
  at::Tensor source = full.contiguous().view({rows, row_numel});
  at::Tensor target = flat.narrow(1, offset, chunk_numel);
  const int64_t whole = padded_rows == 0 ? 0 : rows / padded_rows;
  if (whole > 0) {
    target.narrow(0, 0, whole)
        .copy_(source.narrow(0, 0, whole * padded_rows).view({whole, chunk_numel}));
  }
  const int64_t rest = rows - whole * padded_rows;
  if (rest > 0) {
    target.select(0, whole)
        .narrow(0, 0, rest * row_numel)
        .copy_(source.narrow(0, whole * padded_rows, rest).reshape({-1}));
  }
}

}  // namespace

FsdpParam::FsdpParam(Param& param, int64_t rows) : param_(param), rows_(rows) {}

void FsdpParam::JoinGroup(std::shared_ptr<FsdpParamGroup> group, size_t index,
                          int64_t parts, int64_t padded_rows) {
  group_ = std::move(group);
  index_ = index;
  std::vector<int64_t> shape = param_.data().sizes().vec();
  shape[0] = parts * padded_rows;
  buffer_ = at::empty(shape, param_.data().options().requires_grad(false));
  buffer_nbytes_ = buffer_.nbytes();
  FreeUnsharded();
}

bool FsdpParam::unsharded() const { return buffer_.storage().nbytes() != 0; }

size_t FsdpParam::unsharded_bytes() const { return buffer_.storage().nbytes(); }

void FsdpParam::FreeUnsharded() { FreeStorage(buffer_); }

void FsdpParam::AllocateUnsharded() {
  if (unsharded()) return;
  // The storage's allocator (CUDA's caching allocator) allocates on the
  // current device, not the tensor's: a rank on Device(kCUDA, LOCAL_RANK)
  // that never made it current would get its gathered parameters on GPU 0,
  // behind a tensor that says cuda:LOCAL_RANK. (at::empty and the other
  // factories guard their device themselves.)
  const c10::DeviceGuard device(buffer_.device());
  c10::StorageImpl* storage = buffer_.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(storage->allocator()->allocate(buffer_nbytes_));
  storage->set_nbytes(buffer_nbytes_);
}

at::Tensor FsdpParam::UnshardedAlias() const {
  std::vector<int64_t> sizes = buffer_.sizes().vec();
  sizes[0] = rows_;
  return AliasOf(buffer_, 0, sizes);
}

FsdpParamGroup::FsdpParamGroup(std::vector<FsdpParam*> params, ProcessGroupPtr group)
    : params_(std::move(params)), group_(std::move(group)) {
  std::vector<FlatShardMember> members;
  for (FsdpParam* param : params_) {
    const at::Tensor& shard = param->param().data();
    members.push_back(FlatShardMember{
        param->rows(), shard.size(0) == 0 ? 0 : shard.numel() / shard.size(0)});
  }
  layout_ = MakeFlatShardLayout(members, group_->getSize());
}

size_t FsdpParamGroup::unsharded_bytes() const {
  size_t total = 0;
  for (FsdpParam* param : params_) total += param->unsharded_bytes();
  if (gather_output_.defined()) total += gather_output_.nbytes();
  return total;
}

void FsdpParamGroup::StartUnshard() {
  if (unsharded_ || gather_output_.defined()) return;
  at::NoGradGuard no_grad;
  const at::TensorOptions options =
      params_.front()->param().data().options().requires_grad(false);
  gather_input_ = at::empty({layout_.segment_numel}, options);
  for (size_t i = 0; i < params_.size(); ++i) {
    gather_input_.narrow(0, layout_.offsets[i], layout_.numels[i])
        .copy_(params_[i]->param().data().reshape({-1}));
  }
  if (layout_.parts == 1) {
    gather_output_ = gather_input_;
    return;
  }
  gather_output_ = at::empty({layout_.total_numel()}, options);
  gather_work_ = AllGatherSingle(*group_, gather_output_, gather_input_);
}

void FsdpParamGroup::Unshard() {
  if (unsharded_) return;
  StartUnshard();
  at::NoGradGuard no_grad;
  if (gather_work_) gather_work_->wait();
  at::Tensor gathered = gather_output_.view({layout_.parts, layout_.segment_numel});
  for (size_t i = 0; i < params_.size(); ++i) {
    params_[i]->AllocateUnsharded();
    params_[i]
        ->unsharded_buffer()
        .view({layout_.parts, layout_.numels[i]})
        .copy_(gathered.narrow(1, layout_.offsets[i], layout_.numels[i]));
  }
  gather_work_.reset();
  gather_input_ = at::Tensor();
  gather_output_ = at::Tensor();
  unsharded_ = true;
}

void FsdpParamGroup::Reshard() {
  if (gather_work_) gather_work_->wait();
  gather_work_.reset();
  gather_input_ = at::Tensor();
  gather_output_ = at::Tensor();
  for (FsdpParam* param : params_) param->FreeUnsharded();
  unsharded_ = false;
}

bool FsdpParamGroup::ReduceScatter(const std::vector<at::Tensor>& full_grads) {
  FinishReduceScatter();
  bool any = false;
  for (const at::Tensor& grad : full_grads) any = any || grad.defined();
  if (!any) return false;
  at::NoGradGuard no_grad;
  bool zeros = false;
  for (size_t i = 0; i < params_.size(); ++i) {
    zeros = zeros || !full_grads[i].defined() || layout_.padded(i, params_[i]->rows());
  }
  const at::TensorOptions options =
      params_.front()->param().data().options().requires_grad(false);
  scatter_input_ = zeros ? at::zeros({layout_.total_numel()}, options)
                         : at::empty({layout_.total_numel()}, options);
  at::Tensor flat = scatter_input_.view({layout_.parts, layout_.segment_numel});
  scatter_members_.assign(params_.size(), false);
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!full_grads[i].defined()) continue;
    CopyChunksIn(flat, layout_.offsets[i], layout_.padded_rows[i], full_grads[i]);
    scatter_members_[i] = true;
  }
  if (layout_.parts == 1) {
    scatter_output_ = scatter_input_;
  } else {
    scatter_output_ = at::empty({layout_.segment_numel}, options);
    c10d::ReduceScatterOptions sum;
    sum.reduceOp = c10d::ReduceOp::SUM;
    scatter_work_ = ReduceScatterSingle(*group_, scatter_output_, scatter_input_, sum);
  }
  scatter_pending_ = true;
  return true;
}

void FsdpParamGroup::Abandon() {
  if (scatter_work_) scatter_work_->wait();
  scatter_work_.reset();
  scatter_input_ = at::Tensor();
  scatter_output_ = at::Tensor();
  scatter_pending_ = false;
  Reshard();
}

void FsdpParamGroup::FinishReduceScatter() {
  if (!scatter_pending_) return;
  at::NoGradGuard no_grad;
  if (scatter_work_) scatter_work_->wait();
  // Gloo has no AVG: sum, then divide, as FSDP2 does there.
  if (layout_.parts > 1) scatter_output_.div_(layout_.parts);
  for (size_t i = 0; i < params_.size(); ++i) {
    if (!scatter_members_[i]) continue;
    const at::Tensor& data = params_[i]->param().data();
    at::Tensor shard_grad = AliasOf(scatter_output_, layout_.offsets[i], data.sizes());
    at::Tensor& grad = data.mutable_grad();
    if (grad.defined()) {
      grad.add_(shard_grad);
    } else {
      grad = shard_grad;
    }
  }
  scatter_work_.reset();
  scatter_input_ = at::Tensor();
  scatter_pending_ = false;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (scatter_members_[i]) params_[i]->RunShardGradHook();
  }
  scatter_output_ = at::Tensor();
}

namespace {

absl::Status ShardParam(Param& param, const std::string& mesh_dim,
                        const ProcessGroupPtr& group) {
  if (group == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("FSDP ", param.name(), ": no process group for '", mesh_dim, "'"));
  }
  if (param.shard_state() != nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "FSDP ", param.name(), ": already sharded (", DescribeSteps(param.steps()), ")"));
  }
  const at::Tensor& local = param.data();
  if (local.dim() == 0 || local.size(0) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("FSDP ", param.name(), ": shards dim 0, and the local tensor is [",
                     c10::str(local.sizes()), "]"));
  }
  const int64_t parts = group->getSize();
  const int64_t index = group->getRank();
  const int64_t rows = local.size(0);
  const ChunkExtent chunk = ChunkOf(rows, parts, index);
  std::vector<int64_t> shape = local.sizes().vec();
  shape[0] = chunk.padded_size;
  at::Tensor shard = at::zeros(shape, local.options().requires_grad(false));
  {
    at::NoGradGuard no_grad;
    shard.narrow(0, 0, chunk.size).copy_(local.narrow(0, chunk.offset, chunk.size));
  }
  shard.set_requires_grad(true);
  param.AddStep(ShardStep{mesh_dim, 0, parts, index}, group, shard);
  param.set_shard_state(std::make_shared<FsdpParam>(param, rows));
  return absl::OkStatus();
}

// One group per dtype of `params` (already sharded), in order of appearance.
std::vector<std::shared_ptr<FsdpParamGroup>> MakeGroups(
    const std::vector<std::shared_ptr<Param>>& params, const ProcessGroupPtr& group) {
  std::vector<int> dtypes;
  for (const auto& param : params)
    dtypes.push_back(static_cast<int>(param->data().scalar_type()));
  std::vector<std::shared_ptr<FsdpParamGroup>> groups;
  for (const std::vector<size_t>& members : GroupByKey(dtypes)) {
    std::vector<FsdpParam*> states;
    for (size_t k : members) states.push_back(FsdpStateOf(*params[k]));
    auto param_group = std::make_shared<FsdpParamGroup>(states, group);
    for (size_t i = 0; i < states.size(); ++i) {
      states[i]->JoinGroup(param_group, i, param_group->layout().parts,
                           param_group->layout().padded_rows[i]);
    }
    groups.push_back(std::move(param_group));
  }
  return groups;
}

}  // namespace

absl::StatusOr<std::vector<std::shared_ptr<FsdpParamGroup>>> ShardIntoGroups(
    const std::vector<std::shared_ptr<Param>>& params, const std::string& mesh_dim,
    const ProcessGroupPtr& group) {
  for (const auto& param : params) {
    if (absl::Status status = ShardParam(*param, mesh_dim, group); !status.ok())
      return status;
  }
  return MakeGroups(params, group);
}

FsdpParam* FsdpStateOf(const Param& param) {
  return dynamic_cast<FsdpParam*>(param.shard_state().get());
}

}  // namespace meshrun::worker::parallel
