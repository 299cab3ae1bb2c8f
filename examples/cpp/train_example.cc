// Parallel training on a DeviceMesh through ModuleTrainer: a torch::nn MLP
// (mlp.h) or GPT (gpt.h) on synthetic data, with any of dp x fsdp x tp x pp
// (sizes multiply to the world size) and a torch::optim optimizer (SGD, or
// AdamW), e.g.
//
//   meshrun --standalone --nproc-per-node=4 build/bin/train_example --dp 2 --tp 2
//   step 0 loss 0.0529381
//   ...
//
// Pipelines: --pp P --schedule gpipe|1f1b|interleaved --microbatches M, and
// for interleaved 1F1B --virtual-stages V (the model's parts, the MLP's
// Linears or the GPT's embeddings, blocks and head, cut into P x V stages,
// rank r holding stages r, r + P, ...).
//
// Rank 0 prints one `step N loss X` line a step (the global batch's mean
// loss). --verify also trains the whole model in a single process on every
// rank and checks each step's loss and the final gathered parameters
// against it (relative error <= --rtol): the parallel run must be the same
// training, only spread out. --save / --load write and read a sharded
// checkpoint, loadable on another layout (continue with --first-step).
// --data FILE trains on the batches of a file (batch_file.h; step N on the
// file's N-th) instead of synthetic ones, e.g. those PyTorch's side of
// scripts/parity-torch.sh trains on. --trace-collectives DIR writes each
// rank's collectives of the training steps (c10d's flight recorder, as
// torch._C._distributed_c10d._dump_fr_trace_json gives it in Python) before
// and after the steps to DIR/rank<R>.{before,after}.json, so they can be
// counted against PyTorch's. --time-steps times each step (after a barrier;
// the slowest rank's wall time, and the ranks' CPU time summed) and rank 0
// prints one `timing step_ms=... cpu_ms=... max_rss_mb=... rss_growth_mb=...`
// line at the end, measured as
// tests/parity/torch_parallel.py --time-steps measures PyTorch's side
// (scripts/bench-parallel.sh --layouts).
//
// --fault-tolerant: the --dp replicas are fault-tolerant replica groups
// (worker_lib/training/fault_tolerant.h; run under `meshrun
// --restart-scope=replica` so that only a failed group restarts): each
// trains its rows of the global batch, a failure discards the step in
// progress, the survivors go on, and a restarted group copies the state
// from a live one. --verify then checks the final parameters against
// single-process training of the committed steps, each on the rows of the
// replicas that took part in it. --kill-at-step N [--kill-rank R]
// [--kill-point start|allreduce|voted] makes rank R SIGKILL itself at step
// N, in its first incarnation only. With meshrun's replica scope the world
// may start with fewer groups than --dp: a node that joins later brings the
// others, which heal from a live one and train on, and a node that is lost
// takes its groups with it while the others go on (--hold-at-step N
// --hold-file F, repeatable, a test's hook: a replica that has committed N
// steps waits for F to exist before going on, so that a test can bring a
// node in or take one away at a known step).
//
// --checkpoint-dir DIR --checkpoint-every C (without --fault-tolerant): a
// sharded checkpoint of the model and the optimizer's state every C steps
// (checkpoint_series.h), and a start resumes from the latest, as a job restarted by
// meshrun's default restart-everything does; --verify then checks the resumed steps
// against an uninterrupted single-process run. --kill-at-step works there too (the first
// attempt only). --kill-every N, in either mode, fails a worker again and again
// (scripts/bench-recovery.sh): see KillStep.
//
// Exit codes: 0 done (and verified), 1 a failure or a mismatch, 2 bad flags.

#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/FlightRecorder.hpp>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "examples/cpp/example_output.h"
#include "examples/cpp/memory_usage.h"
#include "worker_lib/data/batch_file.h"
#include "worker_lib/data/data.h"
#include "worker_lib/mesh/process_group.h"
#include "worker_lib/models/gpt.h"
#include "worker_lib/models/mlp.h"
#include "worker_lib/training/checkpoint_series.h"
#include "worker_lib/training/fault_tolerant.h"
#include "worker_lib/training/module_checkpoint.h"
#include "worker_lib/training/module_trainer.h"

