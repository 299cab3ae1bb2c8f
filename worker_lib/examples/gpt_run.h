#pragma once

// The main job's training of the plain-libtorch GPT (gpt.h) with AdamW on a
// (dp, fsdp, tp) mesh, through the torch::nn::Module API: GptTpPlan over
// "tp", FullyShard of every block and the root over "fsdp",
// DistributedDataParallel over "dp" (over FSDP shards: HSDP). What
// train_text needs of a run: a step, an evaluation, logits for sampling,
// checkpoints with the optimizer's state, the parameters by name, and the
// training state a fault-tolerant heal copies.
//
//   auto run = GptRun::Create(world, config, seed, layout, adamw, nullptr).value();
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
#include "worker_lib/device_mesh.h"
#include "worker_lib/examples/gpt.h"
#include "worker_lib/parallel/data.h"
#include "worker_lib/parallel/ddp.h"
#include "worker_lib/parallel/fully_shard.h"
#include "worker_lib/parallel/module_checkpoint.h"
#include "worker_lib/parallel/module_fault_tolerance.h"
#include "worker_lib/parallel/parallelize.h"
#include "worker_lib/parallel/trainer.h"
#include "worker_lib/process_group.h"

namespace meshrun::worker::examples {

class GptRun {
 public:
  static absl::StatusOr<std::unique_ptr<GptRun>> Create(
      std::shared_ptr<World> world, const GptConfig& config, uint64_t seed,
      const parallel::ParallelLayout& layout, const torch::optim::AdamWOptions& adamw,
      parallel::ReplicaGradientSync* replica_sync) {
    if (layout.pp != 1) return absl::InvalidArgumentError("GptRun: no pipeline stages");
    const int64_t size = static_cast<int64_t>(layout.dp) * layout.fsdp * layout.tp;
    if (size != world->size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("GptRun: layout ", layout.ToString(), " needs ", size,
                       " ranks, the world has ", world->size()));
    }
    auto mesh = InitDeviceMesh(world, "cpu", {layout.dp, layout.fsdp, layout.tp},
                               {{"dp", "fsdp", "tp"}});
    if (!mesh.ok()) return mesh.status();
    auto run =
        std::unique_ptr<GptRun>(new GptRun(std::move(world), *std::move(mesh), layout));
    torch::manual_seed(seed);
    run->gpt_ = Gpt(config);
    using parallel::ProcessGroupPtr;
    auto group = [&](const std::string& name) { return run->mesh_.GetGroup(name); };
    if (layout.tp > 1) {
      auto tp = group("tp");
      if (!tp.ok()) return tp.status();
      if (auto s = parallel::ParallelizeModule(*run->gpt_, "tp", *tp, GptTpPlan());
          !s.ok())
        return s;
    }
    if (layout.fsdp > 1) {
      auto fsdp = group("fsdp");
      if (!fsdp.ok()) return fsdp.status();
      for (const auto& block : *run->gpt_->blocks) {
        if (auto s = parallel::FullyShard(*block, "fsdp", *fsdp); !s.ok()) return s;
      }
      if (auto s = parallel::FullyShard(*run->gpt_, "fsdp", *fsdp); !s.ok()) return s;
    }
    if (layout.dp > 1) {
      auto dp = group("dp");
      if (!dp.ok()) return dp.status();
      auto ddp = parallel::DistributedDataParallel::Wrap(*run->gpt_, *dp);
      if (!ddp.ok()) return ddp.status();
      run->ddp_ = *std::move(ddp);
    }
    // The ranks that hold different rows: dp x fsdp (the tp ranks of one
    // share them). A flattened group over both.
    auto data = run->mesh_[{"dp", "fsdp"}];
    if (!data.ok()) return data.status();
    auto flat = data->Flatten("data");
    if (!flat.ok()) return flat.status();
    auto data_group = flat->GetGroup();
    if (!data_group.ok()) return data_group.status();
    run->data_group_ = *data_group;
    run->optimizer_ =
        std::make_unique<torch::optim::AdamW>(run->gpt_->parameters(), adamw);
    run->state_ =
        std::make_unique<parallel::ModuleTrainingState>(*run->gpt_, *run->optimizer_);
    run->replica_sync_ = replica_sync;
    return run;
  }

