// DistributedDataParallel on a user's torch::nn::Module (ddp.h) under
// meshrun: module_net.h's residual MLP trained with AdamW on its own
// parameters, every rank on its rows of each global batch. Every rank checks
// every step's loss (the mean over ranks) and its final parameters against
// the same model trained in one process on the whole batch (rtol 1e-5), and
// that bucket all-reduces started during backward.
//
//   --rank-seeded        each rank initialises the model from its own seed:
//                        Wrap copies rank 0's values to all
//   --accumulate         two microbatches a step, the first under no_sync()
//   --mismatch           rank 1's model has another head shape: Wrap fails,
//                        and every rank prints its one-line error and exits 1
//
//   meshrun --standalone --nproc-per-node=4 module_ddp_worker --accumulate

#include <CLI/CLI.hpp>
#include <cstdio>

#include "tests/integration/parallel/module_checks.h"
#include "tests/integration/parallel/module_net.h"
#include "worker_lib/mesh/device_mesh.h"
#include "worker_lib/mesh/process_group.h"
#include "worker_lib/parallel/ddp.h"

namespace meshrun::worker::parallel::testing {
namespace {

struct Flags {
  int steps = 8;
  bool rank_seeded = false;
  bool accumulate = false;
  bool mismatch = false;
};

int Train(const Flags& flags) {
  auto world = ValueOrFail(InitProcessGroup("gloo"), "init");
  auto mesh =
      ValueOrFail(InitDeviceMesh(world, "cpu", {world->size()}, {{"dp"}}), "mesh");
  ProcessGroupPtr group = ValueOrFail(mesh.GetGroup("dp"), "dp group");
  const int rank = world->rank();
  const int64_t parts = world->size();
  const ModuleReference reference = TrainModuleReference(flags.steps);

  Net net =
      MakeNet(flags.rank_seeded ? kModelSeed + static_cast<uint64_t>(rank) : kModelSeed,
              flags.mismatch && rank == 1 ? kOut + 1 : kOut);
  // 4 KiB buckets: several, so that all-reduces overlap backward.
  absl::StatusOr<std::unique_ptr<DistributedDataParallel>> ddp =
      DistributedDataParallel::Wrap(*net, group, DdpOptions{4096, 1024});
  if (!ddp.ok()) {
    std::fprintf(stderr, "WRAP rank %d: %s\n", rank, ddp.status().ToString().c_str());
    return 1;
  }
  if (flags.mismatch) Fail("Wrap accepted a model whose head differs on rank 1");
  torch::optim::AdamW optimizer(net->parameters(), Adam());
  for (int step = 0; step < flags.steps; ++step) {
    Batch data = SyntheticBatch(kDataSeed, step, kBatch, kIn, kOut);
    at::Tensor input = DataShard(data.input, parts, rank);
    at::Tensor target = DataShard(data.target, parts, rank);
    optimizer.zero_grad();
    at::Tensor loss;
    if (flags.accumulate) {
      const int64_t half = input.size(0) / 2;
      {
        auto no_sync = (*ddp)->no_sync();
        loss =
            MseLoss(Forward(net, input.narrow(0, 0, half)), target.narrow(0, 0, half)) /
            2;
        loss.backward();
      }
      at::Tensor second = MseLoss(Forward(net, input.narrow(0, half, half)),
                                  target.narrow(0, half, half)) /
                          2;
      second.backward();
      loss = loss.detach() + second.detach();
    } else {
      loss = MseLoss(Forward(net, input), target);
      loss.backward();
    }
    if ((*ddp)->reducer().buckets_started_in_backward() == 0)
      Fail("no bucket's all-reduce started during backward");
    optimizer.step();
    const double global = MeanOver(*group, loss);
    ExpectClose("loss at step " + std::to_string(step), global, reference.losses[step]);
    if (rank == 0) std::printf("step %d loss %.6f\n", step, global);
  }
  ExpectModuleParams(*net, reference.params);
  if (rank == 0) {
    std::printf("BUCKETS %d, %d started during the last backward\n",
                (*ddp)->reducer().num_buckets(),
                (*ddp)->reducer().buckets_started_in_backward());
  }
  std::printf("DONE rank %d\n", rank);
  std::fflush(stdout);
  return 0;
}

}  // namespace
}  // namespace meshrun::worker::parallel::testing

int main(int argc, char** argv) {
  CLI::App app{"DistributedDataParallel on a torch::nn::Module against one process"};
  meshrun::worker::parallel::testing::Flags flags;
  app.add_option("--steps", flags.steps);
  app.add_flag("--rank-seeded", flags.rank_seeded);
  app.add_flag("--accumulate", flags.accumulate);
  app.add_flag("--mismatch", flags.mismatch);
  CLI11_PARSE(app, argc, argv);
  return meshrun::worker::parallel::testing::Train(flags);
}
