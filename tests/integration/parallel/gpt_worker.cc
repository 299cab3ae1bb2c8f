// The plain-libtorch GPT of worker_lib/models/gpt.h trained under every
// layout of meshrun's parallelisms on torch::nn modules, against the same GPT
// trained in one process on the same device (AdamW, cross-entropy on
// SyntheticTokens): every step's loss and the final parameters within rtol
// 1e-5. Any world size runs every layout, 1 included (each parallelism then
// over groups of one, as the GPU check does on its one GPU):
//
//   ddp             DistributedDataParallel over all ranks
//   fsdp            FullyShard of every block and the root over all ranks
//   fsdp_noreshard  the same, reshard_after_forward off
//   hsdp            FullyShard over pairs of ranks, DDP across the pairs
//   tp              GptTpPlan over all ranks (which share the batch)
//   fsdp_tp         GptTpPlan over pairs of ranks, FullyShard across them
//                   (with TP the head is column-wise too and the loss is
//                   LossParallel of its vocabulary slices, as PyTorch's
//                   loss_parallel)
//   pp_gpipe, pp_1f1b, pp_interleaved
//                   pipeline stages over all ranks (two chunks a rank for
//                   interleaved): [embeddings], [block i]..., [ln_f, head]
//                   cut into contiguous stages
//   dp_tp_pp        GptTpPlan over pairs, then 1F1B stages over pairs of
//                   those, each stage in DDP across the rest (8 ranks: 2x2x2)
//
// --device cuda: the GPU of LOCAL_RANK over NCCL (scripts/device-check.sh).
//
// Parity with PyTorch (tests/parity/parity.py, model gpt): --data FILE (the
// batches, batch_file.h), --init DIR (initial weights, a SaveModule
// checkpoint; --save-init DIR writes one from the seed and stops), --out DIR
// (each step's loss on rank 0 and the final parameters by the GPT's names,
// from the first rank of each pipeline stage, as tests/parity/torch_gpt.py
// writes them), --microbatches, and the GPT's sizes. --time-steps times each
// step instead, with no single-process run or check (bench_layouts.py).
//
//   meshrun --standalone --nproc-per-node=4 gpt_worker --layout fsdp_tp

#include <torch/optim/adamw.h>
#include <torch/serialize.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>

#include "examples/cpp/memory_usage.h"
#include "tests/integration/parallel/module_checks.h"
#include "tests/integration/parallel/parity_harness.h"
#include "worker_lib/data/batch_file.h"
#include "worker_lib/data/data.h"
#include "worker_lib/mesh/process_group.h"
#include "worker_lib/models/gpt.h"
#include "worker_lib/training/module_checkpoint.h"
#include "worker_lib/training/module_trainer.h"

