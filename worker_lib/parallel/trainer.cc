#include "worker_lib/parallel/trainer.h"

#include <torch/optim/sgd.h>
#include <torch/utils.h>

#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "worker_lib/parallel/checkpoint.h"
#include "worker_lib/parallel/data.h"
#include "worker_lib/parallel/dp.h"
#include "worker_lib/parallel/fsdp.h"
#include "worker_lib/parallel/pp.h"
#include "worker_lib/parallel/tp.h"
#include "worker_lib/parallel/transformer.h"

namespace meshrun::worker::parallel {

namespace {

class Mlp : public TrainModel {
 public:
  Mlp(const std::vector<int64_t>& sizes, uint64_t seed) : model_(MakeMlp(sizes, seed)) {}
  absl::Status ParallelizeTp(const std::string& mesh_dim, ProcessGroupPtr tp) override {
    return ParallelizeMlp(model_, mesh_dim, std::move(tp));
  }
  Sequential& Layers() override { return model_; }
  at::Tensor Loss(const at::Tensor& output, const at::Tensor& target) override {
    return (output - target).pow(2).mean();
  }
  std::string Describe() const override { return "MLP"; }
  std::pair<at::Tensor, at::Tensor> SyntheticData(uint64_t seed, int64_t step,
                                                  int64_t batch) const override {
    const auto& params = model_.Params();
    Batch data = SyntheticBatch(seed, step, batch, params.front()->global_shape()[1],
                                params.back()->global_shape()[0]);
    return {data.input, data.target};
  }

 private:
  Sequential model_;
};

class Transformer : public TrainModel {
 public:
  Transformer(const TransformerConfig& config, uint64_t seed)
      : lm_(TransformerLm::Make(config, seed)) {}
  absl::Status ParallelizeTp(const std::string& mesh_dim, ProcessGroupPtr tp) override {
    return lm_.Parallelize(mesh_dim, std::move(tp));
  }
  Sequential& Layers() override { return lm_.model(); }
  at::Tensor Loss(const at::Tensor& output, const at::Tensor& target) override {
    return lm_.LossOfLogits(output, target);
  }
  at::Tensor GatherOutput(const at::Tensor& output) override {
    return lm_.tp() ? GatherFromTpRegion(output, lm_.tp()) : output;
  }
  std::string Describe() const override { return "transformer LM"; }
  std::pair<at::Tensor, at::Tensor> SyntheticData(uint64_t seed, int64_t step,
                                                  int64_t batch) const override {
    const TransformerConfig& config = lm_.config();
    TokenBatch data = SyntheticTokens(seed, step, batch, config.seq, config.vocab);
    return {data.tokens, data.targets};
  }

 private:
  TransformerLm lm_;
};

// Mean of a scalar over `group` (null: alone).
double MeanOver(const ProcessGroupPtr& group, double value) {
  if (!group || group->getSize() == 1) return value;
  std::vector<at::Tensor> tensors{at::full({1}, value, at::kDouble)};
  group->allreduce(tensors)->wait();
  return tensors[0].item<double>() / group->getSize();
}

}  // namespace

std::unique_ptr<TrainModel> MlpModel(const std::vector<int64_t>& sizes, uint64_t seed) {
  return std::make_unique<Mlp>(sizes, seed);
}

std::unique_ptr<TrainModel> TransformerModel(const TransformerConfig& config,
                                             uint64_t seed) {
  return std::make_unique<Transformer>(config, seed);
}

std::vector<double> TrainSingleProcess(TrainModel& model, uint64_t data_seed,
                                       int64_t first_step, int steps, int64_t batch,
                                       double lr) {
  return TrainSingleProcess(
      model,
      [&model, data_seed, batch](int64_t step) {
        return model.SyntheticData(data_seed, step, batch);
      },
      first_step, steps, lr);
}

std::vector<double> TrainSingleProcess(TrainModel& model, const BatchFn& batch_of,
                                       int64_t first_step, int steps, double lr,
                                       double momentum) {
  torch::optim::SGD optimizer(model.Layers().Leaves(),
                              torch::optim::SGDOptions(lr).momentum(momentum));
  std::vector<double> losses;
  for (int64_t step = first_step; step < first_step + steps; ++step) {
    auto [input, target] = batch_of(step);
    optimizer.zero_grad();
    at::Tensor loss = model.Loss(model.Layers().Forward(input), target);
    loss.backward();
    optimizer.step();
    losses.push_back(loss.item<double>());
  }
  return losses;
}

std::string ParallelLayout::ToString() const {
  return absl::StrCat("pp=", pp, " dp=", dp, " fsdp=", fsdp, " tp=", tp);
}

struct Trainer::State {
  std::shared_ptr<World> world;
  std::unique_ptr<TrainModel> model;
  TrainOptions options;
  std::optional<DeviceMesh> mesh;
  // Groups of the dimensions of size > 1 (null otherwise) and this rank's
  // coordinates along them (0 otherwise).
  ProcessGroupPtr pp, dp, fsdp, tp;
  int dp_index = 0;
  int fsdp_index = 0;
  std::optional<PipelineStage> stage;  // pp > 1
  std::unique_ptr<DataParallel> dp_sync;
  std::unique_ptr<torch::optim::SGD> optimizer;

