#include "worker_lib/parallel/fsdp.h"

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/StorageImpl.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"
#include "worker_lib/collectives.h"

namespace meshrun::worker::parallel {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::Variable;
using torch::autograd::variable_list;

// A fresh tensor over `storage` (its own TensorImpl and version counter, so
// refilling the storage is not seen by autograd as an in-place change of a
// saved tensor).
at::Tensor AliasOf(const at::Tensor& base, at::IntArrayRef sizes) {
  at::Tensor alias = at::empty({0}, base.options());
  alias.set_(base.storage(), /*storage_offset=*/0, sizes);
  return alias;
}

template <typename T>
int64_t PointerArg(T* pointer) {
  return static_cast<int64_t>(reinterpret_cast<intptr_t>(pointer));
}
template <typename T>
T* PointerOf(AutogradContext* ctx) {
  return reinterpret_cast<T*>(static_cast<intptr_t>(ctx->saved_data["state"].toInt()));
}

// shard -> the gathered local tensor; backward: reduce-scatter (AVG).
struct UnshardFunction : public torch::autograd::Function<UnshardFunction> {
  static Variable forward(AutogradContext* ctx, const Variable& /*shard*/,
                          int64_t state) {
    ctx->saved_data["state"] = state;
    return PointerOf<FsdpParam>(ctx)->UnshardedAlias();
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    FsdpParam* state = PointerOf<FsdpParam>(ctx);
    at::Tensor grad = state->ReduceScatterGrad(grads[0]);
    state->BackwardDone();
    return {grad, Variable()};
  }
};

// Identity on a layer's output whose backward gathers the layer's params
// again before the layer's own backward nodes run.
struct PreBackwardFunction : public torch::autograd::Function<PreBackwardFunction> {
  static Variable forward(AutogradContext* ctx, const Variable& output, int64_t layer) {
    ctx->saved_data["state"] = layer;
    return output;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    PointerOf<FsdpLayer>(ctx)->UnshardAll();
    return {grads[0], Variable()};
  }
};

}  // namespace

FsdpParam::FsdpParam(Param& param, ProcessGroupPtr group, int64_t rows,
                     FsdpOptions options)
    : param_(param), group_(std::move(group)), options_(options), rows_(rows) {
  const int64_t parts = group_->getSize();
  padded_rows_ = ChunkOf(rows_, parts, 0).padded_size;
  std::vector<int64_t> shape = param_.data().sizes().vec();
  shape[0] = parts * padded_rows_;
  buffer_ = at::empty(shape, param_.data().options().requires_grad(false));
  buffer_nbytes_ = buffer_.nbytes();
  Reshard();
}

bool FsdpParam::unsharded() const { return buffer_.storage().nbytes() != 0; }

size_t FsdpParam::unsharded_bytes() const { return buffer_.storage().nbytes(); }

void FsdpParam::Reshard() {
  c10::StorageImpl* storage = buffer_.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(at::DataPtr(nullptr, buffer_.device()));
  storage->set_nbytes(0);
}

void FsdpParam::Unshard() {
  if (unsharded()) return;
  at::NoGradGuard no_grad;
  c10::StorageImpl* storage = buffer_.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(storage->allocator()->allocate(buffer_nbytes_));
  storage->set_nbytes(buffer_nbytes_);
  at::Tensor shard = param_.data().detach();
  const int64_t parts = group_->getSize();
  if (parts == 1) {
    buffer_.copy_(shard);
    return;
  }
  std::vector<at::Tensor> pieces;
  pieces.reserve(parts);
  for (int64_t j = 0; j < parts; ++j)
    pieces.push_back(buffer_.narrow(0, j * padded_rows_, padded_rows_));
  std::vector<std::vector<at::Tensor>> outputs{std::move(pieces)};
  std::vector<at::Tensor> inputs{shard.contiguous()};
  group_->allgather(outputs, inputs)->wait();
}

at::Tensor FsdpParam::UnshardedAlias() const {
  std::vector<int64_t> sizes = buffer_.sizes().vec();
  sizes[0] = rows_;
  return AliasOf(buffer_, sizes);
}

