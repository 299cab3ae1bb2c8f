#pragma once

// A model parameter that may be sharded over a DeviceMesh: the C++ side of a
// DTensor parameter. It knows the global shape, the sharding steps applied to
// it in order (TP before FSDP), and so the box of the global tensor it holds.
//
//   auto w = Param::FromFull("fc1.weight", full);      // every rank: the whole
//   w->AddStep(step, tp_group, my_rows);               // TP (parallelize.cc)
//   ShardIntoGroups({w}, "fsdp", fsdp_group);          // FSDP (fsdp.h)
//   at::Tensor full = FullTensor(*w);                  // collective
//
// data() is the leaf tensor (requires_grad) that gradients accumulate in and
// the optimizer updates: the shard. A torch::nn module's parameters are
// Params through ParallelizeModule and FullyShard (module_params.h), which
// keep the tensor the module computes with apart from data().
//
// Not thread-safe; collective methods must be called by every member of the
// groups involved, in the same order.

#include <memory>
#include <string>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <vector>

#include "worker_lib/parallel/sharding.h"

namespace meshrun::worker::parallel {

using ProcessGroupPtr = c10::intrusive_ptr<c10d::ProcessGroup>;

class Param;

// What a sharding strategy keeps with a parameter it sharded: FSDP's
// FsdpParam (fsdp.h), its unsharded storage and its group.
class ParamShardState {
 public:
  virtual ~ParamShardState() = default;
};

class Param {
 public:
  // A replicated parameter holding a copy of `full` (requires_grad).
  static std::shared_ptr<Param> FromFull(std::string name, const at::Tensor& full);
  // A replicated parameter over `leaf` itself (no copy): a module's own
  // parameter, which its forward and the user's optimizer keep using.
  static std::shared_ptr<Param> OfLeaf(std::string name, at::Tensor leaf);

  // A Param of another name over `data`, sharded as this one (its global
  // shape, steps and groups), e.g. an optimizer's state of the same shape
  // as data(), or data() under its name in a module's state dict.
  std::shared_ptr<Param> Alias(std::string name, at::Tensor data) const;

  const std::string& name() const { return name_; }
  const std::vector<int64_t>& global_shape() const { return global_shape_; }
  // The sharding steps in the order they were applied, and their groups.
  const std::vector<ShardStep>& steps() const { return steps_; }
  const std::vector<ProcessGroupPtr>& groups() const { return groups_; }
  // The region of the global tensor this rank holds.
  Box box() const { return LocalBox(global_shape_, steps_); }

  // The leaf tensor: gradients accumulate in data().grad(). Its shape is
  // box().sizes, except that the last step may pad its dim (FSDP pads every
  // chunk to the same size so collectives see equal shapes; padding is zero).
  const at::Tensor& data() const { return data_; }
  // data() without padding: exactly box().sizes (a view).
  at::Tensor LocalValues() const;

  // For sharding strategies (parallelize.cc's TP, fsdp.h): records `step`
  // done over `group` and makes `new_data` (a fresh leaf, requires_grad) the
  // stored shard. TP steps come before FSDP's.
  void AddStep(ShardStep step, ProcessGroupPtr group, at::Tensor new_data);
  void set_shard_state(std::shared_ptr<ParamShardState> state) {
    shard_state_ = std::move(state);
  }
  const std::shared_ptr<ParamShardState>& shard_state() const { return shard_state_; }

 private:
  Param(std::string name, at::Tensor data);

  std::string name_;
  std::vector<int64_t> global_shape_;
  std::vector<ShardStep> steps_;
  std::vector<ProcessGroupPtr> groups_;
  at::Tensor data_;
  std::shared_ptr<ParamShardState> shard_state_;
};

// The local tensor `local` (the box after `steps`, padding allowed along the
// last step's dim) gathered back to the global tensor by undoing the steps
// in reverse order over their groups. Collective over every group in
// `groups`. Differentiable is not needed: runs without autograd.
at::Tensor GatherSteps(const at::Tensor& local, const std::vector<int64_t>& global_shape,
                       const std::vector<ShardStep>& steps,
                       const std::vector<ProcessGroupPtr>& groups);

// DTensor.full_tensor(): the global value of `param` on every rank holding
// it. Collective over the param's groups.
at::Tensor FullTensor(const Param& param);

// Where collectives over `params` put their own small tensors (flags,
// counts): the params' device, as NCCL takes CUDA tensors only; CPU for none.
at::Device DeviceOf(const std::vector<std::shared_ptr<Param>>& params);

// all_gather of equal-shaped tensors along `dim` (gloo and others).
at::Tensor AllGatherAlong(c10d::ProcessGroup& group, const at::Tensor& local, int dim);

}  // namespace meshrun::worker::parallel
