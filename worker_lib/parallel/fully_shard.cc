#include "worker_lib/parallel/fully_shard.h"

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <functional>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "worker_lib/parallel/first_touch.h"

namespace meshrun::worker::parallel {
namespace {

using ParameterDict = torch::OrderedDict<std::string, at::Tensor>;

// torch::nn::Module keeps its registered parameters in a protected member
// and offers no way to replace one; FullyShard registers the shard in place
// of the full tensor (the module's own member keeps the full one).
struct ParameterAccess : torch::nn::Module {
  static ParameterDict& Of(torch::nn::Module& module) {
    return module.*(&ParameterAccess::parameters_);
  }
};

class ModuleUnit;

// The order in which forward touched the units, for prefetching and
// resharding after forward. Driven from the operators' thread (forward) and
// the autograd engine's (backward), which do not run at once. One for the
// process: two sharded models whose forwards interleave (a GAN's) prefetch
// less well, and stay correct (a touch gathers whatever is missing).
struct Schedule {
  // The units in the order this forward touched them, a unit once per run
  // of touches ([root, block0, block1, root]), and the forward's before.
  std::vector<ModuleUnit*> sequence;
  std::vector<ModuleUnit*> previous_sequence;
  // A backward ran since `sequence` began; the run of `sequence` it is in
  // (sequence.size() before its first touch).
  bool backward_ran = false;
  size_t backward_cursor = 0;
};
Schedule schedule;

// The units that took part in the backward pass running on this thread,
// settled by an engine callback at its end.
struct UnitsInBackward {
  bool callback_queued = false;
  std::vector<std::shared_ptr<ModuleUnit>> units;
};
thread_local UnitsInBackward units_in_backward;

void EndOfBackward();

class ModuleUnit : public TouchTarget, public std::enable_shared_from_this<ModuleUnit> {
 public:
  ModuleUnit(std::vector<std::shared_ptr<Param>> params, std::vector<at::Tensor> full,
             std::vector<std::shared_ptr<FsdpParamGroup>> groups, FsdpOptions options)
      : params_(std::move(params)),
        full_(std::move(full)),
        groups_(std::move(groups)),
        options_(options) {}

  ~ModuleUnit() override {
    for (const at::Tensor& tensor : full_) UnwatchStorage(tensor, this);
  }

  const std::vector<std::shared_ptr<Param>>& params() const { return params_; }
  const GatherCounts& counts() const { return counts_; }
  void set_contained() { root_ = false; }

  size_t unsharded_bytes() const {
    size_t total = 0;
    for (const auto& group : groups_) total += group->unsharded_bytes();
    return total;
  }

  bool OnTouch(std::string_view /*op_name*/) override {
    const bool in_backward = torch::autograd::get_current_graph_task_id() != -1;
    Gather();
    if (in_backward) {
      OnBackwardTouch();
    } else {
      OnForwardTouch();
    }
    return false;
  }

  void StartGather() {
    if (Stale()) Reshard();
    IssueGather();
  }

  void Reshard() {
    for (const auto& group : groups_) group->Reshard();
    versions_.clear();
  }

  // Post-accumulate-grad hook of full_[i]: hands its gradient to its group.
  void GradReady(size_t i) {
    JoinBackward();
    const at::Tensor& tensor = full_[i];
    at::Tensor grad = tensor.grad();
    tensor.mutable_grad().reset();
    FsdpParam* state = FsdpStateOf(*params_[i]);
    state->group().GradReady(state->index(), grad);
  }

  // End of a backward pass this unit took part in.
  void Settle() {
    expecting_grads_ = false;
    for (const auto& group : groups_) {
      group->ForgetPendingUses();
      group->StartReduceScatter();
    }
  }

 private:
  // Gathered, or its all-gather issued, for every group.
  bool Held() const {
    for (const auto& group : groups_) {
      if (!group->unsharded() && group->unsharded_bytes() == 0) return false;
    }
    return true;
  }

  // A shard changed since its all-gather was issued (an optimizer step, a
  // load): what is gathered, or in flight, is out of date.
  bool Stale() const {
    if (versions_.empty()) return false;
    for (size_t i = 0; i < params_.size(); ++i) {
      if (params_[i]->data()._version() != versions_[i]) return true;
    }
    return false;
  }

  void IssueGather() {
    if (versions_.empty() || !Held()) {
      versions_.clear();
      for (const auto& param : params_) versions_.push_back(param->data()._version());
    }
    for (const auto& group : groups_) group->StartUnshard();
  }

  void Gather() {
    if (Stale()) Reshard();
    bool gathered = true;
    for (const auto& group : groups_) gathered = gathered && group->unsharded();
    if (gathered) return;
    ++counts_.gathers;
    if (Held()) ++counts_.prefetched;
    IssueGather();
    for (const auto& group : groups_) group->Unshard();
  }

