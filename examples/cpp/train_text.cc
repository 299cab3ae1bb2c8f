// The main job: a small character-level GPT written in plain libtorch
// (worker_lib/models/gpt.h, torch::nn modules) trained with AdamW on real
// text — by default the fortune cookies of Debian's `fortunes` package — on
// a (dp, fsdp, tp) mesh through the torch::nn::Module API (gpt_run.h: the TP
// plan, FullyShard, DistributedDataParallel), with validation loss, sharded
// checkpoints of the model and AdamW's state, a failure it heals, and text
// sampled at the end. Run by scripts/main-job.sh:
//
//   meshrun --standalone --nproc-per-node=4 --max-restarts=2 build/bin/train_text
//       --dp 2 --tp 2 --steps 300 --checkpoint-dir run/ckpt --kill-at-step 150
//       --log run/loss.csv
//
// Resuming: a checkpoint "step-N" holds the parameters and AdamW's moments
// and step after N steps, and the batch of step s depends on (seed, s)
// alone, so a run restarted from the latest checkpoint continues exactly as
// an uninterrupted run would. --kill-at-step makes one rank SIGKILL itself on
// the first attempt (TORCHELASTIC_RESTART_COUNT 0) before that step, so that
// meshrun stops and restarts the world. --save-final / --compare-with check
// that claim: a run that was healed ends with the final loss and parameters
// of one that was not.
//
// --fault-tolerant (under `meshrun --restart-scope=replica
// --replica-size=<tp>`): the --dp replicas are fault-tolerant replica groups
// (worker_lib/training/fault_tolerant.h). A killed worker's group restarts
// alone and copies the parameters and AdamW's state from a live replica
// (module_fault_tolerance.h), while the others
// keep training without a restart or a checkpoint; each step's gradients
// are averaged over the replicas that took part. --save-final then writes
// each replica's parameters (DIR/replica-<r>) and the participants of every
// committed step (DIR/history), and a reference run with --replay-history
// DIR/history (no --fault-tolerant, --dp 1) trains each step again once per
// replica that took part, on its rows, averaging their gradients as the
// replicas did (ReplayedReplicaSync), so that --compare-with DIR checks
// every replica.
//
// Rank 0 (fault-tolerant: member 0 of the lowest participating replica)
// prints progress lines, validation losses and the sample, and appends one
// CSV row per step to --log (attempt, step, loss, validation loss where
// evaluated, seconds into the attempt, replicas that trained the step) for
// the loss plot.
//
// Exit codes: 0 done (and verified), 1 a failure or a mismatch, 2 bad flags.

#include <ATen/CPUGeneratorImpl.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "examples/cpp/example_output.h"
#include "examples/cpp/gpt_run.h"
#include "worker_lib/data/data.h"
#include "worker_lib/data/text_corpus.h"
#include "worker_lib/mesh/process_group.h"
#include "worker_lib/training/checkpoint.h"
#include "worker_lib/training/checkpoint_series.h"
#include "worker_lib/training/fault_tolerant.h"