  // The modules this rank trains: the pipeline stage's chunks, or the model.
  std::vector<Sequential*> modules() {
    if (!stage) return {&model->Layers()};
    std::vector<Sequential*> chunks;
    for (int c = 0; c < stage->virtual_stages(); ++c) chunks.push_back(&stage->module(c));
    return chunks;
  }
  std::vector<std::shared_ptr<Param>> Params() const {
    return stage ? stage->Params() : model->Layers().Params();
  }
  std::vector<at::Tensor> Leaves() const {
    return stage ? stage->Leaves() : model->Layers().Leaves();
  }
  void Barrier() { world->group()->barrier()->wait(); }
};

Trainer::Trainer(std::unique_ptr<State> state) : state_(std::move(state)) {}
Trainer::~Trainer() = default;

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(
    std::shared_ptr<World> world, std::unique_ptr<TrainModel> model,
    TrainOptions options) {
  const ParallelLayout& layout = options.layout;
  if (layout.pp < 1 || layout.dp < 1 || layout.fsdp < 1 || layout.tp < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("every parallel size must be at least 1 (", layout.ToString(), ")"));
  }
  if (layout.world() != world->size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the layout ", layout.ToString(), " needs ", layout.world(),
                     " ranks, the world has ", world->size()));
  }
  if (options.microbatches < 1) {
    return absl::InvalidArgumentError("microbatches must be at least 1");
  }
  // pp = 1 ignores the schedule, but not a request for virtual stages.
  if (layout.pp > 1 || options.virtual_stages != 1 ||
      options.schedule == Schedule::kInterleaved1F1B) {
    if (auto valid = ValidateSchedule(options.schedule, layout.pp, options.microbatches,
                                      options.virtual_stages);
        !valid.ok())
      return valid;
  }

  auto state = std::make_unique<State>();
  state->world = world;
  state->model = std::move(model);
  state->options = options;

  std::vector<int> shape;
  std::vector<std::string> names;
  for (auto [name, size] : {std::pair<const char*, int>{"pp", layout.pp},
                            {"dp", layout.dp},
                            {"fsdp", layout.fsdp},
                            {"tp", layout.tp}}) {
    if (size > 1) {
      shape.push_back(size);
      names.push_back(name);
    }
  }
  if (shape.empty()) {
    shape = {world->size()};
    names = {"world"};
  }
  auto mesh = InitDeviceMesh(world, "cpu", shape, names);
  if (!mesh.ok()) return mesh.status();
  state->mesh = *std::move(mesh);
  auto group_of = [&](const std::string& name, int size, ProcessGroupPtr& group,
                      int* index) -> absl::Status {
    if (size == 1) return absl::OkStatus();
    auto found = state->mesh->GetGroup(name);
    if (!found.ok()) return found.status();
    group = *found;
    if (index) *index = group->getRank();
    return absl::OkStatus();
  };
  for (auto status : {group_of("pp", layout.pp, state->pp, nullptr),
                      group_of("dp", layout.dp, state->dp, &state->dp_index),
                      group_of("fsdp", layout.fsdp, state->fsdp, &state->fsdp_index),
                      group_of("tp", layout.tp, state->tp, nullptr)}) {
    if (!status.ok()) return status;
  }

  // TP first: it replaces layers and shards params of the whole model.
  if (state->tp) {
    if (auto status = state->model->ParallelizeTp("tp", state->tp); !status.ok())
      return status;
  }
  // The stage keeps its layers; the model's own list is emptied so the other
  // stages' params are freed.
  if (state->pp) {
    auto stage = MakeStage(state->model->Layers(), state->pp, {}, options.virtual_stages);
    if (!stage.ok()) return stage.status();
    state->stage.emplace(*std::move(stage));
    state->model->Layers().layers.clear();
  }
  if (state->fsdp) {
    FsdpOptions fsdp_options;
    fsdp_options.reshard_after_forward = options.reshard_after_forward;
    // Each chunk on its own: its layers run at their own times in the schedule.
    for (Sequential* module : state->modules()) {
      if (auto status = FullyShard(*module, "fsdp", state->fsdp, fsdp_options);
          !status.ok())
        return status;
    }
  }
  if (state->dp) {
    state->dp_sync = std::make_unique<DataParallel>(state->Params(), state->dp,
                                                    options.dp_bucket_bytes,
                                                    options.dp_first_bucket_bytes);
    // A pipeline schedule runs several backwards per step: they accumulate,
    // and SyncGradients does the whole sync after them.
    if (state->stage) state->dp_sync->set_sync_during_backward(false);
  }
  state->optimizer = std::make_unique<torch::optim::SGD>(
      state->Leaves(), torch::optim::SGDOptions(options.lr).momentum(options.momentum));
  return std::unique_ptr<Trainer>(new Trainer(std::move(state)));
}