namespace meshrun::worker::parallel::testing {
namespace {

using models::Gpt;
using models::GptBlockImpl;
using models::GptConfig;

constexpr int64_t kBatch = 8;
constexpr uint64_t kSeed = 5;

struct Flags {
  std::string layout = "fsdp_tp";
  int steps = 8;
  int microbatches = 4;
  GptConfig config{/*vocab=*/32, /*context=*/16, /*dim=*/32, /*heads=*/4, /*layers=*/2};
  std::string data, init, save_init, out;
  // Time the steps instead of checking them against one process.
  bool time_steps = false;
  // First print what ModuleTrainer refuses (REFUSED lines on rank 0).
  bool refusals = false;
};

std::unique_ptr<torch::optim::Optimizer> MakeAdamW(std::vector<at::Tensor> params) {
  return std::make_unique<torch::optim::AdamW>(
      std::move(params), torch::optim::AdamWOptions(3e-3).weight_decay(0.1));
}

// Layouts ModuleTrainer::Create must refuse, before any collective: one
// that does not fit the world, and more pipeline stages than the GPT has
// parts.
void PrintRefusals(const std::shared_ptr<World>& world, const Flags& flags, int rank) {
  ModuleLayout too_big;
  too_big.dp = world->size() + 1;
  ModuleLayout too_many_stages;
  too_many_stages.pp = world->size();
  too_many_stages.pipeline = true;
  too_many_stages.schedule = Schedule::kInterleaved1F1B;
  too_many_stages.microbatches = too_many_stages.pp;
  too_many_stages.virtual_stages = static_cast<int>(flags.config.layers) + 3;
  for (const ModuleLayout& layout : {too_big, too_many_stages}) {
    torch::manual_seed(kSeed);
    Gpt gpt(flags.config);
    auto trainer =
        ModuleTrainer::Create(world, layout, models::GptModel(gpt, false), MakeAdamW);
    if (trainer.ok()) Fail("ModuleTrainer took " + layout.ToString());
    if (rank == 0) std::printf("REFUSED %s\n", trainer.status().ToString().c_str());
  }
}

// The run's model and batches: the flags', on the worker's device.
struct Setup {
  GptConfig config;
  at::Device device;
  std::string init;
  std::vector<InputTarget> batches;  // --data; else SyntheticTokens
};

Gpt MakeGpt(const Setup& setup) {
  torch::manual_seed(kSeed);
  Gpt gpt(setup.config);
  if (!setup.init.empty()) CheckOk(LoadModule(setup.init, *gpt), "--init");
  gpt->to(setup.device);
  return gpt;
}

TokenBatch BatchOf(const Setup& setup, int step) {
  if (!setup.batches.empty()) {
    if (step >= static_cast<int>(setup.batches.size()))
      Fail("--data has too few batches");
    const InputTarget& batch = setup.batches[static_cast<size_t>(step)];
    return {batch.first.to(setup.device), batch.second.to(setup.device)};
  }
  const GptConfig& c = setup.config;
  TokenBatch data = SyntheticTokens(kSeed, step, kBatch, c.context, c.vocab);
  return {data.tokens.to(setup.device), data.targets.to(setup.device)};
}

// The trainer's layout for `layout` on n ranks (parallelisms over groups of
// one at world 1).
ModuleLayout LayoutOf(const std::string& layout, int n, const Flags& flags,
                      const WorkerDevice& on) {
  const int pair = std::min(2, n);
  ModuleLayout l;
  l.device_type = on.mesh_type;
  l.microbatches = flags.microbatches;
  if (layout == "ddp") {
    l.dp = n;
    l.replicate = true;
  } else if (layout == "fsdp" || layout == "fsdp_noreshard") {
    l.fsdp = n;
    l.fully_shard = true;
    l.reshard_after_forward = layout == "fsdp";
  } else if (layout == "hsdp") {
    l.dp = n / pair;
    l.fsdp = pair;
    l.fully_shard = l.replicate = true;
  } else if (layout == "tp") {
    l.tp = n;
    l.tensor_parallel = true;
  } else if (layout == "fsdp_tp") {
    l.fsdp = n / pair;
    l.tp = pair;
    l.fully_shard = l.tensor_parallel = true;
  } else if (layout == "pp_gpipe" || layout == "pp_1f1b" || layout == "pp_interleaved") {
    l.pp = n;
    l.pipeline = true;
    l.schedule = layout == "pp_gpipe"  ? Schedule::kGPipe
                 : layout == "pp_1f1b" ? Schedule::kOneFOneB
                                       : Schedule::kInterleaved1F1B;
    l.virtual_stages = layout == "pp_interleaved" ? 2 : 1;
  } else if (layout == "dp_tp_pp") {
    l.tp = pair;
    l.pp = std::min(2, n / pair);
    l.dp = n / (pair * l.pp);
    l.tensor_parallel = l.pipeline = l.replicate = true;
  } else {
    Fail("unknown layout " + layout);
  }
  return l;
}

struct Reference {
  std::vector<double> losses;
  std::map<std::string, at::Tensor> params;
};

Reference TrainReference(const Setup& setup, int steps) {
  Reference reference;
  Gpt gpt = MakeGpt(setup);
  std::unique_ptr<torch::optim::Optimizer> optimizer = MakeAdamW(gpt->parameters());
  for (int step = 0; step < steps; ++step) {
    TokenBatch data = BatchOf(setup, step);
    optimizer->zero_grad();
    at::Tensor loss = models::GptLoss(Forward(gpt, data.tokens), data.targets);
    loss.backward();
    optimizer->step();
    reference.losses.push_back(loss.item<double>());
  }
  for (const auto& item : gpt->named_parameters())
    reference.params[item.key()] = item.value().detach().clone();
  return reference;
}

// --out: DIR/cpp-rank<R>.pt, a pickled {"params": {name: tensor}} (and
// "losses" on rank 0), which Python's torch.load reads.
void WriteOut(const std::string& dir, int rank,
              const std::map<std::string, at::Tensor>& params,
              const std::vector<double>& losses) {
  c10::Dict<std::string, at::Tensor> named;
  for (const auto& [name, tensor] : params) named.insert(name, tensor);
  c10::impl::GenericDict root(c10::StringType::get(), c10::AnyType::get());
  root.insert("params", named);
  if (rank == 0) root.insert("losses", c10::List<double>(losses));
  std::filesystem::create_directories(dir);
  const std::vector<char> bytes = torch::pickle_save(c10::IValue(root));
  std::ofstream file(dir + "/cpp-rank" + std::to_string(rank) + ".pt", std::ios::binary);
  file.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!file) Fail("cannot write --out " + dir);
}

int Train(const Flags& flags, const WorkerDevice& on) {
  const std::string& layout = flags.layout;
  const int steps = flags.steps;
  Setup setup{flags.config, on.device, flags.init, {}};
  if (!flags.data.empty())
    setup.batches = ValueOrFail(ReadBatchFile(flags.data), "--data");
  if (!flags.save_init.empty()) {
    torch::manual_seed(kSeed);
    CheckOk(SaveModule(flags.save_init, "init", *Gpt(flags.config)), "--save-init");
    return 0;
  }
  auto world = ValueOrFail(InitProcessGroup(on.backend), "init");
  const int rank = world->rank();
  if (flags.refusals) PrintRefusals(world, flags, rank);
  const ModuleLayout trainer_layout = LayoutOf(layout, world->size(), flags, on);
  // --time-steps: no single-process reference (its time and memory are
  // not the layout's).
  const Reference reference =
      flags.time_steps ? Reference{} : TrainReference(setup, steps);
  const double rss_before_model = examples::RssMb();

  Gpt gpt = MakeGpt(setup);
  auto trainer =
      ValueOrFail(ModuleTrainer::Create(
                      world, trainer_layout,
                      models::GptModel(gpt, /*vocab_parallel_head=*/true), MakeAdamW),
                  "ModuleTrainer");
  if (rank == 0) {
    std::printf("LAYOUT %s\n", trainer_layout.ToString().c_str());
    if (trainer->stage())
      std::printf("STAGES %s\n", trainer->stage()->Describe().c_str());
  }

  std::vector<double> losses;
  examples::StepClock clock;
  for (int step = 0; step < steps; ++step) {
    const TokenBatch data = BatchOf(setup, step);
    // As train_example --time-steps: from a barrier to the step's global loss.
    if (flags.time_steps) world->group()->barrier()->wait();
    clock.Start();
    const double global = ValueOrFail(trainer->Step(data.tokens, data.targets), "step");
    clock.Stop();
    if (!flags.time_steps)
      ExpectClose("loss at step " + std::to_string(step), global, reference.losses[step]);
    losses.push_back(global);
    if (rank == 0) std::printf("step %d loss %.9g\n", step, global);
  }
  if (flags.time_steps) {
    const std::string line =
        examples::StepTimingLine(*world->group(), clock, rss_before_model);
    if (rank == 0) std::printf("%s\n", line.c_str());
    return 0;
  }
  const std::map<std::string, at::Tensor> final_params = trainer->FullParams();
  if (final_params.size() !=
      (trainer->stage() ? trainer->stage()->Leaves().size() : reference.params.size()))
    Fail("a trained parameter is not the GPT's");
  for (const auto& [name, value] : final_params)
    ExpectClose("final " + name, value, reference.params.at(name).cpu());
  // The first rank of each stage's (dp, fsdp, tp) group writes its stage's.
  if (!flags.out.empty() && trainer->group("dp")->getRank() == 0 &&
      trainer->group("fsdp")->getRank() == 0 && trainer->group("tp")->getRank() == 0)
    WriteOut(flags.out, rank, final_params, losses);
  std::printf("DONE rank %d layout %s device %s\n", rank, layout.c_str(),
              on.device.str().c_str());
  std::fflush(stdout);
  return 0;
}

}  // namespace
}  // namespace meshrun::worker::parallel::testing

