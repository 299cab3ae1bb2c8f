#include "worker_lib/parallel/tp.h"

#include <torch/csrc/autograd/custom_function.h>

#include <vector>

#include "absl/strings/str_cat.h"

namespace meshrun::worker::parallel {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The group rides in the autograd context as a capsule (ProcessGroup is a
// CustomClassHolder); the context keeps it alive until backward has run.
constexpr char kGroup[] = "tp_group";

void SaveGroup(AutogradContext* ctx, const ProcessGroupPtr& tp) {
  ctx->saved_data[kGroup] = c10::IValue::make_capsule(tp);
}

ProcessGroupPtr SavedGroup(AutogradContext* ctx) {
  return c10::static_intrusive_pointer_cast<c10d::ProcessGroup>(
      ctx->saved_data[kGroup].toCapsule());
}

// Sum over the group, into a fresh tensor (the input is left alone).
at::Tensor AllReduceSum(c10d::ProcessGroup& group, const at::Tensor& x) {
  std::vector<at::Tensor> tensors{x.contiguous().clone()};
  group.allreduce(tensors)->wait();
  return tensors[0];
}

at::Tensor LastDimSlice(const at::Tensor& x, int parts, int index) {
  const int64_t size = x.size(-1);
  TORCH_CHECK(size % parts == 0, "a last dim of ", size, " does not split over ", parts,
              " tensor-parallel ranks");
  const int64_t chunk = size / parts;
  return x.narrow(-1, index * chunk, chunk).contiguous();
}

struct CopyToRegion : torch::autograd::Function<CopyToRegion> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x,
                            const ProcessGroupPtr& tp) {
    SaveGroup(ctx, tp);
    return x;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {AllReduceSum(*SavedGroup(ctx), grads[0]), at::Tensor()};
  }
};

struct ReduceFromRegion : torch::autograd::Function<ReduceFromRegion> {
  static at::Tensor forward(AutogradContext*, const at::Tensor& x,
                            const ProcessGroupPtr& tp) {
    return AllReduceSum(*tp, x);
  }
  static variable_list backward(AutogradContext*, variable_list grads) {
    return {grads[0], at::Tensor()};
  }
};

struct GatherFromRegion : torch::autograd::Function<GatherFromRegion> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x,
                            const ProcessGroupPtr& tp) {
    SaveGroup(ctx, tp);
    return AllGatherAlong(*tp, x, static_cast<int>(x.dim()) - 1);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    ProcessGroupPtr tp = SavedGroup(ctx);
    return {LastDimSlice(grads[0], tp->getSize(), tp->getRank()), at::Tensor()};
  }
};

struct ScatterToRegion : torch::autograd::Function<ScatterToRegion> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x,
                            const ProcessGroupPtr& tp) {
    SaveGroup(ctx, tp);
    return LastDimSlice(x, tp->getSize(), tp->getRank());
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    at::Tensor grad = grads[0];
    return {AllGatherAlong(*SavedGroup(ctx), grad, static_cast<int>(grad.dim()) - 1),
            at::Tensor()};
  }
};

bool Trivial(const ProcessGroupPtr& tp) { return !tp || tp->getSize() == 1; }

absl::Status CheckWhole(const Linear& linear) {
  for (const auto& param : linear.Params()) {
    if (!param->steps().empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          param->Describe(), ": tensor parallelism converts a whole Linear"));
    }
  }
  return absl::OkStatus();
}

// A fresh, whole copy of `param` (the source layer keeps its own).
std::shared_ptr<Param> CopyParam(const std::shared_ptr<Param>& param) {
  if (!param) return nullptr;
  return Param::FromFull(param->name(), param->data());
}

std::vector<std::shared_ptr<Param>> WeightAndBias(const std::shared_ptr<Param>& weight,
                                                  const std::shared_ptr<Param>& bias) {
  if (bias) return {weight, bias};
  return {weight};
}

}  // namespace

int TpSize(const ProcessGroupPtr& tp) { return tp ? tp->getSize() : 1; }
int TpRank(const ProcessGroupPtr& tp) { return tp ? tp->getRank() : 0; }

at::Tensor CopyToTpRegion(const at::Tensor& x, const ProcessGroupPtr& tp) {
  return Trivial(tp) ? x : CopyToRegion::apply(x, tp);
}

at::Tensor ReduceFromTpRegion(const at::Tensor& x, const ProcessGroupPtr& tp) {
  return Trivial(tp) ? x : ReduceFromRegion::apply(x, tp);
}

at::Tensor GatherFromTpRegion(const at::Tensor& x, const ProcessGroupPtr& tp) {
  return Trivial(tp) ? x : GatherFromRegion::apply(x, tp);
}

at::Tensor ScatterToTpRegion(const at::Tensor& x, const ProcessGroupPtr& tp) {
  return Trivial(tp) ? x : ScatterToRegion::apply(x, tp);
}

ColumnParallelLinear::ColumnParallelLinear(std::string name,
                                           std::shared_ptr<Param> weight,
                                           std::shared_ptr<Param> bias,
                                           ProcessGroupPtr tp,
                                           ColumnParallelOptions options)
    : name_(std::move(name)),
      weight_(std::move(weight)),
      bias_(std::move(bias)),
      tp_(std::move(tp)),
      options_(options) {}

