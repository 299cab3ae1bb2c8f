#pragma once

// Fault-tolerant replicas (fault_tolerant.h) over a user's torch::nn::Module
// and a torch::optim optimizer, the loop torchft users write with its
// Manager:
//
//   auto replicas = FaultTolerantReplicas::Create(world, id, {.steps = steps}).value();
//   ModuleTrainingState state(*model, optimizer);
//   while (true) {
//     StepQuorum q = replicas->BeginStep(state).value();   // may heal `state`
//     if (!q.participating) continue;
//     if (q.step >= steps) break;
//     optimizer.zero_grad();
//     at::Tensor loss = loss_fn(model->forward(my rows of batch(q.step)));
//     loss.backward();
//     double value = loss.item<double>();
//     if (replicas->Sync(state.params(), &value).value()) optimizer.step();
//   }
//
// A heal copies the module's parameters and buffers and the optimizer's
// state of every parameter (optimizer_state.h: Adam, AdamW, SGD, RMSprop,
// Adagrad), step counts included; a replica that has not stepped yet makes
// its state first. Sharded parameters (FullyShard, ParallelizeModule inside
// the replica group) are this member's shards, copied from the same member
// of the source group.

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <memory>
#include <vector>

#include "worker_lib/parallel/param.h"
#include "worker_lib/training/fault_tolerant.h"

namespace meshrun::worker::parallel {

class ModuleTrainingState final : public TrainingState {
 public:
  // Both must outlive this. Throws c10::Error for an optimizer whose state
  // optimizer_state.h cannot list.
  ModuleTrainingState(torch::nn::Module& module, torch::optim::Optimizer& optimizer);

  // The module's parameters, for FaultTolerantReplicas::Sync (their grads).
  const std::vector<std::shared_ptr<Param>>& params() const { return params_; }

  std::vector<at::Tensor> Tensors() override;
  void Received() override;

 private:
  torch::nn::Module& module_;
  torch::optim::Optimizer& optimizer_;
  std::vector<std::shared_ptr<Param>> params_;
  // Each parameter's step count as a tensor while a heal carries it.
  std::vector<at::Tensor> steps_;
};

}  // namespace meshrun::worker::parallel
