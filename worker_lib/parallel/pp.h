#pragma once

// Pipeline parallelism: a Sequential model cut into stages over the `pp`
// process group, microbatches driven through the stages by a GPipe, 1F1B or
// interleaved 1F1B schedule (pp_schedule.h), activations sent downstream and
// gradients upstream with point-to-point send/recv.
//
//   Sequential model = MakeMlp({50, 50, 50, 50, 4}, seed);  // whole, every rank
//   auto stage = MakeStage(std::move(model), mesh["pp"]->GetGroup().value());
//   torch::optim::SGD sgd(stage->Leaves(), lr);
//   sgd.zero_grad();
//   double loss = RunStep(*stage, Schedule::kOneFOneB, 8, input, target, Mse).value();
//   sgd.step();
//
// Stages per rank. With one (GPipe, 1F1B) the model is cut into pp stages,
// stage = rank in the pp group. With V > 1 virtual stages (interleaved 1F1B:
// MakeStage(model, group, {}, V), RunStep(..., kInterleaved1F1B, ...)) it is
// cut into pp * V stages and the rank holds V chunks, chunk c being global
// stage c * pp + rank (pp_schedule.h); rank 0 holds the first stage (the
// input), rank pp - 1 the last (the target and the loss).
//
// Composition: a stage's layers may be anything (e.g. tensor-parallel layers
// whose Forward runs collectives in a tp group); the pipeline itself talks
// only over the pp group. Every TP rank of a stage runs the same schedule and
// exchanges its (replicated) activations with the same TP rank of the
// neighbouring stage. Data parallelism across pipeline replicas: call
// DataParallel's gradient sync after RunStep, before the optimizer step.
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
//             the input's shape (a layer whose output shape depends on the
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
#include "worker_lib/parallel/layers.h"
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

  // A chunk's layers: layers [layer_begin(c), layer_end(c)) of the model
  // given to MakeStage; the other ranks' layers were dropped. Only for a
  // stage cut from a Sequential (not one of torch::nn modules).
  // REQUIRES: 0 <= chunk < virtual_stages().
  Sequential& module(int chunk = 0) { return LayersOf(chunk); }
  const Sequential& module(int chunk = 0) const { return LayersOf(chunk); }
  // A chunk's forward: its layers', or its torch::nn module's.
  at::Tensor Forward(int chunk, const at::Tensor& input) const {
    return chunks_[chunk].forward(input);
  }
  int layer_begin(int chunk = 0) const { return chunks_[chunk].layer_begin; }
  int layer_end(int chunk = 0) const { return chunks_[chunk].layer_end; }
  // Every global stage's first layer index, and the model's layer count at
  // the end (StageBoundaries for num_stages()).
  const std::vector<int>& boundaries() const { return boundaries_; }

  // The params and parameter leaves of all the rank's chunks, chunk 0 first
  // (e.g. for an optimizer, DataParallel, checkpoints).
  std::vector<std::shared_ptr<Param>> Params() const;
  std::vector<at::Tensor> Leaves() const;
  // Where the pipeline's messages (activations, headers, step arguments, the
  // loss) live: the device of the stage's parameters, CPU without any. NCCL
  // sends only CUDA tensors, Gloo's CPU ones.
  at::Device device() const;
  // One stage: "stage 1/2: layers [4, 7): ReLU(), Linear(50 -> 50), ...".
  // Several: "rank 0/2, 2 virtual stages: stage 0/4: layers [0, 2): ...;
  // stage 2/4: layers [4, 6): ...".
  std::string Describe() const;

 private:
  friend absl::StatusOr<PipelineStage> MakeStage(Sequential model,
                                                 ProcessGroupPtr pp_group,
                                                 std::vector<int> split_points,
                                                 int virtual_stages);
  friend absl::StatusOr<PipelineStage> MakeStage(
      std::vector<torch::nn::AnyModule> modules, ProcessGroupPtr pp_group);
  PipelineStage() = default;
  Sequential& LayersOf(int chunk) const {
    TORCH_CHECK(chunks_[chunk].layers != nullptr, "PipelineStage::module: stage ",
                stage(chunk), " is a torch::nn module, not layers cut from a Sequential");
    return *chunks_[chunk].layers;
  }

  struct Chunk {
    std::function<at::Tensor(const at::Tensor&)> forward;
    std::vector<std::shared_ptr<Param>> params;
    std::string description;
    // A chunk cut from a Sequential: its layers and their indices.
    std::shared_ptr<Sequential> layers;
    int layer_begin = 0;
    int layer_end = 0;
  };

  int rank_ = 0;
  int pp_size_ = 1;
  ProcessGroupPtr group_;
  std::vector<Chunk> chunks_;
  std::vector<int> boundaries_;
  ShapeCache shape_cache_;
};

// Cuts `model` (whole, built identically on every rank) into
// pp_group->getSize() * `virtual_stages` stages and keeps this rank's (rank
// in `pp_group`): stage `rank`, or with virtual_stages V > 1 stages
// c * pp + rank for c = 0..V-1. `split_points`: the first layer index of
// stages 1..N-1 (N stages in all); empty: balanced by parameter count
// (StageBoundaries in pp_schedule.h; global parameter sizes, so TP-sharded
// layers split the same on every rank). Not collective. INVALID_ARGUMENT
// (naming the sizes) for a null group, virtual_stages < 1, too few layers or
// bad split points.
absl::StatusOr<PipelineStage> MakeStage(Sequential model, ProcessGroupPtr pp_group,
                                        std::vector<int> split_points = {},
                                        int virtual_stages = 1);

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
// TORCH_CHECK in a layer).
absl::StatusOr<double> RunStep(PipelineStage& stage, Schedule schedule, int microbatches,
                               const at::Tensor& input, const at::Tensor& target,
                               const LossFn& loss_fn);

}  // namespace meshrun::worker::parallel
