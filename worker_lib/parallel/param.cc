#include "worker_lib/parallel/param.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/generated/variable_factories.h>

namespace meshrun::worker::parallel {

namespace {

at::Tensor NewLeaf(const at::Tensor& values) {
  return values.detach().clone().contiguous().set_requires_grad(true);
}

// `t` zero-padded along `dim` to `size`.
at::Tensor PadTo(const at::Tensor& t, int dim, int64_t size) {
  if (t.size(dim) == size) return t;
  std::vector<int64_t> shape = t.sizes().vec();
  shape[dim] = size;
  at::Tensor padded = at::zeros(shape, t.options());
  padded.narrow(dim, 0, t.size(dim)).copy_(t);
  return padded;
}

}  // namespace

std::shared_ptr<Param> Param::FromFull(std::string name, const at::Tensor& full) {
  return std::shared_ptr<Param>(new Param(std::move(name), NewLeaf(full)));
}

std::shared_ptr<Param> Param::OfLeaf(std::string name, at::Tensor leaf) {
  return std::shared_ptr<Param>(new Param(std::move(name), std::move(leaf)));
}

std::shared_ptr<Param> Param::Alias(std::string name, at::Tensor data) const {
  auto alias = std::shared_ptr<Param>(new Param(std::move(name), std::move(data)));
  alias->global_shape_ = global_shape_;
  alias->steps_ = steps_;
  alias->groups_ = groups_;
  return alias;
}

Param::Param(std::string name, at::Tensor data)
    : name_(std::move(name)), global_shape_(data.sizes().vec()), data_(std::move(data)) {}

at::Tensor Param::LocalValues() const {
  Box local = box();
  at::Tensor values = data_;
  for (size_t d = 0; d < local.sizes.size(); ++d) {
    if (values.size(d) != local.sizes[d]) values = values.narrow(d, 0, local.sizes[d]);
  }
  return values;
}

void Param::AddStep(ShardStep step, ProcessGroupPtr group, at::Tensor new_data) {
  steps_.push_back(std::move(step));
  groups_.push_back(std::move(group));
  data_ = std::move(new_data);
}

at::Tensor AllGatherAlong(c10d::ProcessGroup& group, const at::Tensor& local, int dim) {
  const int n = group.getSize();
  if (n == 1) return local.clone();
  at::Tensor input = local.contiguous();
  std::vector<at::Tensor> pieces;
  for (int i = 0; i < n; ++i) pieces.push_back(at::empty_like(input));
  std::vector<std::vector<at::Tensor>> outputs{pieces};
  std::vector<at::Tensor> inputs{input};
  group.allgather(outputs, inputs)->wait();
  return at::cat(outputs[0], dim);
}

at::Tensor GatherSteps(const at::Tensor& local, const std::vector<int64_t>& global_shape,
                       const std::vector<ShardStep>& steps,
                       const std::vector<ProcessGroupPtr>& groups) {
  at::NoGradGuard no_grad;
  at::Tensor current = local.detach();
  for (size_t k = steps.size(); k-- > 0;) {
    const ShardStep& step = steps[k];
    // The extent along step.dim of what this step split.
    const Box before = LocalBox(global_shape, {steps.begin(), steps.begin() + k});
    const int64_t n = before.sizes[step.dim];
    const int64_t padded = ChunkOf(n, step.parts, 0).padded_size;
    at::Tensor mine =
        current.narrow(step.dim, 0, ChunkOf(n, step.parts, step.index).size);
    at::Tensor gathered =
        AllGatherAlong(*groups[k], PadTo(mine, step.dim, padded), step.dim);
    std::vector<at::Tensor> chunks;
    for (int64_t j = 0; j < step.parts; ++j) {
      chunks.push_back(
          gathered.narrow(step.dim, j * padded, ChunkOf(n, step.parts, j).size));
    }
    current = at::cat(chunks, step.dim);
  }
  return current;
}

at::Tensor FullTensor(const Param& param) {
  return GatherSteps(param.data(), param.global_shape(), param.steps(), param.groups());
}

at::Device DeviceOf(const std::vector<std::shared_ptr<Param>>& params) {
  return params.empty() ? at::Device(at::kCPU) : params[0]->data().device();
}

}  // namespace meshrun::worker::parallel
