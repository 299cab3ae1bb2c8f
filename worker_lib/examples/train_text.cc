// The main job: a small GPT-style character-level language model (the
// TransformerLm of transformer.h) trained on real text — by default the
// fortune cookies of Debian's `fortunes` package — on a dp x tp mesh, with
// validation loss, sharded checkpoints, a failure it heals, and text sampled
// at the end. Run by scripts/main-job.sh:
//
//   meshrun --standalone --nproc-per-node=4 --max-restarts=2 build/bin/train_text
//       --dp 2 --tp 2 --steps 300 --checkpoint-dir run/ckpt --kill-at-step 150
//       --log run/loss.csv
//
// Resuming: a checkpoint "step-N" holds the parameters after N steps (SGD
// keeps no other state), and the batch of step s depends on (seed, s) alone,
// so a run restarted from the latest checkpoint continues exactly as an
// uninterrupted run would. --kill-at-step makes one rank SIGKILL itself on
// the first attempt (TORCHELASTIC_RESTART_COUNT 0) before that step, so that
// meshrun stops and restarts the world. --save-final / --compare-with check
// that claim: a run that was healed ends with the final loss and parameters
// of one that was not.
//
// Rank 0 prints progress lines, validation losses and the sample, and
// appends one CSV row per step to --log (attempt, step, loss, validation
// loss where evaluated, seconds into the attempt) for the loss plot.
//
// Exit codes: 0 done (and verified), 1 a failure or a mismatch, 2 bad flags.

#include <ATen/CPUGeneratorImpl.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "worker_lib/examples/example_output.h"
#include "worker_lib/parallel/checkpoint.h"
#include "worker_lib/parallel/text_corpus.h"
#include "worker_lib/parallel/trainer.h"
#include "worker_lib/parallel/transformer.h"
#include "worker_lib/process_group.h"

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

// The latest complete checkpoint's step (the file rank 0 writes after every
// rank's shards are in), if any.
std::optional<int64_t> LatestCheckpoint(const std::string& dir) {
  std::ifstream in(fs::path(dir) / "latest");
  int64_t step;
  if (in >> step) return step;
  return std::nullopt;
}

std::string CheckpointPath(const std::string& dir, int64_t step) {
  return (fs::path(dir) / absl::StrFormat("step-%06d", step)).string();
}

bool WriteAtomically(const fs::path& path, const std::string& text) {
  const fs::path partial = path.string() + ".partial";
  {
    std::ofstream out(partial, std::ios::trunc);
    out << text;
    if (!out.good()) return false;
  }
  std::error_code error;
  fs::rename(partial, path, error);
  return !error;
}

