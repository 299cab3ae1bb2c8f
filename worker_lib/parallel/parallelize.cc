#include "worker_lib/parallel/parallelize.h"

#include <torch/csrc/autograd/custom_function.h>
#include <torch/nn/modules/linear.h>

#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "worker_lib/parallel/module_hooks.h"
#include "worker_lib/parallel/module_params.h"
#include "worker_lib/parallel/sharding.h"
#include "worker_lib/parallel/vocab.h"

namespace meshrun::worker::parallel {
namespace {

// Whether `pattern` ("blocks.*.fc1") names the module path `path`.
bool Matches(const std::string& pattern, const std::string& path) {
  std::vector<std::string> want = absl::StrSplit(pattern, '.');
  std::vector<std::string> have = absl::StrSplit(path, '.');
  if (want.size() != have.size()) return false;
  for (size_t i = 0; i < want.size(); ++i) {
    if (want[i] != "*" && want[i] != have[i]) return false;
  }
  return true;
}

c10::intrusive_ptr<c10d::Work> AllReduceSum(c10d::ProcessGroup& group,
                                            at::Tensor& tensor) {
  std::vector<at::Tensor> tensors{tensor};
  return group.allreduce(tensors);
}

// `tensor`'s values, all-reduced (sum) in place without autograd seeing a
// change: through a tensor of its own over the same memory.
void AllReduceInPlace(c10d::ProcessGroup& group, const at::Tensor& tensor) {
  at::NoGradGuard no_grad;
  at::Tensor alias = at::empty({0}, tensor.options());
  alias.set_(tensor.storage(), tensor.storage_offset(), tensor.sizes(), tensor.strides());
  if (alias.is_contiguous()) {
    AllReduceSum(group, alias)->wait();
    return;
  }
  at::Tensor dense = alias.contiguous();
  AllReduceSum(group, dense)->wait();
  alias.copy_(dense);
}

// Megatron's f: identity in forward, the input gradient all-reduced (sum)
// in backward (a Colwise layer's input is replicated, each rank's gradient
// of it partial).
struct CopyToTpRegion : torch::autograd::Function<CopyToTpRegion> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx,
                            const at::Tensor& input, ProcessGroupPtr group) {
    ctx->saved_data["group"] = c10::IValue::make_capsule(std::move(group));
    return input;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto group = c10::static_intrusive_pointer_cast<c10d::ProcessGroup>(
        ctx->saved_data["group"].toCapsule());
    at::Tensor reduced = grads[0].contiguous().clone();
    AllReduceSum(*group, reduced)->wait();
    return {reduced, at::Tensor()};
  }
};

// The hooks of one parallelized Linear (see the header): f on its input
// (Colwise), g on its output (Rowwise). They also run in a forward run again
// inside backward (activation checkpointing's recomputation), which calls
// Forward like the first; backward's own operators never do.
class TpLinear : public ForwardHook {
 public:
  TpLinear(ParallelStyle::Kind kind, ProcessGroupPtr group, at::Tensor bias,
           std::vector<std::shared_ptr<Param>> params)
      : kind_(kind),
        group_(std::move(group)),
        bias_(std::move(bias)),
        params_(std::move(params)) {}

  void PreForward(std::vector<at::Tensor>& inputs) override {
    if (kind_ != ParallelStyle::Kind::kColwise || inputs.empty()) return;
    at::Tensor& input = inputs[0];
    if (at::GradMode::is_enabled() && input.requires_grad()) {
      input = CopyToTpRegion::apply(input, group_);
    }
  }

  void PostForward(std::vector<at::Tensor>& outputs) override {
    if (kind_ != ParallelStyle::Kind::kRowwise || outputs.empty()) return;
    // g: sum the partial products, through an alias autograd does not see
    // (its backward is the identity). The bias, in every rank's output,
    // is kept once: rank 0's.
    const at::Tensor& output = outputs[0];
    if (bias_.defined() && group_->getRank() != 0) {
      at::NoGradGuard no_grad;
      at::Tensor alias = at::empty({0}, output.options());
      alias.set_(output.storage(), output.storage_offset(), output.sizes(),
                 output.strides());
      alias.sub_(bias_);
    }
    AllReduceInPlace(*group_, output);
  }

