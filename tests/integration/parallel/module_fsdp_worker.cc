// FullyShard on a user's own torch::nn::Module (fully_shard.h) under
// meshrun: module_net.h's residual MLP, each block a unit and the root one,
// trained with torch::optim::AdamW on model->parameters(). Every rank also
// trains the same model in one process on the whole batch and checks every
// step's loss (the mean over ranks of their rows' losses) and the gathered
// final parameters against it (rtol 1e-5), the shards' shapes and AdamW's
// state (shard-sized), and which gathered storage is alive after forward
// and after backward.
//
// --hsdp: on a (world / 2, 2) mesh, FullyShard over pairs of ranks and
// DistributedDataParallel across the pairs, every rank on its own rows.
//
//   meshrun --standalone --nproc-per-node=4 module_fsdp_worker
//   --reshard-after-forward=false

#include <CLI/CLI.hpp>
#include <cstdio>

#include "tests/integration/parallel/module_checks.h"
#include "tests/integration/parallel/module_net.h"
#include "worker_lib/mesh/device_mesh.h"
#include "worker_lib/mesh/process_group.h"
#include "worker_lib/parallel/ddp.h"
#include "worker_lib/parallel/fully_shard.h"
#include "worker_lib/parallel/sharding.h"

namespace meshrun::worker::parallel::testing {
namespace {

// Bytes of the parameters of `module` and below it.
size_t ParamBytes(const torch::nn::Module& module) {
  size_t total = 0;
  for (const auto& item : module.named_parameters()) total += item.value().nbytes();
  return total;
}

int Train(bool reshard, bool hsdp, int steps) {
  auto world = ValueOrFail(InitProcessGroup("gloo"), "init");
  // HSDP: shard over pairs of ranks, replicate across the pairs.
  const int shards = hsdp ? 2 : world->size();
  auto mesh = ValueOrFail(InitDeviceMesh(world, "cpu", {world->size() / shards, shards},
                                         {{"replicate", "fsdp"}}),
                          "mesh");
  ProcessGroupPtr group = ValueOrFail(mesh.GetGroup("fsdp"), "fsdp group");
  const int rank = world->rank();
  const int64_t parts = shards;
  const int shard_rank = group->getRank();
  const ModuleReference reference = TrainModuleReference(steps);

  Net net = MakeNet();
  // All parameters, and the root's own (in, norm, head): all that stays
  // gathered after forward with resharding.
  const size_t all_bytes = ParamBytes(*net);
  size_t root_bytes = all_bytes;
  for (const auto& block : *net->blocks) root_bytes -= ParamBytes(*block);
  for (const auto& block : *net->blocks) {
    CheckOk(FullyShard(*block, "fsdp", group, FsdpOptions{reshard}), "FullyShard(block)");
  }
  CheckOk(FullyShard(*net, "fsdp", group, FsdpOptions{reshard}), "FullyShard(root)");
  std::unique_ptr<DistributedDataParallel> replicate;
  if (hsdp) {
    replicate = ValueOrFail(DistributedDataParallel::Wrap(
                                *net, ValueOrFail(mesh.GetGroup("replicate"), "group")),
                            "Wrap over replicate");
  }

  // The registered parameters are the shards, padded to the first chunk's rows.
  for (const auto& item : net->named_parameters()) {
    const at::Tensor& full = reference.params.at(item.key());
    const int64_t padded = ChunkOf(full.size(0), parts, shard_rank).padded_size;
    if (item.value().size(0) != padded || !item.value().is_leaf()) {
      Fail(item.key() + ": registered " + c10::str(item.value().sizes()) +
           ", expected a leaf of " + std::to_string(padded) + " rows");
    }
  }
  if (rank == 0) {
    std::printf("SHARD blocks.0.fc1.weight %s\n",
                c10::str(net->named_parameters()["blocks.0.fc1.weight"].sizes()).c_str());
  }
  if (UnshardedBytes(*net) != 0) Fail("gathered storage alive before the first forward");

  torch::optim::AdamW optimizer(net->parameters(), Adam());
  for (int step = 0; step < steps; ++step) {
    Batch data = SyntheticBatch(kDataSeed, step, kBatch, kIn, kOut);
    optimizer.zero_grad();
    at::Tensor loss = MseLoss(Forward(net, DataShard(data.input, world->size(), rank)),
                              DataShard(data.target, world->size(), rank));
    const size_t after_forward = UnshardedBytes(*net);
    loss.backward();
    const size_t after_backward = UnshardedBytes(*net);
    optimizer.step();
    const double global = MeanOver(*world->group(), loss);
    ExpectClose("loss at step " + std::to_string(step), global, reference.losses[step]);
    if (rank == 0) {
      std::printf("step %d loss %.6f gathered after forward %zu after backward %zu\n",
                  step, global, after_forward, after_backward);
    }
    // Padding rows make the gathered bytes a little more than the model's.
    if (after_backward != 0) Fail("gathered storage alive after backward");
    if (reshard && (after_forward < root_bytes || after_forward >= all_bytes)) {
      Fail("after forward " + std::to_string(after_forward) +
           " bytes gathered; expected the root's, about " + std::to_string(root_bytes));
    }
    if (!reshard && after_forward < all_bytes) {
      Fail("after forward " + std::to_string(after_forward) +
           " bytes gathered; expected all of them, at least " +
           std::to_string(all_bytes));
    }
  }

  // AdamW's moments are the shards' size.
  for (const auto& param : net->parameters()) {
    auto& state = static_cast<torch::optim::AdamWParamState&>(
        *optimizer.state().at(param.unsafeGetTensorImpl()));
    if (!state.exp_avg().sizes().equals(param.sizes()))
      Fail("AdamW state is " + c10::str(state.exp_avg().sizes()) + ", not the shard's");
  }
  // The gathered final parameters equal the single-process ones.
  ExpectModuleParams(*net, reference.params);
  if (ShardedParams(*net).size() != reference.params.size())
    Fail("not every parameter is sharded");
  if (replicate != nullptr && rank == 0) {
    std::printf("REPLICATE %d buckets, %d all-reduced during the last backward\n",
                replicate->reducer().num_buckets(),
                replicate->reducer().buckets_started_in_backward());
  }
  const GatherCounts counts = CountGathers(*net);
  if (rank == 0)
    std::printf("GATHERS %d prefetched %d\n", counts.gathers, counts.prefetched);
  std::printf("DONE rank %d\n", rank);
  std::fflush(stdout);
  return 0;
}

}  // namespace
}  // namespace meshrun::worker::parallel::testing

int main(int argc, char** argv) {
  CLI::App app{"FullyShard on a torch::nn::Module against single-process training"};
  bool reshard = true;
  bool hsdp = false;
  int steps = 8;
  app.add_option("--reshard-after-forward", reshard);
  app.add_flag("--hsdp", hsdp);
  app.add_option("--steps", steps);
  CLI11_PARSE(app, argc, argv);
  return meshrun::worker::parallel::testing::Train(reshard, hsdp, steps);
}
