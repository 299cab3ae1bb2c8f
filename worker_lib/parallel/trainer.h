#pragma once

// Composition of the parallelisms on one DeviceMesh: a model built whole on
// every rank is made tensor-parallel (tp.h), cut into a pipeline stage
// (pp.h), fully sharded (fsdp.h) and synchronised across replicas (dp.h),
// in that order, on the mesh (pp, dp, fsdp, tp) — tp innermost, so that a TP
// group is the closest ranks; any size may be 1.
//
//   auto trainer = Trainer::Create(world, MlpModel({50, 50, 50, 50, 4}, seed),
//                                  {.layout = {.dp = 2, .tp = 2}}).value();
//   for (int step = 0; step < 10; ++step) {
//     Batch batch = SyntheticBatch(data_seed, step, 32, 50, 4);  // global
//     double loss = trainer->Step(batch.input, batch.target).value();
//   }
//
// Data: every rank passes the same global batch; data-parallel rank
// (dp, fsdp) takes its rows; TP and PP ranks of a replica see the same rows.
// The loss returned is the global batch's mean, on every rank, so it equals
// single-process training on the same batch.
//
// Collective: Create, Step, GatherFullParams, Save and Load are called by
// every rank of the world in the same order.

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker_lib/device_mesh.h"
#include "worker_lib/parallel/layers.h"
#include "worker_lib/parallel/pp_schedule.h"
#include "worker_lib/parallel/replica_sync.h"
#include "worker_lib/process_group.h"

namespace meshrun::worker::parallel {

struct TransformerConfig;

// A model the trainer can parallelise: its layers, how to make it
// tensor-parallel in place, and its loss.
class TrainModel {
 public:
  virtual ~TrainModel() = default;
  virtual absl::Status ParallelizeTp(const std::string& mesh_dim, ProcessGroupPtr tp) = 0;
  // The layers, as they are after ParallelizeTp.
  virtual Sequential& Layers() = 0;
  // Mean loss of the last layer's output against `target` (on the last
  // pipeline stage; collective over tp when the output is vocab-parallel).
  virtual at::Tensor Loss(const at::Tensor& output, const at::Tensor& target) = 0;
  virtual std::string Describe() const = 0;
  // The whole output from this rank's piece of the last layer's output (the
  // vocab-split logits gathered over tp; as it is where the output is
  // replicated). Collective over tp.
  virtual at::Tensor GatherOutput(const at::Tensor& output) { return output; }
  // Synthetic (input, target) global batch of `step`, the same on every rank.
  virtual std::pair<at::Tensor, at::Tensor> SyntheticData(uint64_t seed, int64_t step,
                                                          int64_t batch) const = 0;
};

// MakeMlp(sizes, seed) with the MSE loss; TP pairs Linears column -> row.
std::unique_ptr<TrainModel> MlpModel(const std::vector<int64_t>& sizes, uint64_t seed);
// TransformerLm (transformer.h) with its (vocab-parallel) cross-entropy.
std::unique_ptr<TrainModel> TransformerModel(const TransformerConfig& config,
                                             uint64_t seed);

// Single-process training of the whole `model` on SyntheticData with SGD:
// the parity reference. Returns each step's loss; the model is left trained.
std::vector<double> TrainSingleProcess(TrainModel& model, uint64_t data_seed,
                                       int64_t first_step, int steps, int64_t batch,
                                       double lr);
// The same on the (input, target) global batch `batch_of(step)` returns,
// with SGD's momentum as TrainOptions::momentum.
using BatchFn = std::function<std::pair<at::Tensor, at::Tensor>(int64_t step)>;
std::vector<double> TrainSingleProcess(TrainModel& model, const BatchFn& batch_of,
                                       int64_t first_step, int steps, double lr,
                                       double momentum = 0);

struct ParallelLayout {
  int pp = 1;
  int dp = 1;
  int fsdp = 1;
  int tp = 1;
  int world() const { return pp * dp * fsdp * tp; }
  // "pp=2 dp=1 fsdp=1 tp=2".
  std::string ToString() const;
};

struct TrainOptions {
  ParallelLayout layout;
  double lr = 0.05;
  // SGD's momentum (torch.optim.SGD's, no dampening or Nesterov); its
  // buffers are the optimizer state (OptimizerState). Checkpoints hold
  // parameters only.
  double momentum = 0;
  // Pipeline microbatches and schedule (pp > 1); 1F1B needs microbatches >= pp.
  int microbatches = 1;
  Schedule schedule = Schedule::kGPipe;
  // Model chunks per pipeline rank: > 1 cuts the model into pp * this many
  // stages, chunk c of pp rank r holding stage c * pp + r, and needs the
  // interleaved schedule (which needs > 1); ValidateSchedule's rules.
  // FSDP shards each chunk's layers; DP syncs all the rank's params.
  int virtual_stages = 1;
  bool reshard_after_forward = true;
  size_t dp_bucket_bytes = size_t{25} << 20;
  // DataParallel's first bucket (dp.h); 0: as big as the others.
  size_t dp_first_bucket_bytes = size_t{1} << 20;
  // Not owned; null: none. Then the world is one replica group, and Step
  // returns ABORTED for a step the replicas discarded.
  ReplicaGradientSync* replica_sync = nullptr;
};

class Trainer {
 public:
  // Builds the mesh (only dimensions of size > 1 become mesh dims; with none,
  // a 1-D mesh of the world) and parallelises `model`. The layout's world
  // must equal the world's size. Collective.
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(
      std::shared_ptr<World> world, std::unique_ptr<TrainModel> model,
      TrainOptions options);
  ~Trainer();