 private:
  ParallelStyle::Kind kind_;
  ProcessGroupPtr group_;
  at::Tensor bias_;
  // The shards' Params (module_params.h keeps them only weakly).
  std::vector<std::shared_ptr<Param>> params_;
};

struct Target {
  std::string path;
  torch::nn::LinearImpl* linear;
  ParallelStyle style;
};

// Keeps chunk `index` of `parts` along `dim` of the module's tensor, in
// place (the module and its optimizer keep the same tensor), recorded as a
// Param of global shape and one sharding step.
std::shared_ptr<Param> ShardInPlace(const std::string& name, at::Tensor& tensor, int dim,
                                    const std::string& mesh_dim,
                                    const ProcessGroupPtr& group) {
  auto param = Param::OfLeaf(name, tensor);
  const int64_t parts = group->getSize();
  const int64_t index = group->getRank();
  const ChunkExtent chunk = ChunkOf(tensor.size(dim), parts, index);
  {
    at::NoGradGuard no_grad;
    tensor.set_data(tensor.narrow(dim, chunk.offset, chunk.size).contiguous().clone());
  }
  param->AddStep(ShardStep{mesh_dim, dim, parts, index}, group, tensor);
  RecordParam(tensor, param);
  return param;
}

}  // namespace

absl::Status ParallelizeModule(torch::nn::Module& module, const std::string& mesh_dim,
                               ProcessGroupPtr group, const ParallelizePlan& plan) {
  if (group == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("ParallelizeModule: no process group for '", mesh_dim, "'"));
  }
  const int64_t parts = group->getSize();
  std::vector<Target> targets;
  for (const auto& [pattern, style] : plan) {
    bool matched = false;
    absl::Status error;
    ForEachSubmodule(module, [&](torch::nn::Module& found, const std::string& path) {
      if (path.empty() || !Matches(pattern, path) || !error.ok()) return;
      matched = true;
      auto* linear = dynamic_cast<torch::nn::LinearImpl*>(&found);
      if (linear == nullptr) {
        error = absl::InvalidArgumentError(absl::StrCat(
            "ParallelizeModule: ", path, " is a ", found.name(),
            "; ColwiseParallel and RowwiseParallel take a torch::nn::Linear"));
        return;
      }
      if (ParamOf(linear->weight) != nullptr) {
        error = absl::FailedPreconditionError(absl::StrCat(
            "ParallelizeModule: ", path, " is already parallelized or sharded"));
        return;
      }
      const bool colwise = style.kind == ParallelStyle::Kind::kColwise;
      const int64_t size = linear->weight.size(colwise ? 0 : 1);
      if (size % parts != 0) {
        error = absl::InvalidArgumentError(absl::StrCat(
            "ParallelizeModule: ", path, ".weight is ", c10::str(linear->weight.sizes()),
            "; its ", colwise ? "rows (output features)" : "columns (input features)",
            ", ", size, ", do not split evenly over ", parts, " ranks of '", mesh_dim,
            "'"));
        return;
      }
      targets.push_back(Target{path, linear, style});
    });
    if (!error.ok()) return error;
    if (!matched) {
      return absl::InvalidArgumentError(absl::StrCat("ParallelizeModule: the plan's '",
                                                     pattern, "' names no submodule of ",
                                                     module.name()));
    }
  }
  for (Target& target : targets) {
    torch::nn::LinearImpl& linear = *target.linear;
    const bool colwise = target.style.kind == ParallelStyle::Kind::kColwise;
    std::vector<std::shared_ptr<Param>> params;
    params.push_back(ShardInPlace(target.path + ".weight", linear.weight, colwise ? 0 : 1,
                                  mesh_dim, group));
    if (colwise && linear.bias.defined()) {
      params.push_back(
          ShardInPlace(target.path + ".bias", linear.bias, 0, mesh_dim, group));
    }
    HooksOf(linear).Add(std::make_shared<TpLinear>(target.style.kind, group, linear.bias,
                                                   std::move(params)));
  }
  return absl::OkStatus();
}

at::Tensor LossParallel(const at::Tensor& local_logits, const at::Tensor& targets,
                        const ProcessGroupPtr& group) {
  return VocabParallelCrossEntropy(local_logits, targets, group).mean();
}

}  // namespace meshrun::worker::parallel
