#include "worker_lib/training/module_trainer.h"

#include <algorithm>
#include <exception>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "worker_lib/data/data.h"
#include "worker_lib/parallel/fully_shard.h"
#include "worker_lib/parallel/module_params.h"
#include "worker_lib/parallel/pp_schedule.h"
#include "worker_lib/training/module_checkpoint.h"

namespace meshrun::worker::parallel {
namespace {

absl::Status Validate(const ModuleLayout& layout, const ModuleModel& model, int world) {
  const int size = layout.dp * layout.fsdp * layout.pp * layout.tp;
  if (std::min({layout.dp, layout.fsdp, layout.pp, layout.tp}) < 1 || size != world) {
    return absl::InvalidArgumentError(absl::StrCat("ModuleTrainer: layout ",
                                                   layout.ToString(), " needs ", size,
                                                   " ranks, the world has ", world));
  }
  if (model.root == nullptr || !model.forward || !model.loss)
    return absl::InvalidArgumentError(
        "ModuleTrainer: the model needs a root, a forward and a loss");
  if (layout.pipeline) {
    if (absl::Status valid = ValidateSchedule(layout.schedule, layout.pp,
                                              layout.microbatches, layout.virtual_stages);
        !valid.ok())
      return valid;
    const int stages = layout.pp * layout.virtual_stages;
    if (!model.stage_of || model.num_parts < stages) {
      return absl::InvalidArgumentError(absl::StrCat(
          "ModuleTrainer: ", stages, " pipeline stages need a model of at least ", stages,
          " parts and a stage_of; it has ", model.num_parts));
    }
  } else if (layout.pp != 1 || layout.virtual_stages != 1) {
    return absl::InvalidArgumentError(
        "ModuleTrainer: pp and virtual_stages are the pipeline's: set pipeline");
  }
  if (layout.microbatches < 1)
    return absl::InvalidArgumentError("ModuleTrainer: microbatches must be >= 1");
  return absl::OkStatus();
}

}  // namespace

ModuleLayout ModuleLayout::FromSizes(int dp, int fsdp, int pp, int tp) {
  ModuleLayout layout;
  layout.dp = dp;
  layout.fsdp = fsdp;
  layout.pp = pp;
  layout.tp = tp;
  layout.replicate = dp > 1;
  layout.fully_shard = fsdp > 1;
  layout.pipeline = pp > 1;
  layout.tensor_parallel = tp > 1;
  return layout;
}

std::string ModuleLayout::ToString() const {
  std::vector<std::string> applied;
  if (tensor_parallel) applied.push_back("TP plan over tp");
  if (fully_shard)
    applied.push_back(reshard_after_forward ? "FullyShard over fsdp"
                                            : "FullyShard over fsdp (no reshard)");
  if (pipeline) {
    applied.push_back(absl::StrCat(
        ScheduleName(schedule), " over pp",
        virtual_stages > 1 ? absl::StrCat(" (", virtual_stages, " chunks a rank)") : "",
        ", ", microbatches, " microbatches"));
  }
  if (replicate) applied.push_back("DDP over dp");
  return absl::StrCat("dp=", dp, " fsdp=", fsdp, " pp=", pp, " tp=", tp,
                      applied.empty() ? "" : ": ", absl::StrJoin(applied, ", "));
}

absl::StatusOr<std::unique_ptr<ModuleTrainer>> ModuleTrainer::Create(
    std::shared_ptr<World> world, const ModuleLayout& layout, ModuleModel model,
    const MakeOptimizer& make_optimizer, ReplicaGradientSync* replica_sync) {
  if (world == nullptr) return absl::InvalidArgumentError("ModuleTrainer: no world");
  if (absl::Status status = Validate(layout, model, world->size()); !status.ok())
    return status;
  if (replica_sync != nullptr && layout.pipeline)
    return absl::UnimplementedError(
        "ModuleTrainer: fault-tolerant replicas of pipeline stages");
  auto mesh = InitDeviceMesh(world, layout.device_type,
                             {layout.dp, layout.fsdp, layout.pp, layout.tp},
                             {{"dp", "fsdp", "pp", "tp"}});
  if (!mesh.ok()) return mesh.status();
  auto trainer = std::unique_ptr<ModuleTrainer>(
      new ModuleTrainer(std::move(world), *std::move(mesh), layout, std::move(model)));
  trainer->replica_sync_ = replica_sync;
  try {
    if (absl::Status status = trainer->Parallelize(make_optimizer); !status.ok())
      return status;
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("ModuleTrainer: ", e.what()));
  }
  return trainer;
}