at::Tensor FsdpParam::Compute(Param& param) {
  TORCH_CHECK(&param == &param_, "FsdpParam of ", param_.name(), " used for ",
              param.name());
  Unshard();
  if (!at::GradMode::is_enabled() || !param_.data().requires_grad()) {
    return UnshardedAlias();
  }
  ++pending_backwards_;
  return UnshardFunction::apply(param_.data(), PointerArg(this));
}

at::Tensor FsdpParam::ReduceScatterGrad(const at::Tensor& full_grad) {
  at::NoGradGuard no_grad;
  std::vector<int64_t> shape = buffer_.sizes().vec();
  at::Tensor padded = at::zeros(shape, buffer_.options());
  if (full_grad.defined()) padded.narrow(0, 0, rows_).copy_(full_grad);
  shape[0] = padded_rows_;
  at::Tensor shard_grad = at::empty(shape, buffer_.options());
  absl::Status status =
      ReduceScatterTensor(*group_, shard_grad, padded, c10d::ReduceOp::AVG);
  TORCH_CHECK(status.ok(), "FSDP ", param_.name(), ": ", std::string(status.message()));
  return shard_grad;
}

void FsdpParam::BackwardDone() {
  if (pending_backwards_ > 0) --pending_backwards_;
  if (pending_backwards_ == 0) Reshard();
}

absl::Status FullyShard(Param& param, const std::string& mesh_dim, ProcessGroupPtr group,
                        FsdpOptions options) {
  if (group == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("FSDP ", param.name(), ": no process group for '", mesh_dim, "'"));
  }
  if (param.has_materializer()) {
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
  param.set_materializer(std::make_shared<FsdpParam>(param, group, rows, options));
  return absl::OkStatus();
}

FsdpParam* FsdpStateOf(const Param& param) {
  return dynamic_cast<FsdpParam*>(param.materializer().get());
}

FsdpLayer::FsdpLayer(LayerPtr inner, std::vector<FsdpParam*> states, FsdpOptions options)
    : inner_(std::move(inner)), states_(std::move(states)), options_(options) {}

void FsdpLayer::UnshardAll() {
  for (FsdpParam* state : states_) state->Unshard();
}

void FsdpLayer::ReshardAll() {
  for (FsdpParam* state : states_) state->Reshard();
}

size_t FsdpLayer::unsharded_bytes() const {
  size_t total = 0;
  for (FsdpParam* state : states_) total += state->unsharded_bytes();
  return total;
}

at::Tensor FsdpLayer::Forward(const at::Tensor& input) {
  UnshardAll();
  at::Tensor output = inner_->Forward(input);
  if (!at::GradMode::is_enabled()) {
    ReshardAll();
    return output;
  }
  if (options_.reshard_after_forward) ReshardAll();
  // Even without resharding after forward: an earlier backward (another
  // microbatch) may have resharded.
  if (output.requires_grad())
    output = PreBackwardFunction::apply(output, PointerArg(this));
  return output;
}

absl::StatusOr<LayerPtr> FullyShardLayer(LayerPtr layer, const std::string& mesh_dim,
                                         ProcessGroupPtr group, FsdpOptions options) {
  if (dynamic_cast<FsdpLayer*>(layer.get()) != nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("FSDP: ", layer->Describe(), " is already fully sharded"));
  }
  std::vector<FsdpParam*> states;
  for (const auto& param : layer->Params()) {
    absl::Status status = FullyShard(*param, mesh_dim, group, options);
    if (!status.ok()) return status;
    states.push_back(FsdpStateOf(*param));
  }
  return LayerPtr(
      std::make_shared<FsdpLayer>(std::move(layer), std::move(states), options));
}

absl::Status FullyShard(Sequential& model, const std::string& mesh_dim,
                        ProcessGroupPtr group, FsdpOptions options) {
  for (LayerPtr& layer : model.layers) {
    if (layer->Params().empty()) continue;
    absl::StatusOr<LayerPtr> sharded = FullyShardLayer(layer, mesh_dim, group, options);
    if (!sharded.ok()) return sharded.status();
    layer = *std::move(sharded);
  }
  return absl::OkStatus();
}

size_t UnshardedBytes(const Sequential& model) {
  size_t total = 0;
  for (const auto& param : model.Params()) {
    if (FsdpParam* state = FsdpStateOf(*param)) total += state->unsharded_bytes();
  }
  return total;
}

}  // namespace meshrun::worker::parallel