at::Tensor ColumnParallelLinear::Forward(const at::Tensor& input) {
  at::Tensor x = options_.copy_input ? CopyToTpRegion(input, tp_) : input;
  at::Tensor y =
      at::linear(x, weight_->Compute(), bias_ ? bias_->Compute() : at::Tensor());
  return options_.gather_output ? GatherFromTpRegion(y, tp_) : y;
}

std::vector<std::shared_ptr<Param>> ColumnParallelLinear::Params() const {
  return WeightAndBias(weight_, bias_);
}

std::string ColumnParallelLinear::Describe() const {
  return absl::StrCat("ColumnParallelLinear(", weight_->global_shape()[1], " -> ",
                      weight_->global_shape()[0], ", tp=", TpSize(tp_),
                      options_.gather_output ? ", gather_output" : "", ")");
}

RowParallelLinear::RowParallelLinear(std::string name, std::shared_ptr<Param> weight,
                                     std::shared_ptr<Param> bias, ProcessGroupPtr tp,
                                     bool input_is_parallel)
    : name_(std::move(name)),
      weight_(std::move(weight)),
      bias_(std::move(bias)),
      tp_(std::move(tp)),
      input_is_parallel_(input_is_parallel) {}

at::Tensor RowParallelLinear::Forward(const at::Tensor& input) {
  at::Tensor x = input_is_parallel_ ? input : ScatterToTpRegion(input, tp_);
  at::Tensor y = ReduceFromTpRegion(at::linear(x, weight_->Compute()), tp_);
  return bias_ ? y + bias_->Compute() : y;
}

std::vector<std::shared_ptr<Param>> RowParallelLinear::Params() const {
  return WeightAndBias(weight_, bias_);
}

std::string RowParallelLinear::Describe() const {
  return absl::StrCat("RowParallelLinear(", weight_->global_shape()[1], " -> ",
                      weight_->global_shape()[0], ", tp=", TpSize(tp_), ")");
}

absl::StatusOr<std::shared_ptr<ColumnParallelLinear>> ColwiseParallel(
    const Linear& linear, const std::string& mesh_dim, ProcessGroupPtr tp,
    ColumnParallelOptions options) {
  if (absl::Status whole = CheckWhole(linear); !whole.ok()) return whole;
  std::shared_ptr<Param> weight = CopyParam(linear.weight());
  std::shared_ptr<Param> bias = CopyParam(linear.bias());
  if (!Trivial(tp)) {
    if (absl::Status s = weight->Shard(mesh_dim, 0, tp); !s.ok()) return s;
    if (bias) {
      if (absl::Status s = bias->Shard(mesh_dim, 0, tp); !s.ok()) return s;
    }
  }
  return std::make_shared<ColumnParallelLinear>(linear.name(), std::move(weight),
                                                std::move(bias), std::move(tp), options);
}

absl::StatusOr<std::shared_ptr<ColumnParallelLinear>> ColwiseParallel(
    const Linear& linear, const std::string& mesh_dim, ProcessGroupPtr tp,
    bool gather_output) {
  ColumnParallelOptions options;
  options.gather_output = gather_output;
  return ColwiseParallel(linear, mesh_dim, std::move(tp), options);
}

absl::StatusOr<std::shared_ptr<RowParallelLinear>> RowwiseParallel(
    const Linear& linear, const std::string& mesh_dim, ProcessGroupPtr tp,
    bool input_is_parallel) {
  if (absl::Status whole = CheckWhole(linear); !whole.ok()) return whole;
  std::shared_ptr<Param> weight = CopyParam(linear.weight());
  if (!Trivial(tp)) {
    if (absl::Status s = weight->Shard(mesh_dim, 1, tp); !s.ok()) return s;
  }
  return std::make_shared<RowParallelLinear>(linear.name(), std::move(weight),
                                             CopyParam(linear.bias()), std::move(tp),
                                             input_is_parallel);
}

absl::Status ParallelizeMlp(Sequential& model, const std::string& mesh_dim,
                            ProcessGroupPtr tp) {
  std::vector<size_t> linears;
  for (size_t i = 0; i < model.layers.size(); ++i) {
    if (dynamic_cast<Linear*>(model.layers[i].get())) linears.push_back(i);
  }
  // Convert everything first, replace after: an error leaves the model whole.
  std::vector<LayerPtr> converted;
  for (size_t k = 0; k < linears.size(); ++k) {
    const auto& linear = static_cast<const Linear&>(*model.layers[linears[k]]);
    absl::StatusOr<LayerPtr> layer;
    if (k % 2 == 1) {
      layer = RowwiseParallel(linear, mesh_dim, tp, /*input_is_parallel=*/true);
    } else {
      const bool last = k + 1 == linears.size();
      layer = ColwiseParallel(linear, mesh_dim, tp, /*gather_output=*/last);
    }
    if (!layer.ok()) return layer.status();
    converted.push_back(*std::move(layer));
  }
  for (size_t k = 0; k < linears.size(); ++k) model.layers[linears[k]] = converted[k];
  return absl::OkStatus();
}

}  // namespace meshrun::worker::parallel
