// The plain-libtorch GPT of worker_lib/examples/gpt.h trained under
// meshrun's parallelisms on torch::nn modules, against the same GPT trained
// in one process (AdamW, cross-entropy on SyntheticTokens): every step's
// loss and the final parameters within rtol 1e-5.
//
//   --layout tp        GptTpPlan over all ranks (which share the batch)
//   --layout fsdp_tp   GptTpPlan over pairs of ranks, FullyShard of every
//                      block and the root across them
//   --layout ddp       DistributedDataParallel over all ranks
//
//   meshrun --standalone --nproc-per-node=4 gpt_worker --layout fsdp_tp

#include <torch/optim/adamw.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <map>

#include "tests/integration/parallel/module_checks.h"
#include "tests/integration/parallel/parity_harness.h"
#include "worker_lib/device_mesh.h"
#include "worker_lib/examples/gpt.h"
#include "worker_lib/parallel/data.h"
#include "worker_lib/parallel/ddp.h"
#include "worker_lib/parallel/fully_shard.h"
#include "worker_lib/parallel/module_params.h"
#include "worker_lib/parallel/transformer.h"
#include "worker_lib/process_group.h"

namespace meshrun::worker::parallel::testing {
namespace {

using examples::Gpt;
using examples::GptConfig;

constexpr GptConfig kConfig{/*vocab=*/32, /*context=*/16, /*dim=*/32, /*heads=*/4,
                            /*layers=*/2};
constexpr int64_t kBatch = 8;
constexpr uint64_t kSeed = 5;

Gpt MakeGpt() {
  torch::manual_seed(kSeed);
  return Gpt(kConfig);
}

torch::optim::AdamWOptions Adam() {
  return torch::optim::AdamWOptions(3e-3).weight_decay(0.1);
}

at::Tensor Loss(Gpt& gpt, const at::Tensor& tokens, const at::Tensor& targets) {
  at::Tensor logits = gpt->forward(tokens);
  return at::cross_entropy_loss(logits.reshape({-1, kConfig.vocab}),
                                targets.reshape({-1}));
}

int Train(const std::string& layout, int steps) {
  auto world = ValueOrFail(InitProcessGroup("gloo"), "init");
  const int rank = world->rank();
  const int n = world->size();
  const int tp_size = layout == "tp" ? n : (layout == "fsdp_tp" ? 2 : 1);
  auto mesh = ValueOrFail(
      InitDeviceMesh(world, "cpu", {n / tp_size, tp_size}, {{"dp", "tp"}}), "mesh");
  ProcessGroupPtr dp = ValueOrFail(mesh.GetGroup("dp"), "dp group");

  std::vector<double> reference_losses;
  std::map<std::string, at::Tensor> reference_params;
  {
    Gpt gpt = MakeGpt();
    torch::optim::AdamW optimizer(gpt->parameters(), Adam());
    for (int step = 0; step < steps; ++step) {
      TokenBatch data =
          SyntheticTokens(kSeed, step, kBatch, kConfig.context, kConfig.vocab);
      optimizer.zero_grad();
      at::Tensor loss = Loss(gpt, data.tokens, data.targets);
      loss.backward();
      optimizer.step();
      reference_losses.push_back(loss.item<double>());
    }
    for (const auto& item : gpt->named_parameters())
      reference_params[item.key()] = item.value().detach().clone();
  }

  Gpt gpt = MakeGpt();
  if (tp_size > 1) {
    CheckOk(ParallelizeModule(*gpt, "tp", ValueOrFail(mesh.GetGroup("tp"), "tp group"),
                              examples::GptTpPlan()),
            "ParallelizeModule");
  }
  std::unique_ptr<DistributedDataParallel> ddp;
  if (layout == "fsdp_tp") {
    for (const auto& block : *gpt->blocks) CheckOk(FullyShard(*block, "dp", dp), "block");
    CheckOk(FullyShard(*gpt, "dp", dp), "root");
  } else if (layout == "ddp") {
    ddp = ValueOrFail(DistributedDataParallel::Wrap(*gpt, dp), "Wrap");
  } else if (layout != "tp") {
    Fail("unknown layout " + layout);
  }
  torch::optim::AdamW optimizer(gpt->parameters(), Adam());
  const int64_t dp_size = dp->getSize();
  for (int step = 0; step < steps; ++step) {
    TokenBatch data =
        SyntheticTokens(kSeed, step, kBatch, kConfig.context, kConfig.vocab);
    optimizer.zero_grad();
    at::Tensor loss = Loss(gpt, DataShard(data.tokens, dp_size, dp->getRank()),
                           DataShard(data.targets, dp_size, dp->getRank()));
    loss.backward();
    optimizer.step();
    const double global = MeanOver(*dp, loss);
    ExpectClose("loss at step " + std::to_string(step), global, reference_losses[step]);
    if (rank == 0) std::printf("step %d loss %.6f\n", step, global);
  }
  ExpectModuleParams(*gpt, reference_params);
  std::printf("DONE rank %d\n", rank);
  std::fflush(stdout);
  return 0;
}

}  // namespace
}  // namespace meshrun::worker::parallel::testing

int main(int argc, char** argv) {
  CLI::App app{"The torch::nn GPT under meshrun's parallelisms against one process"};
  std::string layout = "fsdp_tp";
  int steps = 8;
  app.add_option("--layout", layout);
  app.add_option("--steps", steps);
  CLI11_PARSE(app, argc, argv);
  return meshrun::worker::parallel::testing::Train(layout, steps);
}
