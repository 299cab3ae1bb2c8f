// The plain-libtorch GPT of worker_lib/examples/gpt.h trained under every
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

#include <torch/nn/modules/container/any.h>
#include <torch/optim/adamw.h>
#include <torch/serialize.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>

#include "tests/integration/parallel/module_checks.h"
#include "tests/integration/parallel/parity_harness.h"
#include "worker_lib/device_mesh.h"
#include "worker_lib/examples/gpt.h"
#include "worker_lib/examples/memory_usage.h"
#include "worker_lib/parallel/batch_file.h"
#include "worker_lib/parallel/data.h"
#include "worker_lib/parallel/ddp.h"
#include "worker_lib/parallel/fully_shard.h"
#include "worker_lib/parallel/module_checkpoint.h"
#include "worker_lib/parallel/module_params.h"
#include "worker_lib/parallel/pp.h"
#include "worker_lib/parallel/transformer.h"
#include "worker_lib/process_group.h"

namespace meshrun::worker::parallel::testing {
namespace {

using examples::Gpt;
using examples::GptBlockImpl;
using examples::GptConfig;

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
};

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

torch::optim::AdamWOptions Adam() {
  return torch::optim::AdamWOptions(3e-3).weight_decay(0.1);
}

at::Tensor CrossEntropy(const at::Tensor& logits, const at::Tensor& targets) {
  return at::cross_entropy_loss(logits.flatten(0, 1), targets.flatten());
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

// The mesh's sizes for `layout` on n ranks.
struct Sizes {
  int dp = 1, fsdp = 1, pp = 1, tp = 1;
};
Sizes LayoutSizes(const std::string& layout, int n) {
  const int pair = std::min(2, n);
  if (layout == "ddp") return {n, 1, 1, 1};
  if (layout == "fsdp" || layout == "fsdp_noreshard") return {1, n, 1, 1};
  if (layout == "hsdp") return {n / pair, pair, 1, 1};
  if (layout == "tp") return {1, 1, 1, n};
  if (layout == "fsdp_tp") return {1, n / pair, 1, pair};
  if (layout.rfind("pp_", 0) == 0) return {1, 1, n, 1};
  if (layout == "dp_tp_pp") {
    const int pp = std::min(2, n / pair);
    return {n / (pair * pp), 1, pp, pair};
  }
  Fail("unknown layout " + layout);
}

// A pipeline stage: parts [first, last] of the whole GPT, sharing its modules
// (part 0 the embeddings, 1..layers the blocks, layers + 1 the final norm and
// head).
struct GptStageImpl : torch::nn::Module {
  GptStageImpl(const Gpt& gpt, int first_part, int last_part)
      : first(first_part), last(last_part), whole(gpt) {
    const int layers = static_cast<int>(gpt->blocks->size());
    for (int part = first; part <= last; ++part) {
      if (part == 0) {
        register_module("tok", gpt->tok);
        register_module("pos", gpt->pos);
      } else if (part <= layers) {
        register_module("block" + std::to_string(part - 1), (*gpt->blocks)[part - 1]);
      } else {
        register_module("ln_f", gpt->ln_f);
        register_module("head", gpt->head);
      }
    }
  }
  at::Tensor forward(at::Tensor x) {
    const int layers = static_cast<int>(whole->blocks->size());
    for (int part = first; part <= last; ++part) {
      if (part == 0) {
        x = whole->tok->forward(x) +
            whole->pos->forward(at::arange(x.size(1), x.options()));
      } else if (part <= layers) {
        x = (*whole->blocks)[part - 1]->as<GptBlockImpl>()->forward(x);
      } else {
        x = whole->head->forward(whole->ln_f->forward(x));
      }
    }
    return x;
  }
  int first, last;
  Gpt whole{nullptr};
};
TORCH_MODULE(GptStage);

// The parts [first, last] of each of `stages` stages, as even as they go.
std::vector<std::pair<int, int>> CutParts(int parts, int stages) {
  if (stages > parts) Fail("more pipeline stages than the GPT's parts");
  std::vector<std::pair<int, int>> cut;
  int first = 0;
  for (int s = 0; s < stages; ++s) {
    const int count = parts / stages + (s < parts % stages ? 1 : 0);
    cut.emplace_back(first, first + count - 1);
    first += count;
  }
  return cut;
}

struct Reference {
  std::vector<double> losses;
  std::map<std::string, at::Tensor> params;
};

Reference TrainReference(const Setup& setup, int steps) {
  Reference reference;
  Gpt gpt = MakeGpt(setup);
  torch::optim::AdamW optimizer(gpt->parameters(), Adam());
  for (int step = 0; step < steps; ++step) {
    TokenBatch data = BatchOf(setup, step);
    optimizer.zero_grad();
    at::Tensor loss = CrossEntropy(gpt->forward(data.tokens), data.targets);
    loss.backward();
    optimizer.step();
    reference.losses.push_back(loss.item<double>());
  }
  for (const auto& item : gpt->named_parameters())
    reference.params[item.key()] = item.value().detach().clone();
  return reference;
}

// The full values of the parameters this rank trains (its stages' when
// pipelined), by the whole GPT's names. Collective over their groups.
std::map<std::string, at::Tensor> FinalParams(const Gpt& gpt,
                                              const std::optional<PipelineStage>& stage) {
  std::map<std::string, at::Tensor> full;
  const std::vector<at::Tensor> leaves =
      stage ? stage->Leaves() : std::vector<at::Tensor>{};
  for (const auto& item : gpt->named_parameters()) {
    if (stage && std::none_of(leaves.begin(), leaves.end(), [&](const at::Tensor& leaf) {
          return leaf.is_same(item.value());
        }))
      continue;
    const std::shared_ptr<Param> param = ParamOf(item.value());
    full[item.key()] = (param ? FullTensor(*param) : item.value()).detach().cpu();
  }
  return full;
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
  const Sizes sizes = LayoutSizes(layout, world->size());
  auto mesh = ValueOrFail(
      InitDeviceMesh(world, on.mesh_type, {sizes.dp, sizes.fsdp, sizes.pp, sizes.tp},
                     {{"dp", "fsdp", "pp", "tp"}}),
      "mesh");
  auto group = [&](const std::string& name) {
    return ValueOrFail(mesh.GetGroup(name), name + " group");
  };
  ProcessGroupPtr dp = group("dp"), fsdp = group("fsdp"), pp = group("pp");
  // Ranks on their own rows: dp x fsdp (tp and pp ranks share theirs).
  const int data_parts = sizes.dp * sizes.fsdp;
  const int data_index = dp->getRank() * sizes.fsdp + fsdp->getRank();
  // --time-steps: no single-process reference (its time and memory are
  // not the layout's).
  const Reference reference =
      flags.time_steps ? Reference{} : TrainReference(setup, steps);
  const double rss_before_model = examples::RssMb();

  Gpt gpt = MakeGpt(setup);
  const bool tp = layout == "tp" || layout == "fsdp_tp" || layout == "dp_tp_pp";
  const bool sharded = layout == "fsdp" || layout == "fsdp_noreshard" ||
                       layout == "hsdp" || layout == "fsdp_tp";
  const bool pipelined = layout.rfind("pp_", 0) == 0 || layout == "dp_tp_pp";
  // The loss of the logits a rank holds: its vocabulary slice under TP.
  LossFn loss_fn = CrossEntropy;
  if (tp) {
    CheckOk(ParallelizeModule(*gpt, "tp", group("tp"),
                              examples::GptTpPlan(/*vocab_parallel_head=*/true)),
            "TP");
    loss_fn = [tp_group = group("tp")](const at::Tensor& logits,
                                       const at::Tensor& targets) {
      return LossParallel(logits, targets, tp_group);
    };
  }
  if (sharded) {
    const FsdpOptions options{/*reshard_after_forward=*/layout != "fsdp_noreshard"};
    for (const auto& block : *gpt->blocks)
      CheckOk(FullyShard(*block, "fsdp", fsdp, options), "FullyShard(block)");
    CheckOk(FullyShard(*gpt, "fsdp", fsdp, options), "FullyShard(root)");
  }
  std::vector<std::unique_ptr<DistributedDataParallel>> replicas;
  if (layout == "ddp" || layout == "hsdp")
    replicas.push_back(ValueOrFail(DistributedDataParallel::Wrap(*gpt, dp), "Wrap"));

  std::optional<PipelineStage> stage;
  Schedule schedule = Schedule::kOneFOneB;
  if (pipelined) {
    if (layout == "pp_gpipe") schedule = Schedule::kGPipe;
    if (layout == "pp_interleaved") schedule = Schedule::kInterleaved1F1B;
    const int chunks = schedule == Schedule::kInterleaved1F1B ? 2 : 1;
    const auto parts =
        CutParts(static_cast<int>(flags.config.layers) + 2, sizes.pp * chunks);
    std::vector<torch::nn::AnyModule> modules;
    for (int c = 0; c < chunks; ++c) {
      const auto [first, last] = parts[static_cast<size_t>(c * sizes.pp + pp->getRank())];
      GptStage module(gpt, first, last);
      if (layout == "dp_tp_pp")
        replicas.push_back(
            ValueOrFail(DistributedDataParallel::Wrap(*module, dp), "Wrap"));
      modules.emplace_back(module);
    }
    stage = ValueOrFail(MakeStage(std::move(modules), pp), "MakeStage");
    if (rank == 0) std::printf("STAGES %s\n", stage->Describe().c_str());
  }

  torch::optim::AdamW optimizer(pipelined ? stage->Leaves() : gpt->parameters(), Adam());
  std::vector<double> losses, step_ms;
  for (int step = 0; step < steps; ++step) {
    const TokenBatch data = BatchOf(setup, step);
    const at::Tensor tokens = DataShard(data.tokens, data_parts, data_index);
    const at::Tensor targets = DataShard(data.targets, data_parts, data_index);
    // As train_example --time-steps: from a barrier to the step's global loss.
    if (flags.time_steps) world->group()->barrier()->wait();
    const auto start = std::chrono::steady_clock::now();
    optimizer.zero_grad();
    at::Tensor loss;
    if (pipelined) {
      // A backward per microbatch: DDP averages once, after the schedule.
      std::vector<DistributedDataParallel::NoSync> no_sync;
      for (auto& replica : replicas) no_sync.push_back(replica->no_sync());
      const double value = ValueOrFail(
          RunStep(*stage, schedule, flags.microbatches, tokens, targets, loss_fn),
          "step");
      loss = at::full({}, value, at::TensorOptions(at::kDouble).device(on.device));
    } else {
      loss = loss_fn(gpt->forward(tokens), targets);
      loss.backward();
    }
    if (pipelined) {
      for (auto& replica : replicas) replica->SyncGradients();
    }
    optimizer.step();
    // tp and pp ranks hold their rows' loss too: the world's mean is the
    // data ranks'.
    const double global = MeanOver(*world->group(), loss);
    step_ms.push_back(std::chrono::duration<double, std::milli>(
                          std::chrono::steady_clock::now() - start)
                          .count());
    if (!flags.time_steps)
      ExpectClose("loss at step " + std::to_string(step), global, reference.losses[step]);
    losses.push_back(global);
    if (rank == 0) std::printf("step %d loss %.9g\n", step, global);
  }
  if (flags.time_steps) {
    const std::string line =
        examples::StepTimingLine(*world->group(), step_ms, rss_before_model);
    if (rank == 0) std::printf("%s\n", line.c_str());
    return 0;
  }
  const std::map<std::string, at::Tensor> final_params = FinalParams(gpt, stage);
  if (final_params.size() !=
      (pipelined ? stage->Leaves().size() : reference.params.size()))
    Fail("a trained parameter is not the GPT's");
  for (const auto& [name, value] : final_params)
    ExpectClose("final " + name, value, reference.params.at(name).cpu());
  // The first rank of each stage's (dp, fsdp, tp) group writes its stage's.
  if (!flags.out.empty() && dp->getRank() == 0 && fsdp->getRank() == 0 &&
      group("tp")->getRank() == 0)
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