namespace {

namespace fs = std::filesystem;
using namespace meshrun::worker;
using namespace meshrun::worker::parallel;
using Clock = std::chrono::steady_clock;

using examples::Say;

int Fail(int rank, const std::string& what) {
  return examples::Fail("train_text", rank, what);
}

std::pair<at::Tensor, at::Tensor> ToTensors(const TokenWindows& w) {
  auto tensor = [&](const std::vector<int64_t>& ids) {
    return at::tensor(ids, at::kLong).view({w.batch, w.seq});
  };
  return {tensor(w.tokens), tensor(w.targets)};
}

std::string Duration(double seconds) {
  const int s = static_cast<int>(seconds + 0.5);
  return s >= 60 ? absl::StrFormat("%dm%02ds", s / 60, s % 60)
                 : absl::StrFormat("%ds", s);
}

// Max over the world of a local double.
double MaxOverWorld(World& world, double value) {
  std::vector<at::Tensor> tensors{at::full({1}, value, at::kDouble)};
  world.group()->allreduce(tensors, {c10d::ReduceOp::MAX})->wait();
  return tensors[0].item<double>();
}

// Which replicas trained each committed step of a fault-tolerant run: its
// --save-final DIR/history, read back by --replay-history. Text: "replicas
// N", then a line per step with its participants ("0,1").
struct StepHistory {
  int replicas = 1;
  std::vector<std::vector<uint32_t>> steps;
};

bool WriteHistory(const fs::path& path, const StepHistory& history) {
  std::ofstream out(path, std::ios::trunc);
  out << "replicas " << history.replicas << '\n';
  for (const auto& participants : history.steps)
    out << absl::StrJoin(participants, ",") << '\n';
  out.flush();
  return out.good();
}

absl::StatusOr<StepHistory> ReadHistory(const std::string& path) {
  std::ifstream in(path);
  std::string word;
  StepHistory history;
  if (!(in >> word >> history.replicas) || word != "replicas" || history.replicas < 1)
    return absl::InvalidArgumentError(path + ": not a step history (no \"replicas N\")");
  std::string line;
  std::getline(in, line);
  while (std::getline(in, line)) {
    std::vector<uint32_t> participants;
    for (absl::string_view field : absl::StrSplit(line, ',')) {
      uint32_t replica = 0;
      if (!absl::SimpleAtoi(field, &replica) ||
          replica >= static_cast<uint32_t>(history.replicas))
        return absl::InvalidArgumentError(path + ": bad line \"" + line + "\"");
      participants.push_back(replica);
    }
    history.steps.push_back(std::move(participants));
  }
  return history;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("meshrun main job: a character-level GPT on real text, healed mid-run");
  std::vector<std::string> corpus_paths{"/usr/share/games/fortunes"};
  models::GptConfig lm;
  lm.layers = 2;
  lm.dim = 128;
  lm.heads = 4;
  lm.context = 64;
  examples::GptRun::Sizes layout{/*dp=*/2, /*fsdp=*/1, /*tp=*/2};
  double lr = 6e-3;
  double weight_decay = 0.1;
  int64_t steps = 300;
  int64_t batch = 32;
  uint64_t seed = 0;
  double validation_fraction = 0.05;
  int64_t eval_every = 25;
  int64_t eval_batches = 4;
  int64_t progress_every = 10;
  std::string checkpoint_dir;
  int64_t checkpoint_every = 50;
  int64_t kill_at_step = -1;
  int kill_rank = -1;
  bool fault_tolerant = false;
  std::string log_path, save_final, compare_with, replay_history;
  int sample_chars = 300;
  app.add_option("--corpus", corpus_paths,
                 "text files, or a fortunes directory (default: Debian's fortunes)");
  app.add_option("--layers", lm.layers, "transformer blocks");
  app.add_option("--d-model", lm.dim, "model width (the MLP is 4x as wide)");
  app.add_option("--heads", lm.heads, "attention heads");
  app.add_option("--seq", lm.context, "context length (characters)");
  app.add_option("--dp", layout.dp, "data-parallel replicas (DistributedDataParallel)");
  app.add_option("--fsdp", layout.fsdp, "FSDP shards (FullyShard)");
  app.add_option("--tp", layout.tp, "tensor-parallel ranks (the GPT's TP plan)");
  app.add_option("--steps", steps, "training steps");
  app.add_option("--batch", batch, "global batch (sequences)");
  app.add_option("--lr", lr, "AdamW learning rate");
  app.add_option("--weight-decay", weight_decay, "AdamW weight decay");
  app.add_option("--seed", seed, "model and data seed");
  app.add_option("--validation-fraction", validation_fraction,
                 "the corpus's tail held out for validation");
  app.add_option("--eval-every", eval_every, "validation loss every N steps (0: never)");
  app.add_option("--eval-batches", eval_batches, "validation batches per evaluation");
  app.add_option("--progress-every", progress_every, "a progress line every N steps")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--checkpoint-dir", checkpoint_dir,
                 "sharded checkpoints here; a restart resumes from the latest");
  app.add_option("--checkpoint-every", checkpoint_every, "checkpoint every N steps");
  app.add_option("--kill-at-step", kill_at_step,
                 "on the first attempt, one rank SIGKILLs itself before this step");
  app.add_option("--kill-rank", kill_rank,
                 "the rank --kill-at-step kills (default: the last)");
  app.add_flag("--fault-tolerant", fault_tolerant,
               "the --dp replicas survive each other's failures (run under meshrun "
               "--restart-scope=replica --replica-size=<tp x fsdp>)");
  app.add_option("--log", log_path, "rank 0 appends a CSV row per step here");
  // The last one counts: scripts/main-job.sh overrides what it passed before.
  app.add_option("--sample", sample_chars, "characters of text to sample at the end")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--save-final", save_final,
                 "write the final parameters and losses here (a reference run)");
  app.add_option("--compare-with", compare_with,
                 "check the final loss and parameters against a --save-final directory");
  app.add_option("--replay-history", replay_history,
                 "replay a fault-tolerant run's committed steps (its --save-final "
                 "DIR/history): each replica that trained a step, on its rows");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;  // --help is 0; any bad flag is 2
  }
  if (kill_at_step >= 0 && checkpoint_dir.empty() && !fault_tolerant) {
    std::cerr << "--kill-at-step needs --checkpoint-dir (the restart resumes from it) or "
                 "--fault-tolerant\n";
    return 2;
  }
  if (fault_tolerant && (!checkpoint_dir.empty() || !replay_history.empty())) {
    std::cerr << "--fault-tolerant recovers from live replicas: it takes no "
                 "--checkpoint-dir or --replay-history\n";
    return 2;
  }
  if (fault_tolerant && batch % layout.dp != 0) {
    std::cerr << "--fault-tolerant: --batch " << batch << " does not split into --dp "
              << layout.dp << " replicas\n";
    return 2;
  }
  std::optional<StepHistory> replay;
  if (!replay_history.empty()) {
    auto read = ReadHistory(replay_history);
    if (!read.ok()) {
      std::cerr << read.status().message() << "\n";
      return 2;
    }
    if (static_cast<int64_t>(read->steps.size()) < steps || batch % read->replicas != 0) {
      std::cerr << replay_history << ": " << read->steps.size() << " steps of "
                << read->replicas << " replicas; --steps " << steps << " and --batch "
                << batch << " do not fit it\n";
      return 2;
    }
    replay = *std::move(read);
  }

  auto env = WorkerEnvFromProcessEnvironment();
  if (!env.ok()) return Fail(-1, std::string(env.status().message()));
  const int rank = env->rank;
  const int attempt = env->restart_count;
  if (kill_rank < 0) kill_rank = env->world_size - 1;

  // The world this process trains in: the job's, or (fault-tolerant) its
  // replica group's, with the replicas as the data-parallel dimension.
  std::shared_ptr<World> world;
  std::optional<ReplicaIdentity> id;
  std::unique_ptr<FaultTolerantReplicas> replicas;
  const int num_replicas = layout.dp;
  ReplicaGradientSync* replica_sync = nullptr;
  if (fault_tolerant) {
    auto identity = ReplicaIdentityFromEnv(*env, num_replicas);
    if (!identity.ok()) return Fail(rank, std::string(identity.status().message()));
    id = *std::move(identity);
    if (const std::string warning = RestartScopeWarning(*id);
        rank == 0 && !warning.empty())
      Say(warning);
    auto group_world = InitReplicaGroupWorld(*id);
    if (!group_world.ok()) return Fail(rank, std::string(group_world.status().message()));
    world = *std::move(group_world);
    FaultToleranceOptions ft_options;
    ft_options.steps = static_cast<uint64_t>(steps);
    auto created = FaultTolerantReplicas::Create(world, *id, ft_options);
    if (!created.ok()) return Fail(rank, std::string(created.status().message()));
    replicas = *std::move(created);
    layout.dp = 1;  // the replicas are the data-parallel dimension
    replica_sync = replicas.get();
    Say(absl::StrFormat("rank %d pid %d: replica %d member %d, incarnation %d", rank,
                        getpid(), id->replica, id->member, id->incarnation));
  } else {
    auto world_or = InitProcessGroup("gloo");
    if (!world_or.ok()) return Fail(-1, std::string(world_or.status().message()));
    world = *std::move(world_or);
  }
  ReplayedReplicaSync replayed;
  if (replay) replica_sync = &replayed;

  // The corpus: a directory is read as fortunes, anything else as text files.
  CorpusOptions corpus_options;
  corpus_options.validation_fraction = validation_fraction;
  corpus_options.vocab_multiple = 8 * layout.tp;
  absl::StatusOr<TextCorpus> corpus = absl::UnknownError("no corpus");
  if (corpus_paths.size() == 1 && fs::is_directory(corpus_paths[0])) {
    auto text = ReadFortunes(corpus_paths[0]);
    if (!text.ok()) return Fail(rank, std::string(text.status().message()));
    corpus = TextCorpus::FromText(*std::move(text), corpus_options);
  } else {
    corpus = TextCorpus::FromFiles(corpus_paths, corpus_options);
  }
  if (!corpus.ok()) return Fail(rank, std::string(corpus.status().message()));
  lm.vocab = corpus->vocab_size();

  auto adamw =
      torch::optim::AdamWOptions(lr).betas({0.9, 0.99}).weight_decay(weight_decay);
  auto run_or = examples::GptRun::Create(world, lm, seed, layout, adamw, replica_sync);
  if (!run_or.ok()) return Fail(rank, std::string(run_or.status().message()));
  examples::GptRun& trainer = **run_or;
  if (rank == 0) {
    Say(absl::StrFormat(
        "main job: a character-level GPT in plain libtorch (%d blocks, d_model %d, %d "
        "heads, "
        "context %d, vocabulary %d, %.2f M parameters) on %.1f MB of text (%.1f MB held "
        "out), global batch %d x %d characters, layout %s%s, attempt %d",
        lm.layers, lm.dim, lm.heads, lm.context, lm.vocab, trainer.ParameterCount() / 1e6,
        (corpus->size(Split::kTrain) + corpus->size(Split::kValidation)) / 1e6,
        corpus->size(Split::kValidation) / 1e6, batch, lm.context, trainer.Describe(),
        replicas ? absl::StrFormat(" x %d fault-tolerant replicas", num_replicas) : "",
        attempt));
  }

  int64_t first_step = 0;
  if (!checkpoint_dir.empty()) {
    auto resumed = ResumeFromLatestCheckpoint(
        [&](const std::string& dir) { return trainer.Load(dir); }, checkpoint_dir);
    if (!resumed.ok()) return Fail(rank, std::string(resumed.status().message()));
    first_step = *resumed;
    if (rank == 0 && first_step > 0)
      Say(absl::StrFormat("resumed from the checkpoint after step %d (%s)", first_step,
                          CheckpointStepPath(checkpoint_dir, first_step)));
  }

  std::ofstream log;
  auto append_log_row = [&](int64_t done, double loss, std::optional<double> validation,
                            double seconds, size_t trained_by) {
    if (log_path.empty()) return;
    if (!log.is_open()) {
      const bool fresh = !fs::exists(log_path) || fs::file_size(log_path) == 0;
      log.open(log_path, std::ios::app);
      if (fresh) log << "attempt,step,loss,val_loss,seconds,replicas\n";
    }
    log << attempt << ',' << done << ',' << absl::StrFormat("%.9g", loss) << ','
        << (validation ? absl::StrFormat("%.9g", *validation) : "") << ','
        << absl::StrFormat("%.3f", seconds) << ',' << trained_by << '\n'
        << std::flush;
  };

  auto validation_loss = [&]() -> absl::StatusOr<double> {
    double sum = 0;
    for (int64_t b = 0; b < eval_batches; ++b) {
      auto [input, target] =
          ToTensors(corpus->Windows(Split::kValidation, seed, b, batch, lm.context));
      auto loss = trainer.Evaluate(input, target);
      if (!loss.ok()) return loss.status();
      sum += *loss;
    }
    return sum / static_cast<double>(eval_batches);
  };

  const auto start = Clock::now();
  double loss = 0;
  double last_validation = -1;
  int64_t trained = 0;  // by this process, for its pace
  // Who reports: rank 0; fault-tolerant, member 0 of the lowest participant.
  bool reports = rank == 0;
  std::vector<uint32_t> participants;  // the step's replicas (fault-tolerant)
  int64_t step = first_step;
  while (true) {
    if (replicas) {
      auto quorum = replicas->BeginStep(trainer.training_state());
      if (!quorum.ok()) return Fail(rank, std::string(quorum.status().message()));
      if (!quorum->participating) continue;  // arrived late: the next quorum
      reports =
          id->member == 0 && id->replica == static_cast<int>(quorum->participants[0]);
      if (quorum->healed) {
        Say(absl::StrFormat(
            "replica %d member %d (rank %d) healed: the parameters and AdamW's state "
            "after %d steps copied from replica %d",
            id->replica, id->member, rank, quorum->step, quorum->source_replica));
      }
      if (reports && quorum->participants != participants &&
          static_cast<int64_t>(quorum->step) < steps) {
        Say(absl::StrFormat("step %d: %d of %d replicas train (%s)", quorum->step + 1,
                            quorum->participants.size(), num_replicas,
                            absl::StrJoin(quorum->participants, ",")));
      }
      participants = quorum->participants;
      step = static_cast<int64_t>(quorum->step);
    }
    if (step >= steps) break;
    if (attempt == 0 && (!id || id->incarnation == 0) && step == kill_at_step &&
        rank == kill_rank) {
      Say(absl::StrFormat(
          "main job: rank %d kills itself (SIGKILL) before step %d, as --kill-at-step "
          "asks; %s",
          rank, step + 1,
          replicas ? "meshrun restarts its replica group alone, which heals from a live "
                     "replica while the others train on"
                   : "meshrun restarts the world and training resumes from the last "
                     "checkpoint"));
      std::raise(SIGKILL);
    }
    auto [input, target] =
        ToTensors(corpus->Windows(Split::kTrain, seed, step, batch, lm.context));
    size_t trained_by = static_cast<size_t>(num_replicas);
    absl::StatusOr<double> step_loss;
    if (replicas) {
      trained_by = participants.size();
      step_loss = trainer.Step(DataShard(input, num_replicas, id->replica),
                               DataShard(target, num_replicas, id->replica));
    } else if (replay) {
      // Each replica that trained the step on its rows, as they did; the
      // last one applies their average (ReplayedReplicaSync).
      const auto& who = replay->steps[static_cast<size_t>(step)];
      trained_by = who.size();
      replayed.BeginStep(who.size());
      for (uint32_t r : who) {
        step_loss = trainer.Step(DataShard(input, replay->replicas, r),
                                 DataShard(target, replay->replicas, r));
        if (r != who.back() && absl::IsAborted(step_loss.status())) continue;
        break;
      }
    } else {
      step_loss = trainer.Step(input, target);
    }
    if (replicas && absl::IsAborted(step_loss.status())) {
      if (reports)
        Say(absl::StrFormat("step %d discarded: %s", step + 1,
                            replicas->last_discard_reason()));
      continue;  // trained again by whoever takes part in the next quorum
    }
    if (!step_loss.ok()) return Fail(rank, std::string(step_loss.status().message()));
    loss = *step_loss;
    ++trained;
    const int64_t done = step + 1;
    std::optional<double> validation;
    if ((eval_every > 0 && done % eval_every == 0) || done == steps) {
      auto v = validation_loss();
      if (!v.ok()) return Fail(rank, std::string(v.status().message()));
      validation = last_validation = *v;
    }
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    if (reports) {
      append_log_row(done, loss, validation, seconds, trained_by);
      if (done % progress_every == 0 || validation || done == steps) {
        const double per_step = seconds / static_cast<double>(trained);
        Say(absl::StrFormat(
            "step %4d/%d | loss %.4f%s | %.0f tokens/s | elapsed %s | eta %s", done,
            steps, loss, validation ? absl::StrFormat(" | val %.4f", *validation) : "",
            static_cast<double>(batch * lm.context) / per_step, Duration(seconds),
            Duration(per_step * static_cast<double>(steps - done))));
      }
    }
    if (!checkpoint_dir.empty() && checkpoint_every > 0 && done % checkpoint_every == 0 &&
        done < steps) {
      if (auto status = SaveCheckpointStep(
              [&](const std::string& dir) { return trainer.Save(dir); }, rank,
              checkpoint_dir, done);
          !status.ok())
        return Fail(rank, std::string(status.message()));
    }
    if (!replicas) step = done;
  }
  if (replicas && !replicas->history().empty()) {
    // The final words come from a replica that trained the last step (one
    // healed only at the end has no loss of its own).
    reports = id->member == 0 &&
              id->replica == static_cast<int>(replicas->history().back().front());
  }
  if (reports)
    Say(absl::StrFormat("final: step %d, train loss %.9g, validation loss %.9g", steps,
                        loss, last_validation));

  // A sample: every rank runs the same forwards (the model is split over
  // them) and draws the same characters from the same generator.
  if (sample_chars > 0) {
    at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(seed + 7);
    std::vector<int64_t> context = corpus->Encode("\n");
    std::string text;
    for (int i = 0; i < sample_chars; ++i) {
      const size_t keep =
          std::min<size_t>(context.size(), static_cast<size_t>(lm.context));
      std::vector<int64_t> window(context.end() - static_cast<std::ptrdiff_t>(keep),
                                  context.end());
      auto logits = trainer.Predict(
          at::tensor(window, at::kLong).view({1, static_cast<int64_t>(keep)}));
      if (!logits.ok()) return Fail(rank, std::string(logits.status().message()));
      at::Tensor last = (*logits)[0][static_cast<int64_t>(keep) - 1].div(0.8).softmax(0);
      const int64_t next = at::multinomial(last, 1, false, generator).item<int64_t>();
      context.push_back(next);
      text += corpus->Decode({next});
    }
    if (reports) Say("sampled text (temperature 0.8):\n" + text + "\n--- end of sample");
  }

  if (!save_final.empty()) {
    // Fault-tolerant: every replica its own parameters, and which replicas
    // trained each step, for a --replay-history reference.
    const std::string params_dir =
        replicas
            ? (fs::path(save_final) / absl::StrFormat("replica-%d", id->replica)).string()
            : save_final;
    if (auto status = trainer.Save(params_dir); !status.ok())
      return Fail(rank, std::string(status.message()));
    if (reports) {
      std::ofstream out(fs::path(save_final) / "final_loss", std::ios::trunc);
      out << absl::StrFormat("%.9g %.9g\n", loss, last_validation);
      out.flush();
      if (!out.good()) return Fail(rank, "cannot write " + save_final + "/final_loss");
      if (replicas && !WriteHistory(fs::path(save_final) / "history",
                                    StepHistory{num_replicas, replicas->history()}))
        return Fail(rank, "cannot write " + save_final + "/history");
    }
  }
  if (!compare_with.empty()) {
    // The reference's parameters loaded over this rank's own (the run is
    // over), compared with a copy of them taken first; a fault-tolerant
    // run's, every replica's.
    std::vector<std::string> references;
    for (const auto& entry : fs::directory_iterator(compare_with))
      if (entry.is_directory() &&
          entry.path().filename().string().rfind("replica-", 0) == 0)
        references.push_back(entry.path().string());
    std::sort(references.begin(), references.end());
    if (references.empty()) references.push_back(compare_with);
    std::vector<at::Tensor> mine;
    for (const auto& param : trainer.Params())
      mine.push_back(param->LocalValues().clone());
    world->group()->barrier()->wait();
    double max_relative = 0;
    auto params = trainer.Params();
    for (const std::string& reference : references) {
      if (auto status = LoadShards(reference, params); !status.ok())
        return Fail(rank, "--compare-with: " + std::string(status.message()));
      for (size_t i = 0; i < params.size(); ++i) {
        const at::Tensor want = params[i]->LocalValues().to(at::kDouble);
        const double scale = want.norm().item<double>();
        const double diff = (mine[i].to(at::kDouble) - want).norm().item<double>();
        max_relative = std::max(max_relative, scale == 0 ? diff : diff / scale);
      }
    }
    max_relative = MaxOverWorld(*world, max_relative);
    double want_loss = 0, want_validation = 0;
    std::ifstream(fs::path(compare_with) / "final_loss") >> want_loss >> want_validation;
    // Either run is the other's training, step for step: only rounding in
    // the gathered comparison itself may differ.
    constexpr double kTolerance = 1e-6;
    const bool same = max_relative <= kTolerance &&
                      std::abs(loss - want_loss) <= kTolerance * std::abs(want_loss);
    if (rank == 0) {
      Say(absl::StrFormat(
          "%s: final train loss %.9g vs %.9g %s; %d parameter tensors%s, max relative "
          "difference %.3g (tolerance %.3g)",
          same ? "verified" : "MISMATCH", loss, want_loss,
          replay ? "in the fault-tolerant run" : "uninterrupted", params.size(),
          references.size() > 1
              ? absl::StrFormat(" of each of %d replicas", references.size())
              : "",
          max_relative, kTolerance));
    }
    if (!same) return 1;
  }
  // No rank leaves while a peer may still be reading from it.
  world->group()->barrier()->wait();
  return 0;
}
