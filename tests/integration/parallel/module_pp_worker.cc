// Pipeline stages of a user's torch::nn::Module (pp.h, MakeStage of
// torch::nn::AnyModule) under meshrun: module_net.h's residual MLP built
// whole on every rank, each rank's stages holding their part of it (as
// TorchTitan cuts a model), trained with AdamW under GPipe, 1F1B or
// interleaved 1F1B. Every rank checks every step's loss and its stages'
// final parameters against the same model trained in one process (rtol
// 1e-5).
//
//   meshrun --standalone --nproc-per-node=2 module_pp_worker --schedule 1f1b
//   meshrun --standalone --nproc-per-node=8 module_pp_worker --dp 2 --tp 2   # DP x TP x
//   PP
//
// --dp D --tp T: a (D, world / (D T), T) mesh ["dp", "pp", "tp"]: the net's
// blocks tensor-parallel over tp (ParallelizeModule) before it is cut, each
// stage module in DistributedDataParallel over dp (no_sync over the
// schedule's backwards, SyncGradients after), each dp rank on its rows.
//
// Stages: the 5 parts [in], [block 0], [block 1], [block 2], [norm, head]
// spread over the stages in order: 2 stages take [in, block 0, block 1] and
// [block 2, norm, head]; 4 (2 ranks, 2 chunks each) take [in, block 0],
// [block 1], [block 2], [norm, head].

#include <torch/nn/modules/container/any.h>

#include <CLI/CLI.hpp>
#include <cstdio>

#include "tests/integration/parallel/module_checks.h"
#include "tests/integration/parallel/module_net.h"
#include "worker_lib/mesh/device_mesh.h"
#include "worker_lib/mesh/process_group.h"
#include "worker_lib/parallel/ddp.h"
#include "worker_lib/parallel/parallelize.h"
#include "worker_lib/parallel/pp.h"