absl::Status ModuleTrainer::Parallelize(const MakeOptimizer& make_optimizer) {
  torch::nn::Module& root = *model_.root;
  loss_ = model_.loss;
  // In PyTorch's order: TP on the whole model, then FSDP, then pipeline
  // stages of the parallelised modules, DDP on what each rank trains.
  if (layout_.tensor_parallel) {
    ProcessGroupPtr tp = group("tp");
    if (absl::Status s = ParallelizeModule(root, "tp", tp, model_.tp_plan); !s.ok())
      return s;
    if (model_.vocab_parallel_output) {
      loss_ = [tp](const at::Tensor& logits, const at::Tensor& targets) {
        return LossParallel(logits, targets, tp);
      };
    }
  }
  if (layout_.fully_shard && !layout_.pipeline) {
    if (absl::Status s = ShardUnitsAndRoot(root); !s.ok()) return s;
  }
  if (layout_.pipeline) {
    ProcessGroupPtr pp = group("pp");
    const int chunks = layout_.virtual_stages;
    // Validate checked that there are enough parts.
    const auto parts = CutParts(model_.num_parts, layout_.pp * chunks).value();
    std::vector<torch::nn::AnyModule> modules;
    for (int c = 0; c < chunks; ++c) {
      const int index = c * layout_.pp + pp->getRank();
      const auto [first, last] = parts[static_cast<size_t>(index)];
      stage_parts_.push_back({index, first, last});
      torch::nn::AnyModule module = model_.stage_of(first, last);
      // FSDP2 with pipelines: each stage module is a root of its units.
      if (layout_.fully_shard) {
        if (absl::Status s = ShardUnitsAndRoot(*module.ptr()); !s.ok()) return s;
      }
      if (layout_.replicate) {
        auto ddp = DistributedDataParallel::Wrap(*module.ptr(), group("dp"));
        if (!ddp.ok()) return ddp.status();
        replicas_.push_back(*std::move(ddp));
      }
      stage_modules_.push_back(module.ptr());
      modules.push_back(std::move(module));
    }
    auto stage = MakeStage(std::move(modules), pp);
    if (!stage.ok()) return stage.status();
    stage_ = *std::move(stage);
  } else if (layout_.replicate) {
    auto ddp = DistributedDataParallel::Wrap(root, group("dp"));
    if (!ddp.ok()) return ddp.status();
    replicas_.push_back(*std::move(ddp));
  }
  optimizer_ = make_optimizer(stage_ ? stage_->Leaves() : root.parameters());
  if (optimizer_ == nullptr)
    return absl::InvalidArgumentError("ModuleTrainer: make_optimizer gave none");
  if (!stage_) state_ = std::make_unique<ModuleTrainingState>(root, *optimizer_);
  return absl::OkStatus();
}

absl::Status ModuleTrainer::ShardUnitsAndRoot(torch::nn::Module& root) {
  const FsdpOptions options{layout_.reshard_after_forward};
  // The units inside `root` (a stage module holds some of the model's).
  std::vector<const torch::nn::Module*> inside;
  for (const auto& module : root.modules(/*include_self=*/true))
    inside.push_back(module.get());
  for (const auto& unit : model_.shard_units) {
    if (std::find(inside.begin(), inside.end(), unit.get()) == inside.end()) continue;
    if (absl::Status s = FullyShard(*unit, "fsdp", group("fsdp"), options); !s.ok())
      return s;
  }
  return FullyShard(root, "fsdp", group("fsdp"), options);
}

absl::Status ModuleTrainer::NotPipelined(const char* what) const {
  if (!stage_) return absl::OkStatus();
  return absl::UnimplementedError(
      absl::StrCat("ModuleTrainer: ", what, " with pipeline stages"));
}

ProcessGroupPtr ModuleTrainer::group(const std::string& dim) const {
  // The four dimensions always exist (InitDeviceMesh in Create).
  return mesh_.GetGroup(dim).value();
}

at::Tensor ModuleTrainer::MyRows(const at::Tensor& batch) const {
  const int fsdp = layout_.fsdp;
  const int index = group("dp")->getRank() * fsdp + group("fsdp")->getRank();
  return DataShard(batch, layout_.dp * fsdp, index);
}

