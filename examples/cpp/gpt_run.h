#pragma once

// The main job's training of the plain-libtorch GPT (gpt.h) with AdamW on a
// (dp, fsdp, tp) mesh, through ModuleTrainer (module_trainer.h) with
// GptModel: GptTpPlan over "tp", FullyShard of every block and the root over
// "fsdp", DistributedDataParallel over "dp" (over FSDP shards: HSDP). What
// train_text needs of a run: a step, an evaluation, logits for sampling,
// checkpoints with the optimizer's state, the parameters by name, and the
// training state a fault-tolerant heal copies.
//
//   auto run = GptRun::Create(world, config, seed, {.dp = 2, .tp = 2}, adamw,
//                             nullptr).value();
//   double loss = run->Step(tokens, targets).value();   // this world's batch
//
// Batches are the world's (or the replica group's): every rank passes the
// same one and trains on its data-parallel rows. With a ReplicaGradientSync
// (fault-tolerant replicas, or their replay) the step's gradients and loss
// are averaged across the replicas too, and a step the sync discards
// answers ABORTED with nothing applied.

#include <torch/optim/adamw.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "worker_lib/mesh/process_group.h"
#include "worker_lib/models/gpt.h"
#include "worker_lib/training/module_trainer.h"

namespace meshrun::worker::examples {

class GptRun {
 public:
  // The mesh's sizes; a parallelism runs where its size is > 1.
  struct Sizes {
    int dp = 1;
    int fsdp = 1;
    int tp = 1;
  };

  static absl::StatusOr<std::unique_ptr<GptRun>> Create(
      std::shared_ptr<World> world, const models::GptConfig& config, uint64_t seed,
      const Sizes& sizes, const torch::optim::AdamWOptions& adamw,
      parallel::ReplicaGradientSync* replica_sync) {
    const auto layout =
        parallel::ModuleLayout::FromSizes(sizes.dp, sizes.fsdp, 1, sizes.tp);
    torch::manual_seed(seed);
    auto run = std::unique_ptr<GptRun>(new GptRun(models::Gpt(config)));
    auto trainer = parallel::ModuleTrainer::Create(
        std::move(world), layout,
        models::GptModel(run->gpt_, /*vocab_parallel_head=*/false),
        [adamw](std::vector<at::Tensor> params) {
          return std::make_unique<torch::optim::AdamW>(std::move(params), adamw);
        },
        replica_sync);
    if (!trainer.ok()) return trainer.status();
    run->trainer_ = *std::move(trainer);
    return run;
  }

  // One step on this world's batch ([B, T] tokens and targets): the mean
  // loss over it, or ABORTED when a replica sync discarded the step.
  absl::StatusOr<double> Step(const at::Tensor& tokens, const at::Tensor& targets) {
    return trainer_->Step(tokens, targets);
  }
  absl::StatusOr<double> Evaluate(const at::Tensor& tokens, const at::Tensor& targets) {
    return trainer_->Evaluate(tokens, targets);
  }
  // Logits [B, T, vocab] for tokens every rank passes alike.
  absl::StatusOr<at::Tensor> Predict(const at::Tensor& tokens) {
    return trainer_->Predict(tokens);
  }

  // Sharded checkpoint of the model and AdamW's state (module_checkpoint.h):
  // the first dp replica writes. Collective (barriers around the files).
  absl::Status Save(const std::string& dir) { return trainer_->Save(dir); }
  absl::Status Load(const std::string& dir) { return trainer_->Load(dir); }

  // The parameters by their state-dict names (shards with their global
  // shapes): LocalValues, LoadShards, FullTensor.
  const std::vector<std::shared_ptr<parallel::Param>>& Params() const {
    return trainer_->Params();
  }
  int64_t ParameterCount() const {
    int64_t count = 0;
    for (const auto& param : Params()) {
      int64_t numel = 1;
      for (int64_t size : param->global_shape()) numel *= size;
      count += numel;
    }
    return count;
  }
  parallel::TrainingState& training_state() { return trainer_->training_state(); }
  // "dp=2 fsdp=1 pp=1 tp=2: TP plan over tp, DDP over dp (torch::nn GPT,
  // AdamW)".
  std::string Describe() const {
    return absl::StrCat(trainer_->layout().ToString(), " (torch::nn GPT, AdamW)");
  }

 private:
  explicit GptRun(models::Gpt gpt) : gpt_(std::move(gpt)) {}

  models::Gpt gpt_;
  std::unique_ptr<parallel::ModuleTrainer> trainer_;
};

}  // namespace meshrun::worker::examples