namespace {

using namespace meshrun::worker;
using namespace meshrun::worker::parallel;

using examples::Say;

int Fail(int rank, const std::string& what) {
  return examples::Fail("train_example", rank, what);
}

double RelativeError(const at::Tensor& got, const at::Tensor& want) {
  const double scale = want.to(at::kDouble).norm().item<double>();
  const double diff = (got.to(at::kDouble) - want.to(at::kDouble)).norm().item<double>();
  return scale == 0 ? diff : diff / scale;
}

// --model and its sizes.
struct ModelFlags {
  std::string name = "mlp";
  std::vector<int64_t> sizes{50, 50, 50, 50, 4};
  models::GptConfig gpt{/*vocab=*/64, /*context=*/16, /*dim=*/32, /*heads=*/4,
                        /*layers=*/2};
  uint64_t seed = 0;
};

// The model, the same on every rank (seeded); with tensor parallelism the
// GPT's head is vocabulary-parallel (LossParallel, PyTorch's loss_parallel).
ModuleModel MakeModel(const ModelFlags& flags, bool tensor_parallel) {
  torch::manual_seed(flags.seed);
  if (flags.name == "gpt")
    return models::GptModel(models::Gpt(flags.gpt), tensor_parallel);
  return models::MlpModel(models::Mlp(flags.sizes));
}

std::string DescribeModel(const ModelFlags& flags) {
  if (flags.name == "gpt") {
    const models::GptConfig& c = flags.gpt;
    return absl::StrCat("torch::nn GPT: vocab ", c.vocab, ", context ", c.context,
                        ", dim ", c.dim, ", ", c.heads, " heads, ", c.layers, " blocks");
  }
  return absl::StrCat("torch::nn MLP ", absl::StrJoin(flags.sizes, ","));
}

// The global batch of a step, the same on every rank.
InputTarget SyntheticData(const ModelFlags& flags, int64_t step, int64_t batch) {
  if (flags.name == "gpt") {
    TokenBatch data =
        SyntheticTokens(flags.seed, step, batch, flags.gpt.context, flags.gpt.vocab);
    return {data.tokens, data.targets};
  }
  Batch data =
      SyntheticBatch(flags.seed, step, batch, flags.sizes.front(), flags.sizes.back());
  return {data.input, data.target};
}

// --optimizer and its settings.
struct OptimizerFlags {
  std::string name = "sgd";
  double lr = 0.05;
  double momentum = 0;      // SGD's
  double weight_decay = 0;  // AdamW's
};

ModuleTrainer::MakeOptimizer OptimizerMaker(const OptimizerFlags& flags) {
  return [flags](
             std::vector<at::Tensor> params) -> std::unique_ptr<torch::optim::Optimizer> {
    if (flags.name == "adamw") {
      return std::make_unique<torch::optim::AdamW>(
          std::move(params),
          torch::optim::AdamWOptions(flags.lr).weight_decay(flags.weight_decay));
    }
    return std::make_unique<torch::optim::SGD>(
        std::move(params), torch::optim::SGDOptions(flags.lr).momentum(flags.momentum));
  };
}

// The whole model trained in this process, the parallel run's reference.
struct Reference {
  ModuleModel model;
  std::unique_ptr<torch::optim::Optimizer> optimizer;

