#pragma once

// Pipeline parallelism, PyTorch's PipelineStage on the user's torch::nn
// modules: a rank's stage modules over the `pp` process group, microbatches
// driven through the stages by a GPipe, 1F1B or interleaved 1F1B schedule
// (pp_schedule.h), activations sent downstream and gradients upstream with
// point-to-point send/recv.
//
//   // The whole model on every rank; this rank's part of it as a module.
//   auto stage = MakeStage({torch::nn::AnyModule(MyStage(model, first, last))},
//                          mesh.GetGroup("pp").value()).value();
//   torch::optim::SGD sgd(stage.Leaves(), lr);
//   sgd.zero_grad();
//   double loss = RunStep(stage, Schedule::kOneFOneB, 8, input, target, Mse).value();
//   sgd.step();
//
// Stages per rank. With one (GPipe, 1F1B) the model is cut into pp stages,
// stage = rank in the pp group. With V > 1 virtual stages (interleaved 1F1B:
// V modules to MakeStage, RunStep(..., kInterleaved1F1B, ...)) it is cut into
// pp * V stages and the rank holds V chunks, chunk c being global stage
// c * pp + rank (pp_schedule.h's CutParts); rank 0 holds the first stage
// (the input), rank pp - 1 the last (the target and the loss).
//
// Composition: a stage's modules may be anything (e.g. tensor-parallel
// Linears whose forward runs collectives in a tp group, FSDP units); the
// pipeline itself talks only over the pp group. Every TP rank of a stage
// runs the same schedule and exchanges its (replicated) activations with the
// same TP rank of the neighbouring stage. Data parallelism across pipeline
// replicas: DistributedDataParallel on each stage module under no_sync(),
// then SyncGradients() after RunStep, before the optimizer step
// (ModuleTrainer does all of this).
//
// Wire protocol of a step: first an all-gather of every rank's StepArgs
// (pp_schedule.h) over the pp group, so that a step one rank cannot run is
// refused by all; then, per microbatch m crossing the boundary between
// global stages b and b + 1, with k = b / pp (the chunk of stage b; always 0
// with one stage per rank) and M microbatches — tags are per boundary and
// microbatch, so messages match by (peer, tag), never by arrival order:
//   forward:  a header (int64 [2 + kMaxDims]: ndim, dtype, sizes) with tag
//             3 (k M + m), then the activation with tag 3 (k M + m) + 1. The
//             headers are sent in a step only when some stage has not seen
//             them for this input shape (and microbatches, schedule): each
//             stage keeps the shapes it received, and the step-argument
//             all-gather tells every stage whether all of them hold the
//             shapes for the first stage's input, so a stage need not know
//             its neighbours' output shapes, but those must be a function of
//             the input's shape (a module whose output shape depends on the
//             values fails the step with a shape error). A message fewer a
//             microbatch, which 1F1B pays on its critical path.
//   backward: the gradient of the activation, tag 3 (k M + m) + 2; its shape
//             is that of the activation the receiver sent, so it has no
//             header.
// Between two ranks in one direction the boundaries crossed are those with
// b % pp fixed, so k tells them apart. Sends are posted without waiting and
// completed at the end of the step (see pp_schedule.h for why 1F1B needs
// that); receives block.
//
// Not thread-safe. All calls on a stage are collective over the pp group
// (every rank calls RunStep with the same schedule and microbatches).

#include <ATen/ATen.h>
#include <torch/nn/modules/container/any.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker_lib/parallel/param.h"
#include "worker_lib/parallel/pp_schedule.h"

namespace meshrun::worker::parallel {

// One rank's part of a pipeline: one stage, or V chunks (virtual stages).
class PipelineStage {
 public:
  // The rank in the pp group and the group's size.
  int rank() const { return rank_; }
  int pp_size() const { return pp_size_; }
  // Chunks held by this rank (1 unless interleaved).
  int virtual_stages() const { return static_cast<int>(chunks_.size()); }
  // Global stages: pp_size() * virtual_stages().
  int num_stages() const { return pp_size_ * virtual_stages(); }
  // The global stage of `chunk`: chunk * pp_size() + rank(). With one stage
  // per rank, stage() is the stage (= rank).
  int stage(int chunk = 0) const { return chunk * pp_size_ + rank_; }
  // Whether this rank holds the first global stage (sees the input) / the
  // last (sees the target, computes the loss).
  bool is_first() const { return rank_ == 0; }
  bool is_last() const { return rank_ == pp_size_ - 1; }
  const ProcessGroupPtr& group() const { return group_; }