absl::StatusOr<double> Trainer::Step(const at::Tensor& input, const at::Tensor& target) {
  State& s = *state_;
  const ParallelLayout& layout = s.options.layout;
  const int64_t data_parts = layout.dp * layout.fsdp;
  const int64_t data_index = s.dp_index * layout.fsdp + s.fsdp_index;
  if (input.size(0) % (data_parts * s.options.microbatches) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a global batch of ", input.size(0), " does not split into ", data_parts,
        " data-parallel ranks x ", s.options.microbatches, " microbatches"));
  }
  at::Tensor local_input = DataShard(input, data_parts, data_index);
  at::Tensor local_target = DataShard(target, data_parts, data_index);

  s.optimizer->zero_grad();
  double loss = 0;
  if (s.stage) {
    auto step_loss =
        RunStep(*s.stage, s.options.schedule, s.options.microbatches, local_input,
                local_target, [&s](const at::Tensor& output, const at::Tensor& t) {
                  return s.model->Loss(output, t);
                });
    if (!step_loss.ok()) return step_loss.status();
    loss = *step_loss;
  } else {
    // Gradient accumulation over microbatches, each loss scaled by 1/M so
    // the gradients are the local batch's mean.
    const int m = s.options.microbatches;
    auto inputs = local_input.chunk(m);
    auto targets = local_target.chunk(m);
    for (int i = 0; i < m; ++i) {
      at::Tensor micro_loss =
          s.model->Loss(s.model->Layers().Forward(inputs[i]), targets[i]) / m;
      // DDP's no_sync for all but the last: its backward starts the
      // all-reduces, once every microbatch's grads are in.
      if (s.dp_sync) s.dp_sync->set_sync_during_backward(i == m - 1);
      micro_loss.backward();
      loss += micro_loss.item<double>();
    }
  }
  if (s.dp_sync) s.dp_sync->SyncGradients();
  // The mean over data-parallel ranks of equal local batches is the global
  // batch's mean (fsdp and dp groups together span the data ranks).
  loss = MeanOver(s.dp, MeanOver(s.fsdp, loss));
  if (s.options.replica_sync) {
    auto apply = s.options.replica_sync->Sync(s.Params(), &loss);
    if (!apply.ok()) return apply.status();
    if (!*apply) return absl::AbortedError("the replicas discarded this step");
  }
  s.optimizer->step();
  return loss;
}