double ModuleTrainer::MeanOverWorld(const at::Tensor& loss) const {
  // Every rank holds its rows' loss (TP and PP ranks of a data rank the
  // same): the world's mean is the data ranks'.
  std::vector<at::Tensor> tensors{loss.detach().to(at::kDouble).reshape({1}).clone()};
  world_->group()->allreduce(tensors)->wait();
  return tensors[0].item<double>() / static_cast<double>(world_->size());
}

absl::StatusOr<double> ModuleTrainer::Step(const at::Tensor& input,
                                           const at::Tensor& target) {
  try {
    const at::Tensor rows = MyRows(input), targets = MyRows(target);
    optimizer_->zero_grad();
    at::Tensor loss;
    if (stage_) {
      {
        // A backward per microbatch: DDP averages once, after the schedule.
        std::vector<DistributedDataParallel::NoSync> no_sync;
        for (auto& replica : replicas_) no_sync.push_back(replica->no_sync());
        auto value = RunStep(*stage_, layout_.schedule, layout_.microbatches, rows,
                             targets, loss_);
        if (!value.ok()) return value.status();
        loss =
            at::full({}, *value, at::TensorOptions(at::kDouble).device(stage_->device()));
      }
      for (auto& replica : replicas_) replica->SyncGradients();
    } else {
      loss = loss_(model_.forward(rows), targets);
      loss.backward();
    }
    double value = MeanOverWorld(loss);
    if (replica_sync_ != nullptr) {
      absl::StatusOr<bool> commit = replica_sync_->Sync(state_->params(), &value);
      if (!commit.ok()) return commit.status();
      if (!*commit) return absl::AbortedError("the step was discarded");
    }
    optimizer_->step();
    return value;
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("ModuleTrainer: step: ", e.what()));
  }
}

absl::StatusOr<double> ModuleTrainer::Evaluate(const at::Tensor& input,
                                               const at::Tensor& target) {
  if (absl::Status s = NotPipelined("Evaluate"); !s.ok()) return s;
  try {
    at::NoGradGuard no_grad;
    return MeanOverWorld(loss_(model_.forward(MyRows(input)), MyRows(target)));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("ModuleTrainer: evaluate: ", e.what()));
  }
}

absl::StatusOr<at::Tensor> ModuleTrainer::Predict(const at::Tensor& input) {
  if (absl::Status s = NotPipelined("Predict"); !s.ok()) return s;
  try {
    at::NoGradGuard no_grad;
    return model_.forward(input);
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("ModuleTrainer: predict: ", e.what()));
  }
}

TensorFilter ModuleTrainer::Trained() const {
  if (!stage_) return nullptr;
  // The stage modules' parameters and buffers, by identity.
  auto mine = std::make_shared<std::vector<const c10::TensorImpl*>>();
  for (const at::Tensor& leaf : stage_->Leaves())
    mine->push_back(leaf.unsafeGetTensorImpl());
  for (const auto& module : stage_modules_) {
    for (const at::Tensor& buffer : module->buffers())
      mine->push_back(buffer.unsafeGetTensorImpl());
  }
  return [mine](const at::Tensor& tensor) {
    return std::find(mine->begin(), mine->end(), tensor.unsafeGetTensorImpl()) !=
           mine->end();
  };
}

absl::Status ModuleTrainer::Save(const std::string& dir) {
  absl::Status status;
  if (group("dp")->getRank() == 0) {
    status = SaveModule(dir, absl::StrCat("rank", world_->rank()), *model_.root,
                        optimizer_.get(), Trained());
  }
  world_->group()->barrier()->wait();
  return status;
}

absl::Status ModuleTrainer::Load(const std::string& dir) {
  world_->group()->barrier()->wait();
  return LoadModule(dir, *model_.root, optimizer_.get(), Trained());
}

std::map<std::string, at::Tensor> ModuleTrainer::FullParams() const {
  std::map<std::string, at::Tensor> full;
  const std::vector<at::Tensor> leaves =
      stage_ ? stage_->Leaves() : std::vector<at::Tensor>{};
  for (const auto& item : model_.root->named_parameters()) {
    if (stage_ && std::none_of(leaves.begin(), leaves.end(), [&](const at::Tensor& leaf) {
          return leaf.is_same(item.value());
        }))
      continue;
    const std::shared_ptr<Param> param = ParamOf(item.value());
    full[item.key()] = (param ? FullTensor(*param) : item.value()).detach().cpu();
  }
  return full;
}

}  // namespace meshrun::worker::parallel
