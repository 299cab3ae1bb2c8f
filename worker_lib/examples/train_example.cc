// Parallel training on a DeviceMesh: an MLP or a small transformer LM on
// synthetic data, with any of dp x fsdp x tp x pp (sizes multiply to the
// world size), e.g.
//
//   meshrun --standalone --nproc-per-node=4 build/bin/train_example --dp 2 --tp 2
//   step 0 loss 0.0529381
//   ...
//
// Pipelines: --pp P --schedule gpipe|1f1b|interleaved --microbatches M, and
// for interleaved 1F1B --virtual-stages V (the model cut into P x V stages,
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
// the slowest rank's wall time) and rank 0 prints one `timing step_ms=...
// max_rss_mb=... rss_growth_mb=...` line at the end, measured as
// tests/parity/torch_parallel.py --time-steps measures PyTorch's side
// (scripts/bench-parallel.sh --layouts).
//
// --fault-tolerant: the --dp replicas are fault-tolerant replica groups
// (worker_lib/parallel/fault_tolerant.h; run under `meshrun
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
// sharded checkpoint every C steps (checkpoint_series.h), and a start
// resumes from the latest, as a job restarted by meshrun's default
// restart-everything does; --verify then checks the resumed steps against
// an uninterrupted single-process run. --kill-at-step works there too (the
// first attempt only). --kill-every N, in either mode, fails a worker again
// and again (scripts/bench-recovery.sh): see KillStep.
//
// Exit codes: 0 done (and verified), 1 a failure or a mismatch, 2 bad flags.

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/FlightRecorder.hpp>
#include <vector>

#include "absl/strings/str_join.h"
#include "worker_lib/examples/example_output.h"
#include "worker_lib/examples/memory_usage.h"
#include "worker_lib/parallel/batch_file.h"
#include "worker_lib/parallel/checkpoint.h"
#include "worker_lib/parallel/checkpoint_series.h"
#include "worker_lib/parallel/data.h"
#include "worker_lib/parallel/fault_tolerant.h"
#include "worker_lib/parallel/trainer.h"
#include "worker_lib/parallel/transformer.h"
#include "worker_lib/process_group.h"

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
// restart met failure k * replicas + r + 1; otherwise on rank world - 1 -
// (j - 1) mod world, the world's j-th attempt meeting failure j.
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