// Max over the world of a local double.
double MaxOverWorld(World& world, double value) {
  std::vector<at::Tensor> tensors{at::full({1}, value, at::kDouble)};
  world.group()->allreduce(tensors, {c10d::ReduceOp::MAX})->wait();
  return tensors[0].item<double>();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("meshrun main job: a character-level GPT on real text, healed mid-run");
  std::vector<std::string> corpus_paths{"/usr/share/games/fortunes"};
  TransformerConfig lm;
  lm.layers = 2;
  lm.d_model = 128;
  lm.heads = 4;
  lm.d_ff = 512;
  lm.seq = 64;
  TrainOptions options;
  options.layout.dp = 2;
  options.layout.tp = 2;
  options.lr = 0.5;
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
  std::string log_path, save_final, compare_with;
  int sample_chars = 300;
  app.add_option("--corpus", corpus_paths,
                 "text files, or a fortunes directory (default: Debian's fortunes)");
  app.add_option("--layers", lm.layers, "transformer blocks");
  app.add_option("--d-model", lm.d_model, "model width");
  app.add_option("--heads", lm.heads, "attention heads");
  app.add_option("--d-ff", lm.d_ff, "MLP hidden size");
  app.add_option("--seq", lm.seq, "context length (characters)");
  app.add_option("--dp", options.layout.dp, "data-parallel replicas");
  app.add_option("--fsdp", options.layout.fsdp, "FSDP shards");
  app.add_option("--tp", options.layout.tp, "tensor-parallel ranks");
  app.add_option("--steps", steps, "training steps");
  app.add_option("--batch", batch, "global batch (sequences)");
  app.add_option("--lr", options.lr, "SGD learning rate");
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
  app.add_option("--log", log_path, "rank 0 appends a CSV row per step here");
  // The last one counts: scripts/main-job.sh overrides what it passed before.
  app.add_option("--sample", sample_chars, "characters of text to sample at the end")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  app.add_option("--save-final", save_final,
                 "write the final parameters and losses here (a reference run)");
  app.add_option("--compare-with", compare_with,
                 "check the final loss and parameters against a --save-final directory");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;  // --help is 0; any bad flag is 2
  }
  if (kill_at_step >= 0 && checkpoint_dir.empty()) {
    std::cerr << "--kill-at-step needs --checkpoint-dir (the restart resumes from it)\n";
    return 2;
  }
  if (options.layout.pp != 1) {
    std::cerr << "train_text evaluates and samples, which pipeline parallelism lacks\n";
    return 2;
  }

  auto world_or = InitProcessGroup("gloo");
  if (!world_or.ok()) return Fail(-1, std::string(world_or.status().message()));
  std::shared_ptr<World> world = *world_or;
  const int rank = world->rank();
  const int attempt = world->env().restart_count;
  if (kill_rank < 0) kill_rank = world->size() - 1;

  // The corpus: a directory is read as fortunes, anything else as text files.
  CorpusOptions corpus_options;
  corpus_options.validation_fraction = validation_fraction;
  corpus_options.vocab_multiple = 8 * options.layout.tp;
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

  auto trainer_or = Trainer::Create(world, TransformerModel(lm, seed), options);
  if (!trainer_or.ok()) return Fail(rank, std::string(trainer_or.status().message()));
  Trainer& trainer = **trainer_or;
  if (rank == 0) {
    int64_t params = 0;
    for (const auto& [name, value] : trainer.GatherFullParams()) params += value.numel();
    Say(absl::StrFormat(
        "main job: a character-level GPT (%d blocks, d_model %d, %d heads, context %d, "
        "vocabulary %d, %.2f M parameters) on %.1f MB of text (%.1f MB held out), "
        "global batch %d x %d characters, layout %s, attempt %d",
        lm.layers, lm.d_model, lm.heads, lm.seq, lm.vocab, params / 1e6,
        (corpus->size(Split::kTrain) + corpus->size(Split::kValidation)) / 1e6,
        corpus->size(Split::kValidation) / 1e6, batch, lm.seq, trainer.Describe(),
        attempt));
  } else {
    // Only rank 0 gathers for the count above; the others take part.
    trainer.GatherFullParams();
  }

  int64_t first_step = 0;
  if (!checkpoint_dir.empty()) {
    if (auto latest = LatestCheckpoint(checkpoint_dir)) {
      if (auto status = trainer.Load(CheckpointPath(checkpoint_dir, *latest));
          !status.ok())
        return Fail(rank, std::string(status.message()));
      first_step = *latest;
      if (rank == 0)
        Say(absl::StrFormat("resumed from the checkpoint after step %d (%s)", first_step,
                            CheckpointPath(checkpoint_dir, first_step)));
    }
  }

  std::ofstream log;
  if (rank == 0 && !log_path.empty()) {
    const bool fresh = !fs::exists(log_path) || fs::file_size(log_path) == 0;
    log.open(log_path, std::ios::app);
    if (fresh) log << "attempt,step,loss,val_loss,seconds\n";
  }

  auto validation_loss = [&]() -> absl::StatusOr<double> {
    double sum = 0;
    for (int64_t b = 0; b < eval_batches; ++b) {
      auto [input, target] =
          ToTensors(corpus->Windows(Split::kValidation, seed, b, batch, lm.seq));
      auto loss = trainer.Evaluate(input, target);
      if (!loss.ok()) return loss.status();
      sum += *loss;
    }
    return sum / static_cast<double>(eval_batches);
  };

  const auto start = Clock::now();
  double loss = 0;
  double last_validation = -1;
  for (int64_t step = first_step; step < steps; ++step) {
    if (attempt == 0 && step == kill_at_step && rank == kill_rank) {
      Say(absl::StrFormat(
          "main job: rank %d kills itself (SIGKILL) before step %d, as --kill-at-step "
          "asks; "
          "meshrun restarts the world and training resumes from the last checkpoint",
          rank, step));
      std::raise(SIGKILL);
    }
    auto [input, target] =
        ToTensors(corpus->Windows(Split::kTrain, seed, step, batch, lm.seq));
    auto step_loss = trainer.Step(input, target);
    if (!step_loss.ok()) return Fail(rank, std::string(step_loss.status().message()));
    loss = *step_loss;
    const int64_t done = step + 1;
    std::optional<double> validation;
    if ((eval_every > 0 && done % eval_every == 0) || done == steps) {
      auto v = validation_loss();
      if (!v.ok()) return Fail(rank, std::string(v.status().message()));
      validation = last_validation = *v;
    }
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    if (rank == 0) {
      if (log.is_open()) {
        log << attempt << ',' << done << ',' << absl::StrFormat("%.9g", loss) << ','
            << (validation ? absl::StrFormat("%.9g", *validation) : "") << ','
            << absl::StrFormat("%.3f", seconds) << '\n'
            << std::flush;
      }
      if (done % progress_every == 0 || validation || done == steps) {
        const double per_step = seconds / static_cast<double>(done - first_step);
        Say(absl::StrFormat(
            "step %4d/%d | loss %.4f%s | %.0f tokens/s | elapsed %s | eta %s", done,
            steps, loss, validation ? absl::StrFormat(" | val %.4f", *validation) : "",
            static_cast<double>(batch * lm.seq) / per_step, Duration(seconds),
            Duration(per_step * static_cast<double>(steps - done))));
      }
    }
    if (!checkpoint_dir.empty() && checkpoint_every > 0 && done % checkpoint_every == 0 &&
        done < steps) {
      // Shards first (Save ends with a barrier), then the marker that makes
      // them the latest: a crash in between resumes from the one before.
      if (auto status = trainer.Save(CheckpointPath(checkpoint_dir, done)); !status.ok())
        return Fail(rank, std::string(status.message()));
      if (rank == 0 && !WriteAtomically(fs::path(checkpoint_dir) / "latest",
                                        std::to_string(done) + "\n"))
        return Fail(rank, "cannot write " + checkpoint_dir + "/latest");
    }
  }
  if (rank == 0)
    Say(absl::StrFormat("final: step %d, train loss %.9g, validation loss %.9g", steps,
                        loss, last_validation));

  // A sample: every rank runs the same forwards (the model is split over
  // them) and draws the same characters from the same generator.
  if (sample_chars > 0) {
    at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(seed + 7);
    std::vector<int64_t> context = corpus->Encode("\n");
    std::string text;
    for (int i = 0; i < sample_chars; ++i) {
      const size_t keep = std::min<size_t>(context.size(), static_cast<size_t>(lm.seq));
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
    if (rank == 0)
      Say("sampled text (temperature 0.8):\n" + text + "\n--- end of sample");
  }

  if (!save_final.empty()) {
    if (auto status = trainer.Save(save_final); !status.ok())
      return Fail(rank, std::string(status.message()));
    if (rank == 0 &&
        !WriteAtomically(fs::path(save_final) / "final_loss",
                         absl::StrFormat("%.9g %.9g\n", loss, last_validation)))
      return Fail(rank, "cannot write " + save_final + "/final_loss");
  }
  if (!compare_with.empty()) {
    // The reference's parameters loaded over this rank's own (the run is
    // over), compared with a copy of them taken first.
    std::vector<at::Tensor> mine;
    for (const auto& param : trainer.Params())
      mine.push_back(param->LocalValues().clone());
    world->group()->barrier()->wait();
    if (auto status = LoadShards(compare_with, trainer.Params()); !status.ok())
      return Fail(rank, "--compare-with: " + std::string(status.message()));
    double max_relative = 0;
    auto params = trainer.Params();
    for (size_t i = 0; i < params.size(); ++i) {
      const at::Tensor want = params[i]->LocalValues().to(at::kDouble);
      const double scale = want.norm().item<double>();
      const double diff = (mine[i].to(at::kDouble) - want).norm().item<double>();
      max_relative = std::max(max_relative, scale == 0 ? diff : diff / scale);
    }
    max_relative = MaxOverWorld(*world, max_relative);
    double want_loss = 0, want_validation = 0;
    std::ifstream(fs::path(compare_with) / "final_loss") >> want_loss >> want_validation;
    const bool same =
        max_relative <= 1e-6 && std::abs(loss - want_loss) <= 1e-6 * std::abs(want_loss);
    if (rank == 0) {
      Say(absl::StrFormat(
          "%s: final train loss %.9g vs %.9g uninterrupted; %d parameter tensors, max "
          "relative "
          "difference %.3g",
          same ? "verified" : "MISMATCH", loss, want_loss, params.size(), max_relative));
    }
    if (!same) return 1;
  }
  // No rank leaves while a peer may still be reading from it.
  world->group()->barrier()->wait();
  return 0;
}
