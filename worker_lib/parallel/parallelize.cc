#include "worker_lib/parallel/parallelize.h"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/nn/modules/linear.h>

#include <functional>
#include <memory>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "worker_lib/parallel/first_touch.h"
#include "worker_lib/parallel/module_params.h"
#include "worker_lib/parallel/sharding.h"
#include "worker_lib/parallel/vocab.h"

namespace meshrun::worker::parallel {
namespace {

using torch::autograd::Node;
using torch::autograd::variable_list;

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

bool SameStorage(const at::Tensor& a, const at::Tensor& b) {
  return a.defined() && b.defined() && a.has_storage() && b.has_storage() &&
         a.storage().unsafeGetStorageImpl() == b.storage().unsafeGetStorageImpl();
}

// The operators that compute a Linear's product: at::linear is not seen by
// RecordFunction; it becomes aten::t of the weight and then aten::addmm
// (2-D input, bias inside) or aten::matmul (the bias added after, in place).
bool IsProduct(std::string_view op) {
  return op == "aten::addmm" || op == "aten::mm" || op == "aten::matmul" ||
         op == "aten::linear" || op == "aten::_flatten_nd_linear" || op == "aten::bmm" ||
         op == "aten::baddbmm";
}

// Whether an operator on this thread belongs to a forward: outside a
// backward pass, or inside one with grad mode on. Backward's own operators on
// the weight (the input's gradient, grad_output @ weight) need no hook, and
// the engine runs them with grad mode off (it sets grad mode to create_graph).
// A forward run again inside backward, activation checkpointing's
// recomputation (PyTorch's reentrant and non-reentrant checkpoint alike run
// it under enable_grad, since it records a graph), needs both f and g as the
// first forward did: without them its input gradient is this rank's partial
// sum only. So a backward with create_graph (higher-order gradients) through
// a parallelized Linear is not supported: its operators look like a forward.
bool InForward() {
  return torch::autograd::get_current_graph_task_id() == -1 || at::GradMode::is_enabled();
}

// The hooks of one parallelized Linear (see the header), on the operator
// that multiplies by its weight in forward.
class TpLinear : public TouchTarget {
 public:
  TpLinear(ParallelStyle::Kind kind, ProcessGroupPtr group, at::Tensor weight,
           at::Tensor bias)
      : kind_(kind),
        group_(std::move(group)),
        weight_(std::move(weight)),
        bias_(std::move(bias)) {}

  bool OnTouch(std::string_view op_name) override {
    return IsProduct(op_name) && InForward();
  }

  void OnOperatorEnd(const OperatorCall& call) override {
    if (call.outputs.empty() || !call.outputs[0].isTensor()) return;
    const at::Tensor& output = call.outputs[0].toTensor();
    if (kind_ == ParallelStyle::Kind::kRowwise) {
      // g: sum the partial products. A bias added inside the operator
      // (addmm) is in every rank's output: keep rank 0's only.
      bool has_bias = false;
      for (const c10::IValue& input : call.inputs) {
        has_bias = has_bias || (input.isTensor() && SameStorage(input.toTensor(), bias_));
      }
      if (has_bias && group_->getRank() != 0) {
        at::NoGradGuard no_grad;
        at::Tensor alias = at::empty({0}, output.options());
        alias.set_(output.storage(), output.storage_offset(), output.sizes(),
                   output.strides());
        alias.sub_(bias_);
      }
      AllReduceInPlace(*group_, output);
      return;
    }
    if (!at::GradMode::is_enabled()) return;
    // f: the activation is the operand that is neither the weight nor the bias.
    for (const c10::IValue& input : call.inputs) {
      if (!input.isTensor()) continue;
      const at::Tensor& tensor = input.toTensor();
      if (SameStorage(tensor, weight_) || SameStorage(tensor, bias_)) continue;
      HookInputGradient(tensor, output, call.first_sequence_nr);
      return;
    }
  }

 private:
  // f: the gradient that this call's own autograd nodes send to `input` is
  // all-reduced. Those nodes are the ones between `output` and `input` made
  // during the call (sequence numbers from `first`).
  void HookInputGradient(const at::Tensor& input, const at::Tensor& output,
                         uint64_t first) {
    if (!input.requires_grad() || !output.requires_grad()) return;
    const torch::autograd::Edge target = torch::autograd::impl::gradient_edge(input);
    std::vector<Node*> stack{output.grad_fn().get()};
    std::unordered_set<Node*> seen;
    while (!stack.empty()) {
      Node* node = stack.back();
      stack.pop_back();
      if (node == nullptr || node->sequence_nr() < first || !seen.insert(node).second)
        continue;
      std::vector<size_t> slots;
      const auto& edges = node->next_edges();
      for (size_t i = 0; i < edges.size(); ++i) {
        if (edges[i].function == target.function &&
            edges[i].input_nr == target.input_nr) {
          slots.push_back(i);
        } else if (edges[i].function) {
          stack.push_back(edges[i].function.get());
        }
      }
      if (slots.empty()) continue;
      ProcessGroupPtr group = group_;
      node->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
          [group, slots](const variable_list& outputs, const variable_list& /*inputs*/) {
            variable_list reduced = outputs;
            for (size_t slot : slots) {
              if (!reduced[slot].defined()) continue;
              at::NoGradGuard no_grad;
              reduced[slot] = reduced[slot].contiguous().clone();
              AllReduceSum(*group, reduced[slot])->wait();
            }
            return reduced;
          }));
    }
  }

  ParallelStyle::Kind kind_;
  ProcessGroupPtr group_;
  at::Tensor weight_;
  at::Tensor bias_;
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

// TpLinear targets live as long as the process, like the modules' hooks.
std::vector<std::unique_ptr<TpLinear>>& Hooks() {
  static auto* hooks = new std::vector<std::unique_ptr<TpLinear>>();
  return *hooks;
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
    ShardInPlace(target.path + ".weight", linear.weight, colwise ? 0 : 1, mesh_dim,
                 group);
    if (colwise && linear.bias.defined()) {
      ShardInPlace(target.path + ".bias", linear.bias, 0, mesh_dim, group);
    }
    auto hook =
        std::make_unique<TpLinear>(target.style.kind, group, linear.weight, linear.bias);
    WatchStorage(linear.weight, hook.get());
    Hooks().push_back(std::move(hook));
  }
  return absl::OkStatus();
}

at::Tensor LossParallel(const at::Tensor& local_logits, const at::Tensor& targets,
                        const ProcessGroupPtr& group) {
  return VocabParallelCrossEntropy(local_logits, targets, group).mean();
}

}  // namespace meshrun::worker::parallel