namespace meshrun::worker::parallel::testing {
namespace {

constexpr int kMicrobatches = 4;

// A stage: consecutive parts of the whole Net, sharing its modules (and so
// its parameter names' tensors).
struct NetStageImpl : torch::nn::Module {
  NetStageImpl(const Net& net, int first_part, int last_part)
      : first(first_part), last(last_part) {
    for (int part = first; part <= last; ++part) {
      if (part == 0) register_module("in", net->in);
      if (part >= 1 && part <= kBlocks) {
        register_module("block" + std::to_string(part - 1), (*net->blocks)[part - 1]);
      }
      if (part == kBlocks + 1) {
        register_module("norm", net->norm);
        register_module("head", net->head);
      }
    }
    whole = net;
  }
  at::Tensor forward(at::Tensor x) {
    for (int part = first; part <= last; ++part) {
      if (part == 0) x = Forward(whole->in, x);
      if (part >= 1 && part <= kBlocks)
        x = Forward((*whole->blocks)[part - 1]->as<BlockImpl>(), x);
      if (part == kBlocks + 1) x = Forward(whole->head, whole->norm->forward(x));
    }
    return x;
  }
  int first, last;
  Net whole{nullptr};
};
TORCH_MODULE(NetStage);

Schedule ParseSchedule(const std::string& name) {
  if (name == "gpipe") return Schedule::kGPipe;
  if (name == "1f1b") return Schedule::kOneFOneB;
  if (name == "interleaved") return Schedule::kInterleaved1F1B;
  Fail("unknown schedule " + name);
}

int Train(const std::string& schedule_name, int steps, int dp_size, int tp_size) {
  auto world = ValueOrFail(InitProcessGroup("gloo"), "init");
  const int pp_size = world->size() / (dp_size * tp_size);
  auto mesh = ValueOrFail(
      InitDeviceMesh(world, "cpu", {dp_size, pp_size, tp_size}, {{"dp", "pp", "tp"}}),
      "mesh");
  ProcessGroupPtr pp = ValueOrFail(mesh.GetGroup("pp"), "pp group");
  ProcessGroupPtr dp = ValueOrFail(mesh.GetGroup("dp"), "dp group");
  const int rank = world->rank();
  const int pp_rank = pp->getRank();
  const Schedule schedule = ParseSchedule(schedule_name);
  const int chunks = schedule == Schedule::kInterleaved1F1B ? 2 : 1;
  const int num_stages = pp_size * chunks;
  if (num_stages != 2 && num_stages != 4)
    Fail("this test cuts the net into 2 or 4 stages");
  // [first, last] part of each global stage.
  const std::vector<std::pair<int, int>> parts =
      num_stages == 2 ? std::vector<std::pair<int, int>>{{0, 2}, {3, 4}}
                      : std::vector<std::pair<int, int>>{{0, 1}, {2, 2}, {3, 3}, {4, 4}};
  const ModuleReference reference = TrainModuleReference(steps);

  Net net = MakeNet();
  if (tp_size > 1) {
    CheckOk(ParallelizeModule(*net, "tp", ValueOrFail(mesh.GetGroup("tp"), "tp group"),
                              {{"blocks.*.fc1", ColwiseParallel()},
                               {"blocks.*.fc2", RowwiseParallel()}}),
            "ParallelizeModule");
  }
  std::vector<torch::nn::AnyModule> modules;
  std::vector<NetStage> mine;
  std::vector<std::unique_ptr<DistributedDataParallel>> replicas;
  for (int c = 0; c < chunks; ++c) {
    const auto [first, last] = parts[static_cast<size_t>(c * pp_size + pp_rank)];
    mine.push_back(NetStage(net, first, last));
    modules.emplace_back(mine.back());
    if (dp_size > 1)
      replicas.push_back(
          ValueOrFail(DistributedDataParallel::Wrap(*mine.back(), dp), "Wrap"));
  }
  PipelineStage stage = ValueOrFail(MakeStage(std::move(modules), pp), "MakeStage");
  std::printf("STAGES rank %d: %s, %zu parameters\n", rank, stage.Describe().c_str(),
              stage.Leaves().size());
  torch::optim::AdamW optimizer(stage.Leaves(), Adam());
  for (int step = 0; step < steps; ++step) {
    Batch data = SyntheticBatch(kDataSeed, step, kBatch, kIn, kOut);
    optimizer.zero_grad();
    double loss = 0;
    {
      // A backward per microbatch: DDP averages once, after the schedule.
      std::vector<DistributedDataParallel::NoSync> no_sync;
      for (auto& replica : replicas) no_sync.push_back(replica->no_sync());
      loss = ValueOrFail(RunStep(stage, schedule, kMicrobatches,
                                 DataShard(data.input, dp_size, dp->getRank()),
                                 DataShard(data.target, dp_size, dp->getRank()), MseLoss),
                         "step");
    }
    for (auto& replica : replicas) replica->SyncGradients();
    optimizer.step();
    loss = MeanOver(*dp, at::tensor(loss));
    ExpectClose("loss at step " + std::to_string(step), loss, reference.losses[step]);
    if (rank == 0) std::printf("step %d loss %.6f\n", step, loss);
  }
  // This rank's stages' parameters, by the whole net's names.
  size_t checked = 0;
  for (const auto& item : net->named_parameters()) {
    for (const at::Tensor& leaf : stage.Leaves()) {
      if (!leaf.is_same(item.value())) continue;
      const std::shared_ptr<Param> sharded = ParamOf(item.value());
      ExpectClose("final " + item.key(), sharded ? FullTensor(*sharded) : item.value(),
                  reference.params.at(item.key()));
      ++checked;
    }
  }
  if (checked != stage.Leaves().size()) Fail("a stage parameter is not the net's");
  std::printf("DONE rank %d\n", rank);
  std::fflush(stdout);
  return 0;
}

}  // namespace
}  // namespace meshrun::worker::parallel::testing

int main(int argc, char** argv) {
  CLI::App app{"Pipeline stages of a torch::nn::Module against one process"};
  std::string schedule = "1f1b";
  int steps = 8;
  int dp = 1;
  int tp = 1;
  app.add_option("--schedule", schedule);
  app.add_option("--steps", steps);
  app.add_option("--dp", dp, "DistributedDataParallel replicas of each stage");
  app.add_option("--tp", tp, "tensor-parallel ranks of each stage");
  CLI11_PARSE(app, argc, argv);
  return meshrun::worker::parallel::testing::Train(schedule, steps, dp, tp);
}
