#pragma once

// The user's torch::nn model trained under any layout of meshrun's
// parallelisms on one DeviceMesh (dp, fsdp, pp, tp), as TorchTitan applies
// its parallelize function and then runs its training step:
// ParallelizeModule over "tp", FullyShard of the model's units and then its
// root over "fsdp" (with pipelines: of each stage module's units and then of
// the stage module), pipeline stages over "pp" (PipelineStage and a
// schedule), DistributedDataParallel over "dp" (over FSDP shards: HSDP; one
// per stage module with pipelines), then the user's torch::optim optimizer
// over what this rank trains.
//
//   ModuleModel model{gpt.ptr(), units, GptTpPlan(true), true, forward, loss,
//                     parts, stage_of};
//   auto trainer = ModuleTrainer::Create(world, layout, model, make_adamw).value();
//   double loss = trainer->Step(tokens, targets).value();  // the global batch
//
// Data: every rank passes the same global batch; each data rank (dp x fsdp)
// trains its rows, and the TP and PP ranks of one share them. Step returns
// the global batch's mean loss on every rank, so it equals one process
// training the whole model on the whole batch.
//
// Fault-tolerant replicas (fault_tolerant.h): with a ReplicaGradientSync the
// world is one replica group, Step's batch is the group's, its gradients and
// loss are averaged across the step's replicas too, and a step the replicas
// discard answers ABORTED with nothing applied; training_state() is what a
// heal copies (the module and the optimizer's state).
//
// Collective: Create, Step, Evaluate, Predict, Save, Load and FullParams, on
// every rank of the world in the same order.

#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/optim/optimizer.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker_lib/mesh/device_mesh.h"
#include "worker_lib/mesh/process_group.h"
#include "worker_lib/parallel/ddp.h"
#include "worker_lib/parallel/parallelize.h"
#include "worker_lib/parallel/pp.h"
#include "worker_lib/training/module_checkpoint.h"
#include "worker_lib/training/module_fault_tolerance.h"
#include "worker_lib/training/replica_sync.h"

namespace meshrun::worker::parallel {

// What the trainer needs to know of the user's model.
struct ModuleModel {
  // The whole model, built the same way on every rank.
  std::shared_ptr<torch::nn::Module> root;
  // FullyShard's units, sharded in this order before the root (FSDP2's
  // fully_shard of every block, then of the model).
  std::vector<std::shared_ptr<torch::nn::Module>> shard_units;
  ParallelizePlan tp_plan;
  // With tensor parallelism: the output is the plan's column-wise head's
  // vocabulary slice, and the loss is LossParallel's (PyTorch's
  // loss_parallel) rather than `loss`.
  bool vocab_parallel_output = false;
  // The root's forward, and the mean loss of an output against its target.
  std::function<at::Tensor(const at::Tensor&)> forward;
  LossFn loss;
  // Pipelines: the model's parts, in order, and a module made of parts
  // [first, last] that shares the root's submodules.
  int num_parts = 0;
  std::function<torch::nn::AnyModule(int first, int last)> stage_of;
};

struct ModuleLayout {
  // The mesh's sizes: their product is the world's size. A parallelism may
  // run over a dimension of size 1 (its code runs, over groups of one).
  int dp = 1;
  int fsdp = 1;
  int pp = 1;
  int tp = 1;
  bool replicate = false;  // DistributedDataParallel over dp
  bool fully_shard = false;
  bool reshard_after_forward = true;
  bool tensor_parallel = false;
  bool pipeline = false;
  Schedule schedule = Schedule::kOneFOneB;
  // Model chunks a pp rank holds (the interleaved schedule's > 1).
  int virtual_stages = 1;
  int microbatches = 1;
  std::string device_type = "cpu";  // InitDeviceMesh's: "cpu" or "cuda"

  // The mesh's sizes with each parallelism on where its size is > 1 (DDP
  // over dp, FullyShard over fsdp, pipeline stages over pp, the TP plan
  // over tp); schedule and microbatches at their defaults.
  static ModuleLayout FromSizes(int dp, int fsdp, int pp, int tp);
  // "dp=2 fsdp=1 pp=1 tp=2: DDP over dp, TP plan over tp".
  std::string ToString() const;
};

class ModuleTrainer {
 public:
  // The optimizer over the tensors this rank trains (the shards, the stage's).
  using MakeOptimizer =
      std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<at::Tensor>)>;