  // One SGD step on the global batch (the same on every rank). Returns the
  // global mean loss on every rank. Collective. With a replica_sync, the
  // batch is this replica's and the loss the participating replicas' mean;
  // ABORTED (nothing applied) when the replicas discarded the step.
  absl::StatusOr<double> Step(const at::Tensor& input, const at::Tensor& target);

  // The global batch's mean loss without training (forward only, no grad):
  // each data-parallel rank evaluates its rows. Collective. UNIMPLEMENTED
  // with pipeline parallelism.
  absl::StatusOr<double> Evaluate(const at::Tensor& input, const at::Tensor& target);
  // The model's whole output for `input` (the same on every rank, which all
  // pass the same input), e.g. logits to sample from. Collective.
  // UNIMPLEMENTED with pipeline parallelism.
  absl::StatusOr<at::Tensor> Predict(const at::Tensor& input);

  // The full value of every param this rank's pipeline stage(s) hold, by name
  // (FullTensor over TP and FSDP). Collective.
  std::vector<std::pair<std::string, at::Tensor>> GatherFullParams();
  // The stage's params (sharded), e.g. for checkpoints or inspection.
  std::vector<std::shared_ptr<Param>> Params() const;
  // The optimizer's state: with momentum, one buffer per optimized tensor
  // (this rank's shards, in the optimizer's order; where no step has made
  // one yet, zeros, which SGD without dampening treats as none). Writing
  // into them writes the optimizer's state, e.g. to copy it from a replica.
  // Empty without momentum.
  std::vector<at::Tensor> OptimizerState();

  // Sharded checkpoint of the stage's params (checkpoint.h): only the first
  // data-parallel replica (dp coordinate 0) writes; a load reshards from any
  // layout. Collective (barriers around the files).
  absl::Status Save(const std::string& dir);
  absl::Status Load(const std::string& dir);

  const DeviceMesh& mesh() const;
  const TrainOptions& options() const;
  // "pp=2 dp=1 fsdp=1 tp=2 (MLP): stage 0/2: layers [0, 4): ...", for logs;
  // with virtual stages, every chunk's stage and layers (PipelineStage::Describe).
  std::string Describe() const;

 private:
  struct State;
  explicit Trainer(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
};

}  // namespace meshrun::worker::parallel
