#pragma once

// The user's model of the torch::nn::Module tests (module_*_worker.cc): a
// residual MLP in plain libtorch (Linear, LayerNorm, GELU, a ModuleList of
// blocks called through as<Block>()), written as a user writes one (its
// submodules called through Forward, module_hooks.h), and its
// single-process training with AdamW, the reference each rank checks its
// parallel run against.

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/optim/adamw.h>

#include <map>
#include <string>
#include <vector>

#include "tests/integration/parallel/parity_harness.h"
#include "worker_lib/data/data.h"
#include "worker_lib/parallel/module_hooks.h"

namespace meshrun::worker::parallel::testing {

constexpr int64_t kIn = 12, kDim = 30, kOut = 5, kBlocks = 3, kBatch = 16;
constexpr uint64_t kModelSeed = 7, kDataSeed = 11;

struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(int64_t dim)
      : norm(register_module("norm",
                             torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})))),
        fc1(register_module("fc1", torch::nn::Linear(dim, 2 * dim))),
        fc2(register_module("fc2", torch::nn::Linear(2 * dim, dim))) {}
  at::Tensor forward(const at::Tensor& x) {
    return x + Forward(fc2, at::gelu(Forward(fc1, norm->forward(x))));
  }
  torch::nn::LayerNorm norm;
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Block);

struct NetImpl : torch::nn::Module {
  explicit NetImpl(int64_t out = kOut)
      : in(register_module("in", torch::nn::Linear(kIn, kDim))),
        blocks(register_module("blocks", torch::nn::ModuleList())),
        norm(register_module("norm",
                             torch::nn::LayerNorm(torch::nn::LayerNormOptions({kDim})))),
        head(register_module("head", torch::nn::Linear(kDim, out))) {
    for (int64_t i = 0; i < kBlocks; ++i) blocks->push_back(Block(kDim));
  }
  at::Tensor forward(const at::Tensor& x) {
    at::Tensor h = Forward(in, x);
    for (const auto& block : *blocks) h = Forward(block->as<BlockImpl>(), h);
    return Forward(head, norm->forward(h));
  }
  torch::nn::Linear in;
  torch::nn::ModuleList blocks;
  torch::nn::LayerNorm norm;
  torch::nn::Linear head;
};
TORCH_MODULE(Net);

inline Net MakeNet(uint64_t seed = kModelSeed, int64_t out = kOut) {
  torch::manual_seed(seed);
  return Net(out);
}

inline torch::optim::AdamWOptions Adam() {
  return torch::optim::AdamWOptions(1e-2).weight_decay(0.05);
}

struct ModuleReference {
  std::vector<double> losses;
  std::map<std::string, at::Tensor> params;
};

// `steps` steps of AdamW over `params` (the model's, each once) on
// SyntheticBatch(kDataSeed, step, kBatch, ...), whole, in this process, on
// `device` (the model is moved there; the parameters keep their identity).
// The final parameters are returned on the CPU.
template <typename Model>
ModuleReference TrainWhole(Model& net, const std::vector<at::Tensor>& params, int steps,
                           at::Device device = at::kCPU) {
  net->to(device);
  torch::optim::AdamW optimizer(params, Adam());
  ModuleReference reference;
  for (int step = 0; step < steps; ++step) {
    Batch data = SyntheticBatch(kDataSeed, step, kBatch, kIn, kOut);
    optimizer.zero_grad();
    at::Tensor loss =
        MseLoss(net->forward(data.input.to(device)), data.target.to(device));
    loss.backward();
    optimizer.step();
    reference.losses.push_back(loss.item<double>());
  }
  for (const auto& item : net->named_parameters()) {
    reference.params[item.key()] =
        item.value().detach().to(at::kCPU, /*non_blocking=*/false,
                                 /*copy=*/true);
  }
  return reference;
}

// Net's reference run.
inline ModuleReference TrainModuleReference(int steps, at::Device device = at::kCPU) {
  Net net = MakeNet();
  return TrainWhole(net, net->parameters(), steps, device);
}

}  // namespace meshrun::worker::parallel::testing