  void OnForwardTouch() {
    if (schedule.backward_ran) {
      schedule.previous_sequence = std::move(schedule.sequence);
      schedule.sequence.clear();
      schedule.backward_ran = false;
    }
    std::vector<ModuleUnit*>& sequence = schedule.sequence;
    if (sequence.empty() || sequence.back() != this) {
      ModuleUnit* previous = sequence.empty() ? nullptr : sequence.back();
      sequence.push_back(this);
      // A no-grad forward keeps nothing for a backward: free the unit before
      // whatever reshard_after_forward says, as fsdp.h does.
      if (previous != nullptr && !previous->root_ &&
          (previous->options_.reshard_after_forward || !at::GradMode::is_enabled())) {
        previous->Reshard();
      }
      // Prefetch what came next last time, while this forward has followed it.
      const size_t at = sequence.size() - 1;
      const std::vector<ModuleUnit*>& before = schedule.previous_sequence;
      if (at + 1 < before.size() && before[at] == this && before[at + 1] != this) {
        before[at + 1]->StartGather();
      }
    }
    if (at::GradMode::is_enabled() && !expecting_grads_) {
      expecting_grads_ = true;
      for (const auto& group : groups_) {
        for (size_t i = 0; i < group->num_params(); ++i) group->AddUse();
      }
    }
  }

  // Backward runs the forward's sequence in reverse: prefetch the unit
  // before this one's last run at or before where backward has got to.
  void OnBackwardTouch() {
    JoinBackward();
    const std::vector<ModuleUnit*>& sequence = schedule.sequence;
    if (sequence.empty()) return;
    // From the run backward is in (inclusive) towards the start.
    for (size_t j = std::min(schedule.backward_cursor, sequence.size() - 1) + 1;
         j-- > 0;) {
      if (sequence[j] != this) continue;
      schedule.backward_cursor = j;
      if (j > 0 && sequence[j - 1] != this) sequence[j - 1]->StartGather();
      return;
    }
  }

  void JoinBackward() {
    if (!schedule.backward_ran) {
      schedule.backward_ran = true;
      schedule.backward_cursor = schedule.sequence.size();
    }
    auto& pass = units_in_backward;
    if (!pass.callback_queued) {
      torch::autograd::Engine::get_default_engine().queue_callback(EndOfBackward);
      pass.callback_queued = true;
    }
    for (const auto& unit : pass.units) {
      if (unit.get() == this) return;
    }
    pass.units.push_back(shared_from_this());
  }