  // One step on the whole batch: its mean loss.
  double Step(const InputTarget& batch) {
    optimizer->zero_grad();
    at::Tensor loss = model.loss(model.forward(batch.first), batch.second);
    loss.backward();
    optimizer->step();
    return loss.item<double>();
  }
};

Reference MakeReference(const ModelFlags& model, const OptimizerFlags& optimizer) {
  Reference reference{MakeModel(model, /*tensor_parallel=*/false), nullptr};
  reference.optimizer = OptimizerMaker(optimizer)(reference.model.root->parameters());
  return reference;
}

// Checks the full parameters this rank trains against `reference`'s
// (relative error <= rtol); returns the number checked, or the first
// mismatch.
absl::StatusOr<size_t> CompareParams(const ModuleTrainer& trainer,
                                     const Reference& reference, double rtol) {
  std::map<std::string, at::Tensor> want;
  for (const auto& item : reference.model.root->named_parameters())
    want[item.key()] = item.value().detach();
  const std::map<std::string, at::Tensor> full = trainer.FullParams();
  for (const auto& [name, value] : full) {
    const double error = RelativeError(value, want.at(name));
    if (!value.sizes().equals(want.at(name).sizes()) || !(error <= rtol)) {
      return absl::InternalError(
          name + ": differs from single-process training (relative error " +
          std::to_string(error) + ")");
    }
  }
  return full.size();
}

// "stage 0/4: parts [0, 0], stage 2/4: parts [2, 2]": this rank's stages.
std::string DescribeStages(const ModuleTrainer& trainer) {
  const ModuleLayout& layout = trainer.layout();
  std::vector<std::string> stages;
  for (const auto& stage : trainer.stage_parts()) {
    stages.push_back(absl::StrCat("stage ", stage.stage, "/",
                                  layout.pp * layout.virtual_stages, ": parts [",
                                  stage.first, ", ", stage.last, "]"));
  }
  return absl::StrJoin(stages, ", ");
}

// Where and when --kill-at-step / --kill-every strike.
struct KillPlan {
  int64_t step = -1;  // --kill-at-step
  int64_t every = 0;  // --kill-every
  int rank = -1;      // --kill-rank (--kill-at-step's)
  std::string point = "start";
};

// The step at which this process SIGKILLs itself, or -1. `lives`: how often
// it was started before (fault-tolerant: its replica group's restarts;
// otherwise the world's). --kill-at-step: rank kill.rank in its first life.
// --kill-every N: failure j = 1, 2, ... strikes at step j * N, on the last
// rank of replica (j - 1) mod `replicas` (of `replica_size` ranks each) when
// fault-tolerant, so that every replica fails in turn and replica r's k-th
// restart met failure k * replicas + r + 1 (there, at the first step from
// j * N on that every replica takes part in, once failure j - 1 has struck:
// failures come one at a time, never while another replica is still coming
// back, which could leave no replica that holds the state); otherwise on
// rank world - 1 - (j - 1) mod world, the world's j-th attempt meeting
// failure j.
int64_t KillStep(const KillPlan& kill, int rank, int world_size, int replica,
                 int replicas, int replica_size, int lives, bool fault_tolerant) {
  if (kill.every <= 0) return lives == 0 && rank == kill.rank ? kill.step : -1;
  if (fault_tolerant) {
    if (rank != replica * replica_size + replica_size - 1) return -1;
    return kill.every * (static_cast<int64_t>(lives) * replicas + replica + 1);
  }
  if (rank != world_size - 1 - lives % world_size) return -1;
  return kill.every * (lives + 1);
}

// --hold-at-step / --hold-file, each given as often as the other (see the
// top of this file): at steps[i], wait for files[i].
struct HoldPlan {
  std::vector<int64_t> steps;
  std::vector<std::string> files;
  // --say-votes (a test's hook): every rank says when its vote on a step was
  // answered ("rank R voted on step S").
  bool say_votes = false;
};

// Waits up to two minutes for `path` to exist.
absl::Status WaitForFile(const std::string& path) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(2);
  while (!std::filesystem::exists(path)) {
    if (std::chrono::steady_clock::now() > deadline)
      return absl::DeadlineExceededError("--hold-file " + path + " never appeared");
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return absl::OkStatus();
}

void KillSelf(int rank, int64_t step, const std::string& point) {
  Say("rank " + std::to_string(rank) + " SIGKILLs itself at step " +
      std::to_string(step) + " (" + point + ")");
  raise(SIGKILL);
}

// What a run trains, and how.
struct Run {
  ModelFlags model;
  OptimizerFlags optimizer;
  ModuleLayout layout;
  std::function<InputTarget(int64_t)> batch_of;
  int64_t first_step = 0;
  int steps = 10;
  bool verify = false;
  double rtol = 1e-5;
};

// --fault-tolerant: see the top of this file.
int RunFaultTolerant(const Run& run, const KillPlan& kill, const HoldPlan& hold) {
  auto env = WorkerEnvFromProcessEnvironment();
  if (!env.ok()) return Fail(-1, std::string(env.status().message()));
  const int rank = env->rank;
  const int num_replicas = run.layout.dp;
  auto id = ReplicaIdentityFromEnv(*env, num_replicas);
  if (!id.ok()) return Fail(rank, std::string(id.status().message()));
  if (const std::string warning = RestartScopeWarning(*id); rank == 0 && !warning.empty())
    Say(warning);
  auto world = InitReplicaGroupWorld(*id);
  if (!world.ok()) return Fail(rank, std::string(world.status().message()));
  Say("rank " + std::to_string(rank) + " pid " + std::to_string(getpid()) + ": replica " +
      std::to_string(id->replica) + " member " + std::to_string(id->member) +
      " incarnation " + std::to_string(id->incarnation));

  FaultToleranceOptions ft_options;
  ft_options.steps = static_cast<uint64_t>(run.steps);
  // A failure of the whole world (restart count > 0) is not this plan's.
  const int64_t kill_step =
      env->restart_count == 0
          ? KillStep(kill, rank, env->world_size, id->replica, num_replicas,
                     id->replica_size, id->incarnation, true)
          : -1;
  const bool kills_here = kill_step >= 0;
  if (kills_here || hold.say_votes) {
    ft_options.fault_injection = [&kill, &hold, rank, kill_step](const std::string& point,
                                                                 uint64_t step) {
      if (hold.say_votes && point == "voted")
        Say("rank " + std::to_string(rank) + " voted on step " + std::to_string(step));
      if (point == kill.point && static_cast<int64_t>(step) == kill_step)
        KillSelf(rank, kill_step, point);
    };
  }
  auto replicas = FaultTolerantReplicas::Create(*world, *id, ft_options);
  if (!replicas.ok()) return Fail(rank, std::string(replicas.status().message()));
  ModuleLayout layout = run.layout;
  layout.dp = 1;  // the replicas are the data-parallel dimension
  layout.replicate = false;
  auto trainer =
      ModuleTrainer::Create(*world, layout, MakeModel(run.model, layout.tensor_parallel),
                            OptimizerMaker(run.optimizer), replicas->get());
  if (!trainer.ok()) return Fail(rank, std::string(trainer.status().message()));
  if (rank == 0) {
    Say("layout " + layout.ToString() + " x " + std::to_string(num_replicas) +
        " fault-tolerant replicas (" + DescribeModel(run.model) + ")" +
        (id->replicas_in_world < num_replicas
             ? " (" + std::to_string(id->replicas_in_world) +
                   " in the world so far: joining nodes bring the others)"
             : ""));
  }

  std::vector<uint32_t> last_participants;
  // --kill-every: failure j - 1 struck replica (r - 1) mod replicas (this
  // one's failure is j): the last step it was seen missing from.
  const uint32_t previous_victim =
      static_cast<uint32_t>((id->replica + num_replicas - 1) % num_replicas);
  int64_t previous_victim_missing = -1;
  while (true) {
    for (size_t i = 0; i < hold.steps.size(); ++i) {
      if (static_cast<int64_t>((*replicas)->committed_steps()) != hold.steps[i]) continue;
      if (auto held = WaitForFile(hold.files[i]); !held.ok())
        return Fail(rank, std::string(held.message()));
    }
    auto quorum = (*replicas)->BeginStep((*trainer)->training_state());
    if (absl::IsOutOfRange(quorum.status())) {
      // Came (back) after training ended: the result is the others'.
      Say("rank " + std::to_string(rank) +
          ": nothing left to train: " + std::string(quorum.status().message()));
      return 0;
    }
    if (!quorum.ok()) return Fail(rank, std::string(quorum.status().message()));
    if (!quorum->participating) continue;
    // The lowest participant reports, so somebody always does.
    const bool reports =
        id->member == 0 && id->replica == static_cast<int>(quorum->participants[0]);
    const int64_t step = run.first_step + static_cast<int64_t>(quorum->step);
    if (quorum->healed) {
      Say("replica " + std::to_string(id->replica) + " member " +
          std::to_string(id->member) + " healed from replica " +
          std::to_string(quorum->source_replica) + " at step " + std::to_string(step));
    }
    if (reports && quorum->participants != last_participants) {
      Say("step " + std::to_string(step) + ": replicas " +
          absl::StrJoin(quorum->participants, ","));
      last_participants = quorum->participants;
    }
    if (static_cast<int64_t>(quorum->step) >= run.steps) break;
    const bool everyone =
        static_cast<int>(quorum->participants.size()) == id->replicas_in_world;
    if (std::find(quorum->participants.begin(), quorum->participants.end(),
                  previous_victim) == quorum->participants.end())
      previous_victim_missing = static_cast<int64_t>(quorum->step);
    if (kills_here && kill.point == "start") {
      // --kill-every: also after the failure before this one struck (its
      // replica was missing from a step since its planned step), see
      // KillStep. Any replica missing would not do: failures overdue while
      // one replica came back would all strike at its return.
      const bool due =
          kill.every > 0 ? static_cast<int64_t>(quorum->step) >= kill_step && everyone &&
                               (kill_step <= kill.every ||
                                previous_victim_missing >= kill_step - kill.every)
                         : static_cast<int64_t>(quorum->step) == kill_step;
      if (due) KillSelf(rank, static_cast<int64_t>(quorum->step), "start");
    }
    auto [input, target] = run.batch_of(step);
    auto loss = (*trainer)->Step(DataShard(input, num_replicas, id->replica),
                                 DataShard(target, num_replicas, id->replica));
    if (absl::IsAborted(loss.status())) {
      if (reports) {
        Say("step " + std::to_string(step) +
            " discarded: " + (*replicas)->last_discard_reason());
      }
      continue;
    }
    if (!loss.ok()) return Fail(rank, std::string(loss.status().message()));
    if (reports) {
      char line[96];
      std::snprintf(line, sizeof line, "step %lld loss %.9g",
                    static_cast<long long>(step), *loss);
      Say(line);
    }
  }

  if (run.verify) {
    // Single-process training of the committed steps, each on the rows of
    // the replicas that took part in it (a mean loss over their rows is the
    // mean of the replicas' losses: their gradients' average).
    const auto& history = (*replicas)->history();
    Reference reference = MakeReference(run.model, run.optimizer);
    for (size_t i = 0; i < history.size(); ++i) {
      auto [input, target] = run.batch_of(run.first_step + static_cast<int64_t>(i));
      std::vector<at::Tensor> inputs, targets;
      for (uint32_t r : history[i]) {
        inputs.push_back(DataShard(input, num_replicas, r));
        targets.push_back(DataShard(target, num_replicas, r));
      }
      reference.Step({at::cat(inputs), at::cat(targets)});
    }
    auto checked = CompareParams(**trainer, reference, run.rtol);
    if (!checked.ok()) return Fail(rank, std::string(checked.status().message()));
    size_t partial = 0;
    for (const auto& participants : history)
      partial += participants.size() < static_cast<size_t>(num_replicas);
    Say("verified rank " + std::to_string(rank) + " pid " + std::to_string(getpid()) +
        ": " + std::to_string(*checked) +
        " parameters equal single-process training of " + std::to_string(history.size()) +
        " committed steps (" + std::to_string(partial) + " without every replica)");
  }
  (*world)->group()->barrier()->wait();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app(
      "meshrun parallel training example: a torch::nn model under DP, FSDP, TP and PP on "
      "one DeviceMesh");
  Run run;
  ModelFlags& model = run.model;
  OptimizerFlags& optimizer = run.optimizer;
  int dp = 1, fsdp = 1, tp = 1, pp = 1, microbatches = 1, virtual_stages = 1;
  std::string schedule = "gpipe";
  bool no_reshard = false;
  int64_t batch = 32;
  bool time_steps = false;
  std::string save_dir, load_dir, data_file, trace_dir, checkpoint_dir;
  int64_t checkpoint_every = 0;
  bool fault_tolerant = false;
  KillPlan kill;
  HoldPlan hold;
  app.add_option("--model", model.name, "mlp or gpt")
      ->check(CLI::IsMember({"mlp", "gpt"}));
  app.add_option("--sizes", model.sizes,
                 "MLP layer sizes (default: seed 003's 50,50,50,50,4)")
      ->delimiter(',');
  app.add_option("--vocab", model.gpt.vocab, "GPT vocabulary");
  app.add_option("--context", model.gpt.context, "GPT context (the sequence length)");
  app.add_option("--dim", model.gpt.dim, "GPT width");
  app.add_option("--heads", model.gpt.heads, "GPT attention heads");
  app.add_option("--layers", model.gpt.layers, "GPT blocks");
  app.add_option("--dp", dp, "data-parallel replicas");
  app.add_option("--fsdp", fsdp, "FSDP shards (with --dp > 1: HSDP)");
  app.add_option("--tp", tp, "tensor-parallel ranks");
  app.add_option("--pp", pp, "pipeline stages");
  app.add_option("--microbatches", microbatches, "microbatches a step");
  app.add_option("--schedule", schedule, "pipeline schedule: gpipe, 1f1b or interleaved");
  app.add_option("--virtual-stages", virtual_stages,
                 "model chunks per pipeline rank (> 1 with --schedule interleaved)");
  app.add_flag("--no-reshard", no_reshard,
               "FSDP keeps gathered params from forward to backward");
  app.add_option("--steps", run.steps, "training steps");
  app.add_option("--first-step", run.first_step,
                 "number of the first step (data of that step)");
  app.add_option("--batch", batch, "global batch size");
  app.add_option("--optimizer", optimizer.name, "sgd or adamw")
      ->check(CLI::IsMember({"sgd", "adamw"}));
  app.add_option("--lr", optimizer.lr, "learning rate");
  app.add_option("--momentum", optimizer.momentum,
                 "SGD momentum (its buffers: optimizer state a heal and a checkpoint "
                 "carry)");
  app.add_option("--weight-decay", optimizer.weight_decay, "AdamW's weight decay");
  app.add_option("--seed", model.seed, "model and data seed");
  app.add_flag("--verify", run.verify, "check against single-process training");
  app.add_flag("--time-steps", time_steps,
               "time each step (barrier first; the slowest rank) and print them with the "
               "peak RSS at the end");
  app.add_option("--rtol", run.rtol, "--verify's relative tolerance");
  app.add_option("--save", save_dir, "write a sharded checkpoint here at the end");
  app.add_option("--load", load_dir, "start from this sharded checkpoint");
  app.add_option("--data", data_file,
                 "train on this file's batches (a torch.save'd list of (input, target); "
                 "--batch is then the file's)");
  app.add_option("--trace-collectives", trace_dir,
                 "write the flight recorder's collectives before and after the steps to "
                 "DIR/rank<R>.{before,after}.json; "
                 "set TORCH_FR_BUFFER_SIZE above their number");
  app.add_flag("--fault-tolerant", fault_tolerant,
               "the --dp replicas survive each other's failures (run under meshrun "
               "--restart-scope=replica)");
  app.add_option(
      "--kill-at-step", kill.step,
      "rank --kill-rank SIGKILLs itself at this step (first incarnation only)");
  app.add_option("--kill-rank", kill.rank,
                 "the rank --kill-at-step kills (default: the last)");
  app.add_option("--kill-every", kill.every,
                 "a worker SIGKILLs itself every N steps, each replica in turn");
  app.add_option("--checkpoint-dir", checkpoint_dir,
                 "sharded checkpoints here; a start resumes from the latest");
  app.add_option("--checkpoint-every", checkpoint_every,
                 "with --checkpoint-dir: a checkpoint every N steps");
  app.add_option("--kill-point", kill.point,
                 "where in the step: start, allreduce or voted")
      ->check(CLI::IsMember({"start", "allreduce", "voted"}));
  app.add_option("--hold-at-step", hold.steps,
                 "test hook (--fault-tolerant): a replica that has committed this many "
                 "steps waits for the matching --hold-file to exist (repeatable)")
      ->take_all();
  app.add_option("--hold-file", hold.files, "see --hold-at-step")->take_all();
  app.add_flag("--say-votes", hold.say_votes,
               "test hook (--fault-tolerant): every rank says when its vote on a step "
               "was answered");
  CLI11_PARSE(app, argc, argv);
  if (hold.steps.size() != hold.files.size() ||
      (!hold.steps.empty() && !fault_tolerant)) {
    std::cerr << "--hold-at-step and --hold-file go in pairs, with --fault-tolerant\n";
    return 2;
  }
  if ((kill.step >= 0 || kill.every > 0) && !fault_tolerant && checkpoint_dir.empty()) {
    std::cerr << "--kill-at-step and --kill-every need --fault-tolerant or "
                 "--checkpoint-dir (to resume from)\n";
    return 2;
  }
  if (kill.step >= 0 && kill.every > 0) {
    std::cerr << "--kill-at-step and --kill-every do not go together\n";
    return 2;
  }
  if (kill.every < 0) {
    std::cerr << "--kill-every must be positive\n";
    return 2;
  }
  if (fault_tolerant && (!save_dir.empty() || !load_dir.empty() || !trace_dir.empty() ||
                         time_steps || !checkpoint_dir.empty())) {
    std::cerr << "--fault-tolerant does not combine with --save, --load, "
                 "--trace-collectives, --time-steps or --checkpoint-dir\n";
    return 2;
  }
  if (!checkpoint_dir.empty() && checkpoint_every <= 0) {
    std::cerr << "--checkpoint-dir needs --checkpoint-every N > 0\n";
    return 2;
  }
  auto parsed_schedule = ParseSchedule(schedule);
  if (!parsed_schedule.ok()) {
    std::cerr << std::string(parsed_schedule.status().message()) << "\n";
    return 2;
  }
  run.layout = ModuleLayout::FromSizes(dp, fsdp, pp, tp);
  run.layout.microbatches = microbatches;
  run.layout.virtual_stages = virtual_stages;
  run.layout.schedule = *parsed_schedule;
  run.layout.reshard_after_forward = !no_reshard;
  // Asking for virtual stages or the interleaved schedule asks for a
  // pipeline too, which then says what it lacks.
  run.layout.pipeline |=
      virtual_stages != 1 || run.layout.schedule == Schedule::kInterleaved1F1B;

  std::vector<InputTarget> file_batches;
  if (!data_file.empty()) {
    auto read = ReadBatchFile(data_file);
    if (!read.ok()) return Fail(-1, std::string(read.status().message()));
    file_batches = *std::move(read);
    if (run.first_step < 0 ||
        run.first_step + run.steps > static_cast<int64_t>(file_batches.size())) {
      return Fail(-1, data_file + " has " + std::to_string(file_batches.size()) +
                          " batches, steps " + std::to_string(run.first_step) + ".." +
                          std::to_string(run.first_step + run.steps - 1) + " asked for");
    }
  }
  run.batch_of = [&](int64_t step) -> InputTarget {
    if (!file_batches.empty()) return file_batches[static_cast<size_t>(step)];
    return SyntheticData(model, step, batch);
  };
  if (fault_tolerant) {
    if (kill.rank < 0) {
      auto env = WorkerEnvFromProcessEnvironment();
      kill.rank = env.ok() ? env->world_size - 1 : 0;
    }
    return RunFaultTolerant(run, kill, hold);
  }

  auto world = InitProcessGroup("gloo");
  if (!world.ok()) return Fail(-1, std::string(world.status().message()));
  const int rank = (*world)->rank();
  const double rss_before_model = examples::RssMb();

  auto trainer = ModuleTrainer::Create(*world, run.layout,
                                       MakeModel(model, run.layout.tensor_parallel),
                                       OptimizerMaker(optimizer));
  if (!trainer.ok()) return Fail(rank, std::string(trainer.status().message()));
  if (rank == 0) {
    std::string stages = DescribeStages(**trainer);
    Say("layout " + run.layout.ToString() + " (" + DescribeModel(model) + ")" +
        (stages.empty() ? "" : "; rank 0 holds " + stages));
  }
  if (!load_dir.empty()) {
    if (auto status = (*trainer)->Load(load_dir); !status.ok())
      return Fail(rank, std::string(status.message()));
  }
  // Steps done before this start (a restart resumes from its checkpoint).
  int64_t resumed = 0;
  if (!checkpoint_dir.empty()) {
    auto latest = ResumeFromLatestCheckpoint(
        [&](const std::string& dir) { return (*trainer)->Load(dir); }, checkpoint_dir);
    if (!latest.ok()) return Fail(rank, std::string(latest.status().message()));
    resumed = *latest;
    if (rank == 0 && resumed > 0)
      Say("resumed from the checkpoint after step " + std::to_string(resumed));
  }
  if (kill.rank < 0) kill.rank = (*world)->size() - 1;
  const int64_t kill_step = KillStep(kill, rank, (*world)->size(), 0, 1, 1,
                                     (*world)->env().restart_count, false);

  // The reference: the same model, whole, in this process (from the same
  // checkpoint when loading).
  std::optional<Reference> reference;
  std::vector<double> reference_losses;
  if (run.verify) {
    reference = MakeReference(model, optimizer);
    if (!load_dir.empty()) {
      if (auto status =
              LoadModule(load_dir, *reference->model.root, reference->optimizer.get());
          !status.ok())
        return Fail(rank, "reference: " + std::string(status.message()));
    }
    for (int i = 0; i < run.steps; ++i)
      reference_losses.push_back(reference->Step(run.batch_of(run.first_step + i)));
  }

  // Gloo records every collective in c10d's flight recorder (a ring buffer of
  // TORCH_FR_BUFFER_SIZE entries); its reset is not exported, so the steps'
  // are those after the "before" dump.
  auto dump_collectives = [&](const std::string& when) {
    if (trace_dir.empty()) return;
    std::filesystem::create_directories(trace_dir);
    std::ofstream(trace_dir + "/rank" + std::to_string(rank) + "." + when + ".json")
        << c10d::dump_fr_trace_json(/*includeCollectives=*/true, /*onlyActive=*/false,
                                    "gloo");
  };
  dump_collectives("before");
  examples::StepClock clock;
  for (int i = static_cast<int>(resumed); i < run.steps; ++i) {
    const int64_t step = run.first_step + i;
    if (i == kill_step) KillSelf(rank, i, "start");
    auto [input, target] = run.batch_of(step);
    if (time_steps) (*world)->group()->barrier()->wait();
    clock.Start();
    auto loss = (*trainer)->Step(input, target);
    clock.Stop();
    if (!loss.ok()) return Fail(rank, std::string(loss.status().message()));
    char line[96];
    std::snprintf(line, sizeof line, "step %lld loss %.9g", static_cast<long long>(step),
                  *loss);
    if (rank == 0) Say(line);
    if (!checkpoint_dir.empty() && (i + 1) % checkpoint_every == 0 && i + 1 < run.steps) {
      if (auto status = SaveCheckpointStep(
              [&](const std::string& dir) { return (*trainer)->Save(dir); }, rank,
              checkpoint_dir, i + 1);
          !status.ok())
        return Fail(rank, std::string(status.message()));
    }
    if (run.verify) {
      const double want = reference_losses[static_cast<size_t>(i)];
      const double error = std::abs(*loss - want) / std::max(std::abs(want), 1e-30);
      if (!(error <= run.rtol)) {
        std::snprintf(line, sizeof line, "step %lld: loss %.9g, single-process %.9g",
                      static_cast<long long>(step), *loss, want);
        return Fail(rank, line);
      }
    }
  }

  dump_collectives("after");
  if (time_steps && run.steps > 0) {
    const std::string line =
        examples::StepTimingLine(*(*world)->group(), clock, rss_before_model);
    if (rank == 0) Say(line);
  }

  if (run.verify) {
    auto checked = CompareParams(**trainer, *reference, run.rtol);
    if (!checked.ok()) return Fail(rank, std::string(checked.status().message()));
    Say("verified rank " + std::to_string(rank) + ": " +
        std::to_string(run.steps - resumed) + " losses and " + std::to_string(*checked) +
        " parameters equal single-process training");
  }
  if (!save_dir.empty()) {
    if (auto status = (*trainer)->Save(save_dir); !status.ok())
      return Fail(rank, std::string(status.message()));
    if (rank == 0) Say("saved " + save_dir);
  }
  // No rank leaves while a peer may still be reading from it.
  (*world)->group()->barrier()->wait();
  return 0;
}