  // Builds the mesh and parallelises `model` in place. INVALID_ARGUMENT for a
  // layout the world or the model cannot take (naming what), UNIMPLEMENTED
  // for fault-tolerant replicas with pipeline stages (not yet); the
  // parallelisms' own errors otherwise. Collective.
  // `replica_sync`: not owned; null for none; not with pipelines.
  static absl::StatusOr<std::unique_ptr<ModuleTrainer>> Create(
      std::shared_ptr<World> world, const ModuleLayout& layout, ModuleModel model,
      const MakeOptimizer& make_optimizer, ReplicaGradientSync* replica_sync = nullptr);

  // One optimizer step on the global batch: the global mean loss on every
  // rank. INTERNAL for a failure inside (a c10d error, a shape mismatch).
  // Collective.
  absl::StatusOr<double> Step(const at::Tensor& input, const at::Tensor& target);

  // Without pipelines (UNIMPLEMENTED with them), no grad: the global batch's
  // mean loss; the output of the forward for an input every rank passes
  // alike (with vocab_parallel_output, this rank's vocabulary slice).
  absl::StatusOr<double> Evaluate(const at::Tensor& input, const at::Tensor& target);
  absl::StatusOr<at::Tensor> Predict(const at::Tensor& input);

  // A sharded checkpoint of the module and the optimizer's state
  // (module_checkpoint.h), written by the first dp replica (with pipelines,
  // every stage its own parameters), loadable on another layout. Barriers
  // around the files.
  absl::Status Save(const std::string& dir);
  absl::Status Load(const std::string& dir);

  // The module's parameters (shards with their global shapes) and what a
  // heal copies. Without pipelines.
  const std::vector<std::shared_ptr<Param>>& Params() const { return state_->params(); }
  TrainingState& training_state() { return *state_; }

  // The full value, on the CPU, of every parameter this rank trains (its
  // stages' when pipelined), by the root's state-dict names. Collective
  // over their groups.
  std::map<std::string, at::Tensor> FullParams() const;

  const DeviceMesh& mesh() const { return mesh_; }
  // The mesh dimension's group ("dp", "fsdp", "pp" or "tp").
  ProcessGroupPtr group(const std::string& dim) const;
  const std::optional<PipelineStage>& stage() const { return stage_; }
  // With pipelines: this rank's stages (the model cut in pp x
  // virtual_stages), each with its parts [first, last].
  struct StageParts {
    int stage;
    int first;
    int last;
  };
  const std::vector<StageParts>& stage_parts() const { return stage_parts_; }
  torch::optim::Optimizer& optimizer() { return *optimizer_; }
  const ModuleLayout& layout() const { return layout_; }

 private:
  ModuleTrainer(std::shared_ptr<World> world, DeviceMesh mesh, const ModuleLayout& layout,
                ModuleModel model)
      : world_(std::move(world)),
        mesh_(std::move(mesh)),
        layout_(layout),
        model_(std::move(model)) {}
  absl::Status Parallelize(const MakeOptimizer& make_optimizer);
  absl::Status NotPipelined(const char* what) const;
  // FullyShard of the model's units inside `root`, then of `root`.
  absl::Status ShardUnitsAndRoot(torch::nn::Module& root);
  // What this rank trains, for its checkpoints: null (all) without
  // pipelines, the stages' tensors with them.
  TensorFilter Trained() const;
  // This rank's rows of the global `batch`.
  at::Tensor MyRows(const at::Tensor& batch) const;
  double MeanOverWorld(const at::Tensor& loss) const;

  std::shared_ptr<World> world_;
  DeviceMesh mesh_;
  ModuleLayout layout_;
  ModuleModel model_;
  LossFn loss_;  // the model's, or LossParallel's over tp
  std::vector<std::unique_ptr<DistributedDataParallel>> replicas_;
  std::optional<PipelineStage> stage_;
  std::vector<std::shared_ptr<torch::nn::Module>> stage_modules_;
  std::vector<StageParts> stage_parts_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::unique_ptr<ModuleTrainingState> state_;  // without pipelines
  ReplicaGradientSync* replica_sync_ = nullptr;
};

}  // namespace meshrun::worker::parallel
