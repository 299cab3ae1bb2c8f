// ParallelizeModule on a user's torch::nn::Module (parallelize.h) under
// meshrun: module_net.h's residual MLP with every block's fc1 column-wise
// and fc2 row-wise parallel, trained with AdamW on model->parameters().
// Every rank checks every step's loss and the gathered final parameters
// against the same model trained in one process (rtol 1e-5).
//
//   (default)   tensor parallelism over all ranks, which see the same batch
//   --fsdp      FSDP + TP on a (dp, tp) = (world / 2, 2) mesh: TP inside
//               each dp group, then FullyShard of the blocks and the root
//               over dp, each dp rank on its rows of the batch
//
// Rank 0 first checks that bad plans are refused, each with one line.
//
//   meshrun --standalone --nproc-per-node=4 module_tp_worker --fsdp

#include <CLI/CLI.hpp>
#include <cstdio>

#include "tests/integration/parallel/module_checks.h"
#include "tests/integration/parallel/module_net.h"
#include "worker_lib/mesh/device_mesh.h"
#include "worker_lib/mesh/process_group.h"
#include "worker_lib/parallel/fully_shard.h"
#include "worker_lib/parallel/parallelize.h"

namespace meshrun::worker::parallel::testing {
namespace {

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

int Train(bool fsdp, int steps) {
  auto world = ValueOrFail(InitProcessGroup("gloo"), "init");
  const int rank = world->rank();
  const int tp_size = fsdp ? 2 : world->size();
  const int dp_size = world->size() / tp_size;
  auto mesh = ValueOrFail(
      InitDeviceMesh(world, "cpu", {dp_size, tp_size}, {{"dp", "tp"}}), "mesh");
  ProcessGroupPtr tp = ValueOrFail(mesh.GetGroup("tp"), "tp group");
  ProcessGroupPtr dp = ValueOrFail(mesh.GetGroup("dp"), "dp group");
  if (rank == 0) CheckBadPlans(tp);
  const ModuleReference reference = TrainModuleReference(steps);

  Net net = MakeNet();
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
    at::Tensor loss = MseLoss(net->forward(DataShard(data.input, dp_size, dp_rank)),
                              DataShard(data.target, dp_size, dp_rank));
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
  app.add_flag("--fsdp", fsdp);
  app.add_option("--steps", steps);
  CLI11_PARSE(app, argc, argv);
  return meshrun::worker::parallel::testing::Train(fsdp, steps);
}