  std::vector<std::shared_ptr<Param>> params_;
  std::vector<at::Tensor> full_;
  std::vector<std::shared_ptr<FsdpParamGroup>> groups_;
  FsdpOptions options_;
  bool root_ = true;
  bool expecting_grads_ = false;
  // The shards' versions when their all-gather was issued.
  std::vector<int64_t> versions_;
  GatherCounts counts_;
};

void EndOfBackward() {
  std::vector<std::shared_ptr<ModuleUnit>> units = std::move(units_in_backward.units);
  units_in_backward.units.clear();
  units_in_backward.callback_queued = false;
  for (const auto& unit : units) unit->Settle();
}

struct GradReadyHook : torch::autograd::PostAccumulateGradHook {
  GradReadyHook(std::weak_ptr<ModuleUnit> unit, size_t index)
      : unit(std::move(unit)), index(index) {}
  void operator()(const torch::autograd::Variable& /*tensor*/) override {
    if (auto locked = unit.lock()) locked->GradReady(index);
  }
  std::weak_ptr<ModuleUnit> unit;
  size_t index;
};

// The units FullyShard made, by the module it was called on. Units live as
// long as the process (a module's destructor cannot be hooked either).
std::unordered_map<const torch::nn::Module*, std::vector<std::shared_ptr<ModuleUnit>>>&
UnitsByModule() {
  static auto* units = new std::unordered_map<const torch::nn::Module*,
                                              std::vector<std::shared_ptr<ModuleUnit>>>();
  return *units;
}

// The unit of each shard, by the shard's TensorImpl.
std::unordered_map<const c10::TensorImpl*, ModuleUnit*>& UnitsByShard() {
  static auto* units = new std::unordered_map<const c10::TensorImpl*, ModuleUnit*>();
  return *units;
}

ModuleUnit* UnitOfShard(const at::Tensor& tensor) {
  auto it = UnitsByShard().find(tensor.unsafeGetTensorImpl());
  return it == UnitsByShard().end() ? nullptr : it->second;
}

// A registered parameter to shard: where it is registered (possibly in
// several modules, for a tied weight) and its name relative to the module
// FullyShard was called on.
struct Registration {
  std::string name;
  at::Tensor tensor;
  std::vector<std::pair<torch::nn::Module*, std::string>> slots;
};

}  // namespace

absl::Status FullyShard(torch::nn::Module& module, const std::string& mesh_dim,
                        ProcessGroupPtr group, FsdpOptions options) {
  if (group == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "FullyShard(", module.name(), "): no process group for '", mesh_dim, "'"));
  }
  // The parameters no earlier unit took, and the earlier units below.
  std::vector<Registration> todo;
  std::unordered_map<const c10::TensorImpl*, size_t> seen;
  std::unordered_set<ModuleUnit*> contained;
  ForEachSubmodule(module, [&](torch::nn::Module& owner, const std::string& path) {
    const std::string prefix = path.empty() ? "" : path + ".";
    for (const auto& item : owner.named_parameters(/*recurse=*/false)) {
      const at::Tensor& tensor = item.value();
      if (ModuleUnit* unit = UnitOfShard(tensor)) {
        contained.insert(unit);
        continue;
      }
      auto [it, inserted] = seen.emplace(tensor.unsafeGetTensorImpl(), todo.size());
      if (inserted) todo.push_back(Registration{prefix + item.key(), tensor, {}});
      todo[it->second].slots.emplace_back(&owner, item.key());
    }
  });
  if (todo.empty() && contained.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("FullyShard(", module.name(), "): no parameters to shard"));
  }
  for (const Registration& reg : todo) {
    if (reg.tensor.dim() == 0 || reg.tensor.size(0) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "FullyShard(", module.name(), "): ", reg.name, " is ",
          c10::str(reg.tensor.sizes()), "; FSDP shards dim 0, which must not be empty"));
    }
  }
  for (ModuleUnit* unit : contained) unit->set_contained();
  if (todo.empty()) return absl::OkStatus();

  std::vector<std::shared_ptr<Param>> params;
  std::vector<at::Tensor> full;
  for (const Registration& reg : todo) {
    // A TP shard (parallelize.h) is sharded again, on its local rows.
    std::shared_ptr<Param> param = ParamOf(reg.tensor);
    params.push_back(param != nullptr ? param
                                      : Param::FromFull(reg.name, reg.tensor.detach()));
    full.push_back(reg.tensor);
  }
  absl::StatusOr<std::vector<std::shared_ptr<FsdpParamGroup>>> groups =
      ShardIntoGroups(params, mesh_dim, group);
  if (!groups.ok()) return groups.status();
  auto unit = std::make_shared<ModuleUnit>(params, full, *groups, options);
  for (size_t i = 0; i < todo.size(); ++i) {
    FsdpParam* state = FsdpStateOf(*params[i]);
    const bool requires_grad = full[i].requires_grad();
    params[i]->data().set_requires_grad(requires_grad);
    // The module's own tensor now lies over the unit's gathered storage,
    // empty until the first touch gathers it.
    state->AllocateUnsharded();
    const c10::Storage before = full[i].storage();
    {
      at::NoGradGuard no_grad;
      full[i].set_data(state->UnshardedAlias());
    }
    MoveWatches(before, full[i]);
    state->FreeUnsharded();
    for (const auto& [owner, key] : todo[i].slots) {
      ParameterAccess::Of(*owner)[key] = params[i]->data();
    }
    RecordParam(params[i]->data(), params[i]);
    UnitsByShard()[params[i]->data().unsafeGetTensorImpl()] = unit.get();
    WatchStorage(full[i], unit.get());
    if (requires_grad) {
      torch::autograd::impl::set_post_acc_grad_hooks(
          full[i], std::make_unique<GradReadyHook>(unit, i));
    }
  }
  UnitsByModule()[&module].push_back(std::move(unit));
  return absl::OkStatus();
}

size_t UnshardedBytes(const torch::nn::Module& module) {
  size_t total = 0;
  const auto& units = UnitsByModule();
  ForEachSubmodule(const_cast<torch::nn::Module&>(module),
                   [&](torch::nn::Module& owner, const std::string& /*path*/) {
                     auto it = units.find(&owner);
                     if (it == units.end()) return;
                     for (const auto& unit : it->second) total += unit->unsharded_bytes();
                   });
  return total;
}

GatherCounts CountGathers(const torch::nn::Module& module) {
  GatherCounts total;
  const auto& units = UnitsByModule();
  ForEachSubmodule(const_cast<torch::nn::Module&>(module),
                   [&](torch::nn::Module& owner, const std::string& /*path*/) {
                     auto it = units.find(&owner);
                     if (it == units.end()) return;
                     for (const auto& unit : it->second) {
                       total.gathers += unit->counts().gathers;
                       total.prefetched += unit->counts().prefetched;
                     }
                   });
  return total;
}

}  // namespace meshrun::worker::parallel