std::vector<at::Tensor> Trainer::OptimizerState() {
  State& s = *state_;
  std::vector<at::Tensor> buffers;
  if (s.options.momentum == 0) return buffers;
  auto& state = s.optimizer->state();
  for (const at::Tensor& leaf : s.optimizer->param_groups().front().params()) {
    void* key = leaf.unsafeGetTensorImpl();
    auto it = state.find(key);
    if (it == state.end()) {
      // SGD's first step sets the buffer to the grad; from zeros, with no
      // dampening, it computes 0 * momentum + grad: the same.
      auto fresh = std::make_unique<torch::optim::SGDParamState>();
      fresh->momentum_buffer(at::zeros_like(leaf));
      it = state.emplace(key, std::move(fresh)).first;
    }
    buffers.push_back(
        static_cast<torch::optim::SGDParamState&>(*it->second).momentum_buffer());
  }
  return buffers;
}

absl::StatusOr<double> Trainer::Evaluate(const at::Tensor& input,
                                         const at::Tensor& target) {
  State& s = *state_;
  if (s.stage) return absl::UnimplementedError("evaluation with pipeline parallelism");
  const ParallelLayout& layout = s.options.layout;
  const int64_t data_parts = layout.dp * layout.fsdp;
  if (input.size(0) % data_parts != 0) {
    return absl::InvalidArgumentError(absl::StrCat("a batch of ", input.size(0),
                                                   " does not split into ", data_parts,
                                                   " data-parallel ranks"));
  }
  const int64_t data_index = s.dp_index * layout.fsdp + s.fsdp_index;
  torch::NoGradGuard no_grad;  // and FSDP reshards at once without grad
  const double loss =
      s.model
          ->Loss(s.model->Layers().Forward(DataShard(input, data_parts, data_index)),
                 DataShard(target, data_parts, data_index))
          .item<double>();
  return MeanOver(s.dp, MeanOver(s.fsdp, loss));
}

absl::StatusOr<at::Tensor> Trainer::Predict(const at::Tensor& input) {
  State& s = *state_;
  if (s.stage) return absl::UnimplementedError("prediction with pipeline parallelism");
  torch::NoGradGuard no_grad;
  return s.model->GatherOutput(s.model->Layers().Forward(input));
}

std::vector<std::pair<std::string, at::Tensor>> Trainer::GatherFullParams() {
  std::vector<std::pair<std::string, at::Tensor>> full;
  for (const auto& param : Params()) full.emplace_back(param->name(), FullTensor(*param));
  return full;
}

std::vector<std::shared_ptr<Param>> Trainer::Params() const { return state_->Params(); }

absl::Status Trainer::Save(const std::string& dir) {
  absl::Status status;
  if (state_->dp_index == 0)
    status = SaveShards(dir, absl::StrCat("rank", state_->world->rank()), Params());
  state_->Barrier();
  return status;
}

absl::Status Trainer::Load(const std::string& dir) {
  state_->Barrier();
  return LoadShards(dir, Params());
}

const DeviceMesh& Trainer::mesh() const { return *state_->mesh; }
const TrainOptions& Trainer::options() const { return state_->options; }

std::string Trainer::Describe() const {
  const State& s = *state_;
  std::string text =
      absl::StrCat(s.options.layout.ToString(), " (", s.model->Describe(), ")");
  if (s.stage) {
    // Every stage's layers, not only this rank's: the split is the pipeline's.
    absl::StrAppend(
        &text, ": ", s.stage->Describe(), " (", ScheduleName(s.options.schedule), ", ",
        s.options.microbatches, " microbatches, ", s.stage->num_stages(),
        " stages starting at layers [", absl::StrJoin(s.stage->boundaries(), ", "), "])");
  }
  return text;
}

}  // namespace meshrun::worker::parallel