  // For RunStep (pp.cc): the activation shapes this rank received (by header
  // tag) and sent, valid for the input shape key `key` (0: none).
  struct ShapeCache {
    int64_t key = 0;
    std::map<int, std::vector<int64_t>> received, sent;
  };
  ShapeCache& shape_cache() { return shape_cache_; }

  // A chunk's forward: its module's.
  at::Tensor Forward(int chunk, const at::Tensor& input) const {
    return chunks_[chunk].forward(input);
  }

  // The params and parameter leaves of all the rank's chunks, chunk 0 first
  // (e.g. for an optimizer, DataParallel, checkpoints).
  std::vector<std::shared_ptr<Param>> Params() const;
  std::vector<at::Tensor> Leaves() const;
  // Where the pipeline's messages (activations, headers, step arguments, the
  // loss) live: the device of the stage's parameters, CPU without any. NCCL
  // sends only CUDA tensors, Gloo's CPU ones.
  at::Device device() const;
  // One stage: "stage 1/2: GptStageImpl". Several: "rank 0/2, 2 virtual
  // stages: stage 0/4: GptStageImpl; stage 2/4: GptStageImpl".
  std::string Describe() const;

 private:
  friend absl::StatusOr<PipelineStage> MakeStage(
      std::vector<torch::nn::AnyModule> modules, ProcessGroupPtr pp_group);
  PipelineStage() = default;

  struct Chunk {
    std::function<at::Tensor(const at::Tensor&)> forward;
    std::vector<std::shared_ptr<Param>> params;
    std::string description;
  };

  int rank_ = 0;
  int pp_size_ = 1;
  ProcessGroupPtr group_;
  std::vector<Chunk> chunks_;
  ShapeCache shape_cache_;
};

// PyTorch's PipelineStage(submodule, stage_index, num_stages) on the user's
// own modules: `modules[c]` is this rank's global stage c * pp + rank (one
// module, or V for the interleaved schedule), each taking one tensor and
// returning one (torch::nn::AnyModule holds any module with such a
// forward). The user builds them, e.g. the whole model on every rank and a
// module per stage holding its part, as TorchTitan does. Their parameters
// (ParamOf for sharded ones, else the module's own) are the stage's. Not
// collective. INVALID_ARGUMENT for a null group, no modules, an empty one.
absl::StatusOr<PipelineStage> MakeStage(std::vector<torch::nn::AnyModule> modules,
                                        ProcessGroupPtr pp_group);

// The loss of one microbatch: a scalar, the mean over its rows (e.g. MSE), so
// that the mean over equal microbatches is the full batch's loss.
using LossFn =
    std::function<at::Tensor(const at::Tensor& output, const at::Tensor& target)>;

// One training step's forward and backward passes over `microbatches`
// equal microbatches (the batch split on dim 0). `input` is used on the rank
// holding the first stage, `target` on the one holding the last (others may
// pass undefined tensors); `schedule` must suit the stage's virtual stages
// (interleaved with V > 1, the others with 1). Each
// microbatch's loss is divided by `microbatches`, so the gradients
// accumulated in the stage's leaves equal the full batch's mean-loss
// gradients. Gradients accumulate: zero them before (and step the optimizer
// after) as with loss.backward().
// Returns the step's loss (mean over microbatches) on every stage: computed
// on the last stage and broadcast over the pp group.
// Errors: INVALID_ARGUMENT, the same on every stage and before any
// activation is sent, for a step that cannot run (ValidateStep in
// pp_schedule.h): stages disagreeing on schedule, microbatches or virtual
// stages, a schedule that does not suit the virtual stages, 1F1B with
// fewer microbatches than stages ("1F1B needs at least 4 microbatches for 4
// stages, got 2"), interleaved microbatches that are not a multiple of its
// rounds, an input or target that does not split into equal
// microbatches ("pipeline input of 30 rows does not split into 4 equal
// microbatches"), no loss function on the last stage. The stages learn each
// other's arguments from one small all-gather over the pp group at the start
// of every step. INTERNAL for a failure during the step (a c10d error, a
// TORCH_CHECK in a module).
absl::StatusOr<double> RunStep(PipelineStage& stage, Schedule schedule, int microbatches,
                               const at::Tensor& input, const at::Tensor& target,
                               const LossFn& loss_fn);

}  // namespace meshrun::worker::parallel
