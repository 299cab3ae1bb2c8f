#pragma once

// Pipeline parallelism: a Sequential model cut into stages over the `pp`
// process group (stage = rank in that group), microbatches driven through the
// stages by a GPipe or 1F1B schedule (pp_schedule.h), activations sent
// downstream and gradients upstream with point-to-point send/recv.
//
//   Sequential model = MakeMlp({50, 50, 50, 50, 4}, seed);  // whole, every rank
//   auto stage = MakeStage(std::move(model), mesh["pp"]->GetGroup().value());
//   torch::optim::SGD sgd(stage->Leaves(), lr);
//   sgd.zero_grad();
//   double loss = RunStep(*stage, Schedule::kOneFOneB, 8, input, target, Mse).value();
//   sgd.step();
//
// Composition: a stage's layers may be anything (e.g. tensor-parallel layers
// whose Forward runs collectives in a tp group); the pipeline itself talks
// only over the pp group. Every TP rank of a stage runs the same schedule and
// exchanges its (replicated) activations with the same TP rank of the
// neighbouring stage. Data parallelism across pipeline replicas: call
// DataParallel's gradient sync after RunStep, before the optimizer step.
//
// Wire protocol of a step: first an all-gather of every stage's StepArgs
// (pp_schedule.h) over the pp group, so that a step one stage cannot run is
// refused by all; then, per microbatch m (tags are per microbatch, so
// messages match by (peer, tag), never by arrival order):
//   forward:  a header (int64 [2 + kMaxDims]: ndim, dtype, sizes) with tag
//             3m, then the activation with tag 3m + 1. The header is sent
//             for every microbatch, so stages need not know each other's
//             output shapes.
//   backward: the gradient of the activation, tag 3m + 2; its shape is that
//             of the activation the receiver sent, so it has no header.
// Sends are posted without waiting and completed at the end of the step
// (see pp_schedule.h for why 1F1B needs that); receives block.
//
// Not thread-safe. All calls on a stage are collective over the pp group
// (every stage calls RunStep with the same schedule and microbatches).

#include <ATen/ATen.h>

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker_lib/parallel/layers.h"
#include "worker_lib/parallel/param.h"
#include "worker_lib/parallel/pp_schedule.h"

namespace meshrun::worker::parallel {

// One rank's part of a pipeline.
class PipelineStage {
 public:
  int stage() const { return stage_; }
  int num_stages() const { return num_stages_; }
  bool is_first() const { return stage_ == 0; }
  bool is_last() const { return stage_ == num_stages_ - 1; }
  const ProcessGroupPtr& group() const { return group_; }

  // This stage's layers: layers [layer_begin(), layer_end()) of the model
  // given to MakeStage; the other layers were dropped.
  Sequential& module() { return module_; }
  const Sequential& module() const { return module_; }
  int layer_begin() const { return layer_begin_; }
  int layer_end() const { return layer_end_; }
  // Every stage's first layer index, and the model's layer count at the end.
  const std::vector<int>& boundaries() const { return boundaries_; }

  // The stage's parameter leaves, for an optimizer.
  std::vector<at::Tensor> Leaves() const { return module_.Leaves(); }
  // "stage 1/2: layers [4, 7): ReLU(), Linear(50 -> 50), ReLU(), Linear(50 -> 4)".
  std::string Describe() const;

 private:
  friend absl::StatusOr<PipelineStage> MakeStage(Sequential model,
                                                 ProcessGroupPtr pp_group,
                                                 std::vector<int> split_points);
  PipelineStage() = default;

  int stage_ = 0;
  int num_stages_ = 1;
  ProcessGroupPtr group_;
  Sequential module_;
  int layer_begin_ = 0;
  int layer_end_ = 0;
  std::vector<int> boundaries_;
};

// Cuts `model` (whole, built identically on every rank) into
// pp_group->getSize() stages and keeps this rank's (rank in `pp_group`).
// `split_points`: the first layer index of stages 1..P-1; empty: balanced by
// parameter count (StageBoundaries in pp_schedule.h; global parameter sizes,
// so TP-sharded layers split the same on every rank). Not collective.
// INVALID_ARGUMENT (naming the sizes) for a null group, too few layers or bad
// split points.
absl::StatusOr<PipelineStage> MakeStage(Sequential model, ProcessGroupPtr pp_group,
                                        std::vector<int> split_points = {});

// The loss of one microbatch: a scalar, the mean over its rows (e.g. MSE), so
// that the mean over equal microbatches is the full batch's loss.
using LossFn =
    std::function<at::Tensor(const at::Tensor& output, const at::Tensor& target)>;

// One training step's forward and backward passes over `microbatches`
// equal microbatches (the batch split on dim 0). `input` is used on the first
// stage, `target` on the last (others may pass undefined tensors). Each
// microbatch's loss is divided by `microbatches`, so the gradients
// accumulated in the stage's leaves equal the full batch's mean-loss
// gradients. Gradients accumulate: zero them before (and step the optimizer
// after) as with loss.backward().
// Returns the step's loss (mean over microbatches) on every stage: computed
// on the last stage and broadcast over the pp group.
// Errors: INVALID_ARGUMENT, the same on every stage and before any
// activation is sent, for a step that cannot run (ValidateStep in
// pp_schedule.h): stages disagreeing on schedule or microbatches, 1F1B with
// fewer microbatches than stages ("1F1B needs at least 4 microbatches for 4
// stages, got 2"), an input or target that does not split into equal
// microbatches ("pipeline input of 30 rows does not split into 4 equal
// microbatches"), no loss function on the last stage. The stages learn each
// other's arguments from one small all-gather over the pp group at the start
// of every step. INTERNAL for a failure during the step (a c10d error, a
// TORCH_CHECK in a layer).
absl::StatusOr<double> RunStep(PipelineStage& stage, Schedule schedule, int microbatches,
                               const at::Tensor& input, const at::Tensor& target,
                               const LossFn& loss_fn);

}  // namespace meshrun::worker::parallel
