#pragma once

// An MLP in plain libtorch (torch::nn): Linear layers fc0, fc1, ... with a
// ReLU between each two, the model of seed 003 (sizes 50, 50, 50, 50, 4)
// and of the parity check's MLP (tests/parity/torch_parallel.py, the same
// parameter names). As with the GPT (gpt.h), it knows only that
// the modules the parallelisms change are called through parallel::Forward;
// MlpModel tells ModuleTrainer how to parallelise it.
//
//   torch::manual_seed(seed);
//   Mlp mlp(std::vector<int64_t>{50, 50, 50, 50, 4});
//   at::Tensor y = mlp->forward(x);   // [B, 50] -> [B, 4]

#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/modules/linear.h>

#include <cstdint>
#include <string>
#include <vector>

#include "worker_lib/parallel/module_hooks.h"
#include "worker_lib/parallel/parallelize.h"
#include "worker_lib/training/module_trainer.h"

namespace meshrun::worker::models {

struct MlpImpl : torch::nn::Module {
  explicit MlpImpl(const std::vector<int64_t>& sizes) {
    for (size_t i = 0; i + 1 < sizes.size(); ++i) {
      layers.push_back(register_module("fc" + std::to_string(i),
                                       torch::nn::Linear(sizes[i], sizes[i + 1])));
    }
  }
  at::Tensor forward(const at::Tensor& x) {
    return ForwardParts(x, 0, static_cast<int>(layers.size()) - 1);
  }
  // Parts [first, last] of the model: part k is fc<k> and the ReLU after it
  // (none after the last).
  at::Tensor ForwardParts(at::Tensor x, int first, int last) {
    for (int k = first; k <= last; ++k) {
      x = parallel::Forward(layers[static_cast<size_t>(k)], x);
      if (static_cast<size_t>(k) + 1 < layers.size()) x = at::relu(x);
    }
    return x;
  }
  std::vector<torch::nn::Linear> layers;
};
TORCH_MODULE(Mlp);

// A pipeline stage: parts [first, last] of the whole MLP, sharing its
// Linears under their own names.
struct MlpStageImpl : torch::nn::Module {
  MlpStageImpl(const Mlp& mlp, int first_part, int last_part)
      : first(first_part), last(last_part), whole(mlp) {
    for (int k = first; k <= last; ++k)
      register_module("fc" + std::to_string(k), mlp->layers[static_cast<size_t>(k)]);
  }
  at::Tensor forward(const at::Tensor& x) { return whole->ForwardParts(x, first, last); }
  int first, last;
  Mlp whole{nullptr};
};
TORCH_MODULE(MlpStage);

// Megatron's pairs: fc<2i> column-wise, fc<2i+1> row-wise (the ReLU between
// them works on the column slices); an odd last Linear stays replicated.
inline parallel::ParallelizePlan MlpTpPlan(const Mlp& mlp) {
  parallel::ParallelizePlan plan;
  for (size_t k = 0; k + 1 < mlp->layers.size(); k += 2) {
    plan.emplace_back("fc" + std::to_string(k), parallel::ColwiseParallel());
    plan.emplace_back("fc" + std::to_string(k + 1), parallel::RowwiseParallel());
  }
  return plan;
}

// What ModuleTrainer needs of the MLP: every Linear a FullyShard unit and a
// pipeline part, MlpTpPlan, the mean squared error.
inline parallel::ModuleModel MlpModel(const Mlp& mlp) {
  parallel::ModuleModel model;
  model.root = mlp.ptr();
  for (const auto& layer : mlp->layers) model.shard_units.push_back(layer.ptr());
  model.tp_plan = MlpTpPlan(mlp);
  model.forward = [impl = mlp.ptr()](const at::Tensor& x) {
    return parallel::Forward(impl, x);
  };
  model.loss = [](const at::Tensor& output, const at::Tensor& target) {
    return (output - target).pow(2).mean();
  };
  model.num_parts = static_cast<int>(mlp->layers.size());
  model.stage_of = [mlp](int first, int last) {
    return torch::nn::AnyModule(MlpStage(mlp, first, last));
  };
  return model;
}

}  // namespace meshrun::worker::models