int main(int argc, char** argv) {
  using namespace meshrun::worker::parallel::testing;
  CLI::App app{"The torch::nn GPT under meshrun's parallelisms against one process"};
  Flags flags;
  std::string device = "cpu";
  app.add_option("--layout", flags.layout);
  app.add_flag("--refusals", flags.refusals,
               "first print the layouts ModuleTrainer refuses (rank 0)");
  app.add_option("--steps", flags.steps);
  app.add_option("--device", device, "cpu (Gloo) or cuda (NCCL, the GPU of LOCAL_RANK)");
  app.add_option("--microbatches", flags.microbatches);
  app.add_option("--vocab", flags.config.vocab);
  app.add_option("--context", flags.config.context);
  app.add_option("--dim", flags.config.dim);
  app.add_option("--heads", flags.config.heads);
  app.add_option("--layers", flags.config.layers);
  app.add_option("--data", flags.data,
                 "batches (batch_file.h) instead of SyntheticTokens");
  app.add_option("--init", flags.init, "initial weights (a SaveModule checkpoint)");
  app.add_option("--save-init", flags.save_init,
                 "write the initial weights here and stop");
  app.add_option("--out", flags.out,
                 "write each step's loss and the final parameters here");
  app.add_flag("--time-steps", flags.time_steps,
               "time each step (no single-process check) and print a timing line");
  CLI11_PARSE(app, argc, argv);
  return Train(flags, ParseWorkerDevice(device));
}
