// ParallelizeModule on a user's torch::nn::Module (parallelize.h) under
// meshrun: module_net.h's residual MLP with every block's fc1 column-wise
// and fc2 row-wise parallel, trained with AdamW on model->parameters().
// Every rank checks every step's loss and the gathered final parameters
// against the same model trained in one process (rtol 1e-5).
//
//   (default)   tensor parallelism over all ranks, which see the same batch
//   --fsdp      FSDP + TP on a (dp, tp) = (world / tp, tp) mesh (--tp,
//               default 2): TP inside each dp group, then FullyShard of the
//               blocks and the root over dp, each dp rank on its rows of the
//               batch; --tp=1 is FullyShard alone (a TP group of one)
//   --checkpoint  activation checkpointing of every block (CheckpointBlock:
//               PyTorch's reentrant torch.utils.checkpoint): the blocks'
//               forwards run again inside backward, and must get the same
//               TP hooks and FSDP gathers as the first time
//
// Rank 0 first checks that bad plans are refused, each with one line.
//
//   meshrun --standalone --nproc-per-node=4 module_tp_worker --fsdp

#include <torch/autograd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <cstdint>
#include <cstdio>

#include "tests/integration/parallel/module_checks.h"
#include "tests/integration/parallel/module_net.h"
#include "worker_lib/mesh/device_mesh.h"
#include "worker_lib/mesh/process_group.h"
#include "worker_lib/parallel/fully_shard.h"
#include "worker_lib/parallel/parallelize.h"

