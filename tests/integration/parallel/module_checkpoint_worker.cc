// Sharded checkpoints of a user's torch::nn::Module and its AdamW state
// (module_checkpoint.h) across layouts, under meshrun: module_net.h's MLP
// trained for steps [--from, --to) in --layout, after loading --load (saved
// by another layout) and before saving --save. Every rank checks each
// step's loss against the same model trained in one process from step 0
// (rtol 1e-5): right after a load only if the parameters and AdamW's
// moments and step came back; at the last step also the final parameters.
//
//   meshrun --standalone --nproc-per-node=4 module_checkpoint_worker
//       --layout fsdp_tp --to 4 --save DIR
//   meshrun --standalone --nproc-per-node=2 module_checkpoint_worker
//       --layout fsdp --from 4 --to 8 --load DIR
//
// Layouts: single (one rank), ddp, fsdp (every block and the root), tp
// (fc1 column-, fc2 row-wise over all ranks, which share the batch),
// fsdp_tp (TP over pairs of ranks, FSDP across them).

#include <CLI/CLI.hpp>
#include <cstdio>

#include "tests/integration/parallel/module_checks.h"
#include "tests/integration/parallel/module_net.h"
#include "worker_lib/mesh/device_mesh.h"
#include "worker_lib/mesh/process_group.h"
#include "worker_lib/parallel/ddp.h"
#include "worker_lib/parallel/fully_shard.h"
#include "worker_lib/parallel/parallelize.h"
#include "worker_lib/training/module_checkpoint.h"

namespace meshrun::worker::parallel::testing {
namespace {

struct Flags {
  std::string layout = "fsdp";
  int from = 0;
  int to = 8;
  std::string load;
  std::string save;
};

int Train(const Flags& flags) {
  auto world = ValueOrFail(InitProcessGroup("gloo"), "init");
  const int rank = world->rank();
  const int n = world->size();
  const bool tp_layout = flags.layout == "tp" || flags.layout == "fsdp_tp";
  const int tp_size = flags.layout == "tp" ? n : (flags.layout == "fsdp_tp" ? 2 : 1);
  auto mesh = ValueOrFail(
      InitDeviceMesh(world, "cpu", {n / tp_size, tp_size}, {{"dp", "tp"}}), "mesh");
  ProcessGroupPtr dp = ValueOrFail(mesh.GetGroup("dp"), "dp group");
  const ModuleReference reference = TrainModuleReference(flags.to);

  // Loading, start from other values: the load must bring the saved ones.
  Net net = MakeNet(flags.load.empty() ? kModelSeed : kModelSeed + 100);
  if (tp_layout) {
    CheckOk(ParallelizeModule(*net, "tp", ValueOrFail(mesh.GetGroup("tp"), "tp group"),
                              {{"blocks.*.fc1", ColwiseParallel()},
                               {"blocks.*.fc2", RowwiseParallel()}}),
            "ParallelizeModule");
  }
  std::unique_ptr<DistributedDataParallel> ddp;
  if (flags.layout == "fsdp" || flags.layout == "fsdp_tp") {
    for (const auto& block : *net->blocks) CheckOk(FullyShard(*block, "dp", dp), "block");
    CheckOk(FullyShard(*net, "dp", dp), "root");
  } else if (flags.layout == "ddp") {
    ddp = ValueOrFail(DistributedDataParallel::Wrap(*net, dp), "Wrap");
  } else if (flags.layout != "single" && flags.layout != "tp") {
    Fail("unknown layout " + flags.layout);
  }
  torch::optim::AdamW optimizer(net->parameters(), Adam());
  if (!flags.load.empty()) {
    CheckOk(LoadModule(flags.load, *net, &optimizer), "LoadModule");
  } else if (flags.from != 0) {
    Fail("--from needs --load");
  }

  const int64_t dp_size = dp->getSize();
  const int64_t dp_rank = dp->getRank();
  for (int step = flags.from; step < flags.to; ++step) {
    Batch data = SyntheticBatch(kDataSeed, step, kBatch, kIn, kOut);
    optimizer.zero_grad();
    at::Tensor loss = MseLoss(Forward(net, DataShard(data.input, dp_size, dp_rank)),
                              DataShard(data.target, dp_size, dp_rank));
    loss.backward();
    optimizer.step();
    const double global = MeanOver(*dp, loss);
    ExpectClose("loss at step " + std::to_string(step), global, reference.losses[step]);
    if (rank == 0) std::printf("step %d loss %.6f\n", step, global);
  }
  if (!flags.save.empty()) {
    CheckOk(SaveModule(flags.save, "rank-" + std::to_string(rank), *net, &optimizer),
            "save");
  }
  if (flags.to == static_cast<int>(reference.losses.size())) {
    ExpectModuleParams(*net, reference.params);
  }
  world->group()->barrier()->wait();
  std::printf("DONE rank %d\n", rank);
  std::fflush(stdout);
  return 0;
}

}  // namespace
}  // namespace meshrun::worker::parallel::testing

int main(int argc, char** argv) {
  CLI::App app{"Module checkpoints across layouts against one process"};
  meshrun::worker::parallel::testing::Flags flags;
  app.add_option("--layout", flags.layout);
  app.add_option("--from", flags.from);
  app.add_option("--to", flags.to);
  app.add_option("--load", flags.load);
  app.add_option("--save", flags.save);
  CLI11_PARSE(app, argc, argv);
  return meshrun::worker::parallel::testing::Train(flags);
}