// Checks `trainer`'s gathered params against `reference` (relative error <=
// rtol); returns the number checked, or the first mismatch.
absl::StatusOr<size_t> CompareParams(Trainer& trainer, TrainModel& reference,
                                     double rtol) {
  std::map<std::string, at::Tensor> want;
  for (const auto& param : reference.Layers().Params())
    want[param->name()] = param->data();
  auto full = trainer.GatherFullParams();
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

// --fault-tolerant: see the top of this file.
int RunFaultTolerant(TrainOptions options,
                     const std::function<std::unique_ptr<TrainModel>()>& make_model,
                     const std::function<InputTarget(int64_t)>& batch_of,
                     int64_t first_step, int steps, bool verify, double rtol,
                     const KillPlan& kill, const HoldPlan& hold) {
  auto env = WorkerEnvFromProcessEnvironment();
  if (!env.ok()) return Fail(-1, std::string(env.status().message()));
  const int rank = env->rank;
  const int num_replicas = options.layout.dp;
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
  ft_options.steps = static_cast<uint64_t>(steps);
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
  options.layout.dp = 1;  // the replicas are the data-parallel dimension
  options.replica_sync = replicas->get();
  auto trainer = Trainer::Create(*world, make_model(), options);
  if (!trainer.ok()) return Fail(rank, std::string(trainer.status().message()));
  if (rank == 0) {
    Say("layout " + (*trainer)->Describe() + " x " + std::to_string(num_replicas) +
        " fault-tolerant replicas" +
        (id->replicas_in_world < num_replicas
             ? " (" + std::to_string(id->replicas_in_world) +
                   " in the world so far: joining nodes bring the others)"
             : ""));
  }

  std::vector<uint32_t> last_participants;
  while (true) {
    for (size_t i = 0; i < hold.steps.size(); ++i) {
      if (static_cast<int64_t>((*replicas)->committed_steps()) != hold.steps[i]) continue;
      if (auto held = WaitForFile(hold.files[i]); !held.ok())
        return Fail(rank, std::string(held.message()));
    }
    auto quorum = (*replicas)->BeginStep(**trainer);
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
    if (quorum->healed) {
      Say("replica " + std::to_string(id->replica) + " member " +
          std::to_string(id->member) + " healed from replica " +
          std::to_string(quorum->source_replica) + " at step " +
          std::to_string(first_step + static_cast<int64_t>(quorum->step)));
    }
    if (reports && quorum->participants != last_participants) {
      std::vector<std::string> names;
      for (uint32_t r : quorum->participants) names.push_back(std::to_string(r));
      Say("step " + std::to_string(first_step + static_cast<int64_t>(quorum->step)) +
          ": replicas " + absl::StrJoin(names, ","));
      last_participants = quorum->participants;
    }
    if (static_cast<int64_t>(quorum->step) >= steps) break;
    const int64_t step = first_step + static_cast<int64_t>(quorum->step);
    if (kills_here && kill.point == "start" &&
        static_cast<int64_t>(quorum->step) == kill_step)
      ft_options.fault_injection("start", quorum->step);
    auto [input, target] = batch_of(step);
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

  if (verify) {
    // Single-process training of the committed steps, each on the rows of
    // the replicas that took part in it.
    const auto& history = (*replicas)->history();
    auto reference = make_model();
    auto committed_batch = [&](int64_t i) -> InputTarget {
      auto [input, target] = batch_of(first_step + i);
      std::vector<at::Tensor> inputs, targets;
      for (uint32_t r : history[i]) {
        inputs.push_back(DataShard(input, num_replicas, r));
        targets.push_back(DataShard(target, num_replicas, r));
      }
      return {at::cat(inputs), at::cat(targets)};
    };
    TrainSingleProcess(*reference, committed_batch, 0, static_cast<int>(history.size()),
                       options.lr, options.momentum);
    auto checked = CompareParams(**trainer, *reference, rtol);
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
  CLI::App app("meshrun parallel training example (DP, FSDP, TP, PP on one DeviceMesh)");
  std::string model_name = "mlp";
  std::vector<int64_t> sizes{50, 50, 50, 50, 4};
  TransformerConfig lm;
  TrainOptions options;
  std::string schedule = "gpipe";
  bool no_reshard = false;
  int steps = 10;
  int64_t first_step = 0;
  int64_t batch = 32;
  uint64_t seed = 0;
  bool verify = false;
  bool time_steps = false;
  double rtol = 1e-5;
  std::string save_dir, load_dir, data_file, trace_dir, checkpoint_dir;
  int64_t checkpoint_every = 0;
  bool fault_tolerant = false;
  KillPlan kill;
  HoldPlan hold;
  app.add_option("--model", model_name, "mlp or transformer")
      ->check(CLI::IsMember({"mlp", "transformer"}));
  app.add_option("--sizes", sizes, "MLP layer sizes (default: seed 003's 50,50,50,50,4)")
      ->delimiter(',');
  app.add_option("--layers", lm.layers, "transformer blocks");
  app.add_option("--vocab", lm.vocab, "transformer vocabulary");
  app.add_option("--d-model", lm.d_model, "transformer width");
  app.add_option("--heads", lm.heads, "transformer attention heads");
  app.add_option("--d-ff", lm.d_ff, "transformer MLP hidden size");
  app.add_option("--seq", lm.seq, "transformer sequence length");
  app.add_option("--dp", options.layout.dp, "data-parallel replicas");
  app.add_option("--fsdp", options.layout.fsdp, "FSDP shards (with --dp > 1: HSDP)");
  app.add_option("--tp", options.layout.tp, "tensor-parallel ranks");
  app.add_option("--pp", options.layout.pp, "pipeline stages");
  app.add_option("--microbatches", options.microbatches, "microbatches a step");
  app.add_option("--schedule", schedule, "pipeline schedule: gpipe, 1f1b or interleaved");
  app.add_option("--virtual-stages", options.virtual_stages,
                 "model chunks per pipeline rank (> 1 with --schedule interleaved)");
  app.add_option(
      "--dp-first-bucket-bytes", options.dp_first_bucket_bytes,
      "DataParallel's first gradient bucket (DDP's 1 MiB; 0: 25 MiB as the rest)");
  app.add_flag("--no-reshard", no_reshard,
               "FSDP keeps gathered params from forward to backward");
  app.add_option("--steps", steps, "training steps");
  app.add_option("--first-step", first_step,
                 "number of the first step (data of that step)");
  app.add_option("--batch", batch, "global batch size");
  app.add_option("--lr", options.lr, "SGD learning rate");
  app.add_option("--momentum", options.momentum,
                 "SGD momentum (its buffers: the optimizer state a heal copies)");
  app.add_option("--seed", seed, "model and data seed");
  app.add_flag("--verify", verify, "check against single-process training");
  app.add_flag("--time-steps", time_steps,
               "time each step (barrier first; the slowest rank) and print them with the "
               "peak RSS at the end");
  app.add_option("--rtol", rtol, "--verify's relative tolerance");
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
  options.reshard_after_forward = !no_reshard;
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
  if (!checkpoint_dir.empty() &&
      (checkpoint_every <= 0 || time_steps || options.momentum != 0)) {
    std::cerr << "--checkpoint-dir needs --checkpoint-every N > 0, and no --time-steps "
                 "or --momentum (checkpoints hold parameters only)\n";
    return 2;
  }
  auto parsed_schedule = ParseSchedule(schedule);
  if (!parsed_schedule.ok()) {
    std::cerr << std::string(parsed_schedule.status().message()) << "\n";
    return 2;
  }
  options.schedule = *parsed_schedule;

  std::vector<InputTarget> file_batches;
  if (!data_file.empty()) {
    auto read = ReadBatchFile(data_file);
    if (!read.ok()) return Fail(-1, std::string(read.status().message()));
    file_batches = *std::move(read);
    if (first_step < 0 ||
        first_step + steps > static_cast<int64_t>(file_batches.size())) {
      return Fail(-1, data_file + " has " + std::to_string(file_batches.size()) +
                          " batches, steps " + std::to_string(first_step) + ".." +
                          std::to_string(first_step + steps - 1) + " asked for");
    }
  }

  std::function<std::unique_ptr<TrainModel>()> make_model = [&]() {
    return model_name == "mlp" ? MlpModel(sizes, seed) : TransformerModel(lm, seed);
  };
  // The global batch of a step: the file's, or synthetic (a whole model only
  // for its data: not built with a file, and before the RSS baseline).
  const auto data_model = file_batches.empty() ? make_model() : nullptr;
  std::function<InputTarget(int64_t)> batch_of = [&](int64_t step) -> InputTarget {
    if (!file_batches.empty()) return file_batches[step];
    return data_model->SyntheticData(seed, step, batch);
  };
  if (fault_tolerant) {
    if (kill.rank < 0) {
      auto env = WorkerEnvFromProcessEnvironment();
      kill.rank = env.ok() ? env->world_size - 1 : 0;
    }
    return RunFaultTolerant(options, make_model, batch_of, first_step, steps, verify,
                            rtol, kill, hold);
  }

  auto world = InitProcessGroup("gloo");
  if (!world.ok()) return Fail(-1, std::string(world.status().message()));
  const int rank = (*world)->rank();
  const double rss_before_model = examples::RssMb();

  auto trainer = Trainer::Create(*world, make_model(), options);
  if (!trainer.ok()) return Fail(rank, std::string(trainer.status().message()));
  if (rank == 0) Say("layout " + (*trainer)->Describe());
  if (!load_dir.empty()) {
    if (auto status = (*trainer)->Load(load_dir); !status.ok())
      return Fail(rank, std::string(status.message()));
  }
  // Steps done before this start (a restart resumes from its checkpoint).
  int64_t resumed = 0;
  if (!checkpoint_dir.empty()) {
    auto latest = ResumeFromLatestCheckpoint(**trainer, checkpoint_dir);
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
  std::unique_ptr<TrainModel> reference;
  std::vector<double> reference_losses;
  if (verify) {
    reference = make_model();
    if (!load_dir.empty()) {
      if (auto status = LoadShards(load_dir, reference->Layers().Params()); !status.ok())
        return Fail(rank, "reference: " + std::string(status.message()));
    }
    reference_losses = TrainSingleProcess(*reference, batch_of, first_step, steps,
                                          options.lr, options.momentum);
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
  std::vector<double> step_ms;
  for (int i = static_cast<int>(resumed); i < steps; ++i) {
    const int64_t step = first_step + i;
    if (i == kill_step) KillSelf(rank, i, "start");
    auto [input, target] = batch_of(step);
    if (time_steps) (*world)->group()->barrier()->wait();
    const auto start = std::chrono::steady_clock::now();
    auto loss = (*trainer)->Step(input, target);
    step_ms.push_back(std::chrono::duration<double, std::milli>(
                          std::chrono::steady_clock::now() - start)
                          .count());
    if (!loss.ok()) return Fail(rank, std::string(loss.status().message()));
    char line[96];
    std::snprintf(line, sizeof line, "step %lld loss %.9g", static_cast<long long>(step),
                  *loss);
    if (rank == 0) Say(line);
    if (!checkpoint_dir.empty() && (i + 1) % checkpoint_every == 0 && i + 1 < steps) {
      if (auto status = SaveCheckpointStep(**trainer, rank, checkpoint_dir, i + 1);
          !status.ok())
        return Fail(rank, std::string(status.message()));
    }
    if (verify) {
      const double want = reference_losses[i];
      const double error = std::abs(*loss - want) / std::max(std::abs(want), 1e-30);
      if (!(error <= rtol)) {
        std::snprintf(line, sizeof line, "step %lld: loss %.9g, single-process %.9g",
                      static_cast<long long>(step), *loss, want);
        return Fail(rank, line);
      }
    }
  }

  dump_collectives("after");
  if (time_steps && steps > 0) {
    const std::string line =
        examples::StepTimingLine(*(*world)->group(), step_ms, rss_before_model);
    if (rank == 0) Say(line);
  }

  if (verify) {
    auto checked = CompareParams(**trainer, *reference, rtol);
    if (!checked.ok()) return Fail(rank, std::string(checked.status().message()));
    Say("verified rank " + std::to_string(rank) + ": " + std::to_string(steps - resumed) +
        " losses and " + std::to_string(*checked) +
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