namespace meshrun::worker::parallel::testing {
namespace {

// PyTorch's reentrant torch.utils.checkpoint(block, x), which libtorch
// lacks: forward runs the block without grad and keeps only its input;
// backward runs the block's forward again with grad on (inside the backward
// pass: a graph task is running) and backpropagates through it, which
// accumulates the block's parameters' gradients and gives the input's.
struct CheckpointBlock : torch::autograd::Function<CheckpointBlock> {
  // Recomputations so far: the test checks that backward ran them.
  static inline std::atomic<int> recomputed{0};
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            BlockImpl* block) {
    // A plain pointer as an IValue: the block outlives the step.
    ctx->saved_data["block"] = reinterpret_cast<int64_t>(block);
    ctx->save_for_backward({x});
    return Forward(block, x);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto* block = reinterpret_cast<BlockImpl*>(ctx->saved_data["block"].toInt());
    at::Tensor x = ctx->get_saved_variables()[0].detach().requires_grad_(true);
    at::Tensor y;
    ++recomputed;
    {
      at::AutoGradMode grad(true);
      y = Forward(block, x);
    }
    torch::autograd::backward({y}, {grads[0]});
    return {x.grad(), at::Tensor()};
  }
};

// module_net.h's Net, its blocks checkpointed when `checkpoint` is set.
// The root's own Forward runs this forward, so the root unit's hooks (FSDP's
// gather of in, norm and head) come first as in NetImpl's.
struct CheckpointedNetImpl : NetImpl {
  at::Tensor forward(const at::Tensor& x) {
    if (!checkpoint) return NetImpl::forward(x);
    at::Tensor h = Forward(in, x);
    for (const auto& block : *blocks) {
      h = CheckpointBlock::apply(h, block->as<BlockImpl>());
    }
    return Forward(head, norm->forward(h));
  }
  bool checkpoint = false;
};

std::shared_ptr<CheckpointedNetImpl> MakeCheckpointedNet(bool checkpoint) {
  torch::manual_seed(kModelSeed);
  auto net = std::make_shared<CheckpointedNetImpl>();
  net->checkpoint = checkpoint;
  return net;
}

ParallelizePlan BlockPlan() {
  return {{"blocks.*.fc1", ColwiseParallel()}, {"blocks.*.fc2", RowwiseParallel()}};
}

void CheckBadPlans(const ProcessGroupPtr& tp) {
  const std::vector<std::pair<std::string, ParallelizePlan>> bad = {
      {"missing", {{"blocks.*.fc3", ColwiseParallel()}}},
      {"not a Linear", {{"blocks.0.norm", ColwiseParallel()}}},
      {"uneven", {{"head", ColwiseParallel()}}},
  };
  for (const auto& [what, plan] : bad) {
    Net net = MakeNet();
    absl::Status status = ParallelizeModule(*net, "tp", tp, plan);
    if (status.ok()) Fail("a plan (" + what + ") was accepted");
    std::printf("PLAN %s: %s\n", what.c_str(), status.ToString().c_str());
  }
}

int Train(bool fsdp, int tp_size_under_fsdp, bool checkpoint, int steps) {
  auto world = ValueOrFail(InitProcessGroup("gloo"), "init");
  const int rank = world->rank();
  const int tp_size = fsdp ? tp_size_under_fsdp : world->size();
  const int dp_size = world->size() / tp_size;
  auto mesh = ValueOrFail(
      InitDeviceMesh(world, "cpu", {dp_size, tp_size}, {{"dp", "tp"}}), "mesh");
  ProcessGroupPtr tp = ValueOrFail(mesh.GetGroup("tp"), "tp group");
  ProcessGroupPtr dp = ValueOrFail(mesh.GetGroup("dp"), "dp group");
  if (rank == 0 && tp->getSize() > 1) CheckBadPlans(tp);  // one rank splits anything
  const ModuleReference reference = TrainModuleReference(steps);

  auto net = MakeCheckpointedNet(checkpoint);
  CheckOk(ParallelizeModule(*net, "tp", tp, BlockPlan()), "ParallelizeModule");
  if (fsdp) {
    for (const auto& block : *net->blocks) CheckOk(FullyShard(*block, "dp", dp), "block");
    CheckOk(FullyShard(*net, "dp", dp), "root");
  }
  if (rank == 0) {
    std::printf("LOCAL blocks.0.fc1.weight %s blocks.0.fc2.weight %s\n",
                c10::str(net->named_parameters()["blocks.0.fc1.weight"].sizes()).c_str(),
                c10::str(net->named_parameters()["blocks.0.fc2.weight"].sizes()).c_str());
  }
  torch::optim::AdamW optimizer(net->parameters(), Adam());
  const int64_t dp_rank = dp->getRank();
  for (int step = 0; step < steps; ++step) {
    Batch data = SyntheticBatch(kDataSeed, step, kBatch, kIn, kOut);
    optimizer.zero_grad();
    const at::Tensor input = DataShard(data.input, dp_size, dp_rank);
    at::Tensor loss =
        MseLoss(Forward(net, input), DataShard(data.target, dp_size, dp_rank));
    loss.backward();
    optimizer.step();
    const double global = MeanOver(*dp, loss);
    ExpectClose("loss at step " + std::to_string(step), global, reference.losses[step]);
    if (rank == 0) std::printf("step %d loss %.6f\n", step, global);
  }
  // Without FSDP only the blocks' Linears are sharded; the rest is
  // replicated and must equal the reference as it is.
  ExpectModuleParams(*net, reference.params);
  if (rank == 0) std::printf("SHARDED %zu parameters\n", ShardedParams(*net).size());
  if (rank == 0 && checkpoint)
    std::printf("RECOMPUTED %d block forwards\n", CheckpointBlock::recomputed.load());
  std::printf("DONE rank %d\n", rank);
  std::fflush(stdout);
  return 0;
}

}  // namespace
}  // namespace meshrun::worker::parallel::testing

int main(int argc, char** argv) {
  CLI::App app{"ParallelizeModule on a torch::nn::Module against one process"};
  bool fsdp = false;
  int steps = 8;
  bool checkpoint = false;
  int tp_size_under_fsdp = 2;
  app.add_flag("--fsdp", fsdp);
  app.add_option("--tp", tp_size_under_fsdp, "the TP group's size under --fsdp")
      ->check(CLI::Range(1, 64));
  app.add_flag("--checkpoint", checkpoint);
  app.add_option("--steps", steps);
  CLI11_PARSE(app, argc, argv);
  return meshrun::worker::parallel::testing::Train(fsdp, tp_size_under_fsdp, checkpoint,
                                                   steps);
}