  // One step on this world's batch ([B, T] tokens and targets): the mean
  // loss over it, or ABORTED when a replica sync discarded the step.
  absl::StatusOr<double> Step(const at::Tensor& tokens, const at::Tensor& targets) {
    try {
      optimizer_->zero_grad();
      at::Tensor loss = Loss(MyRows(tokens), MyRows(targets));
      loss.backward();
      double value = MeanOverData(loss.item<double>());
      if (replica_sync_ != nullptr) {
        absl::StatusOr<bool> commit = replica_sync_->Sync(state_->params(), &value);
        if (!commit.ok()) return commit.status();
        if (!*commit) return absl::AbortedError("the step was discarded");
      }
      optimizer_->step();
      return value;
    } catch (const std::exception& e) {
      return absl::InternalError(absl::StrCat("step: ", e.what()));
    }
  }

  absl::StatusOr<double> Evaluate(const at::Tensor& tokens, const at::Tensor& targets) {
    try {
      at::NoGradGuard no_grad;
      return MeanOverData(Loss(MyRows(tokens), MyRows(targets)).item<double>());
    } catch (const std::exception& e) {
      return absl::InternalError(absl::StrCat("evaluate: ", e.what()));
    }
  }

  // Logits [B, T, vocab] for tokens every rank passes alike.
  absl::StatusOr<at::Tensor> Predict(const at::Tensor& tokens) {
    try {
      at::NoGradGuard no_grad;
      return gpt_->forward(tokens);
    } catch (const std::exception& e) {
      return absl::InternalError(absl::StrCat("predict: ", e.what()));
    }
  }

  // Sharded checkpoint of the model and AdamW's state (module_checkpoint.h):
  // the first dp replica writes. Collective (barriers around the files).
  absl::Status Save(const std::string& dir) {
    absl::Status status;
    if (dp_index() == 0)
      status = parallel::SaveModule(dir, absl::StrCat("rank", world_->rank()), *gpt_,
                                    optimizer_.get());
    world_->group()->barrier()->wait();
    return status;
  }
  absl::Status Load(const std::string& dir) {
    world_->group()->barrier()->wait();
    return parallel::LoadModule(dir, *gpt_, optimizer_.get());
  }

  // The parameters by their state-dict names (shards with their global
  // shapes): LocalValues, LoadShards, FullTensor.
  const std::vector<std::shared_ptr<parallel::Param>>& Params() const {
    return state_->params();
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
  parallel::TrainingState& training_state() { return *state_; }
  std::string Describe() const {
    return absl::StrCat(layout_.ToString(),
                        " (torch::nn GPT: ", layout_.tp > 1 ? "TP plan over tp, " : "",
                        layout_.fsdp > 1 ? "FullyShard over fsdp, " : "",
                        layout_.dp > 1 ? "DistributedDataParallel over dp, " : "",
                        "AdamW)");
  }

 private:
  GptRun(std::shared_ptr<World> world, DeviceMesh mesh,
         const parallel::ParallelLayout& layout)
      : world_(std::move(world)), mesh_(std::move(mesh)), layout_(layout) {}

  int dp_index() const { return mesh_.GetLocalRank("dp").value_or(0); }

  at::Tensor MyRows(const at::Tensor& batch) const {
    return parallel::DataShard(batch, data_group_->getSize(), data_group_->getRank());
  }

  at::Tensor Loss(const at::Tensor& tokens, const at::Tensor& targets) {
    at::Tensor logits = gpt_->forward(tokens);
    return at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}),
                                  targets.reshape({-1}));
  }

  double MeanOverData(double local) {
    std::vector<at::Tensor> tensors{at::full({1}, local, at::kDouble)};
    data_group_->allreduce(tensors)->wait();
    return tensors[0].item<double>() / static_cast<double>(data_group_->getSize());
  }

  std::shared_ptr<World> world_;
  DeviceMesh mesh_;
  parallel::ParallelLayout layout_;
  Gpt gpt_{nullptr};
  std::unique_ptr<parallel::DistributedDataParallel> ddp_;
  parallel::ProcessGroupPtr data_group_;
  std::unique_ptr<torch::optim::AdamW> optimizer_;
  std::unique_ptr<parallel::ModuleTrainingState> state_;
  parallel::ReplicaGradientSync* replica_sync_ = nullptr;
};

}  // namespace meshrun::worker::examples
