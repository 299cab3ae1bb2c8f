#include "worker_lib/parallel/fully_shard.h"

#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "worker_lib/parallel/module_hooks.h"
#include "worker_lib/parallel/sharding.h"

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

bool InBackward() { return torch::autograd::get_current_graph_task_id() != -1; }

class Unit;

// What the units of one model share (FSDP2's FSDPStateContext): built by
// the FullyShard of the outermost module, which the others' are merged into.
// Driven from the thread of the forward and from the autograd engine's
// during its backward, which do not run at once for one model.
struct UnitContext {
  // Every unit, in FullyShard order (the same on every rank): the final
  // callback's order.
  std::vector<std::weak_ptr<Unit>> units;
  // The unit whose forward began this iteration's (FSDP2's
  // iter_forward_root), while it runs.
  Unit* forward_root = nullptr;
  // This iteration's pre-forward order, and the last one's (forward
  // prefetch); its post-forward order, with multiplicity (backward prefetch).
  std::vector<Unit*> pre_forward_order;
  std::vector<Unit*> previous_pre_forward_order;
  std::vector<Unit*> post_forward_order;
  // A backward that reached a unit has queued the final callback and not
  // run it yet (it never runs if that backward threw).
  bool backward_pending = false;
  // The one reduce-scatter in flight.
  std::shared_ptr<FsdpParamGroup> scattering;

  void FinishScattering() {
    if (scattering == nullptr) return;
    std::shared_ptr<FsdpParamGroup> group = std::move(scattering);
    scattering = nullptr;
    group->FinishReduceScatter();
  }
};

// FSDP2's RegisterPostBackwardFunction: identity on the unit's inputs, whose
// backward runs once the gradients of all of them are computed, i.e. after
// the unit's own backward.
struct UnitRef : torch::CustomClassHolder {
  explicit UnitRef(std::weak_ptr<Unit> unit) : unit(std::move(unit)) {}
  std::weak_ptr<Unit> unit;
};

struct PostBackward : torch::autograd::Function<PostBackward> {
  // `inputs` as a TensorList: autograd's argument extraction takes a
  // std::vector<at::Tensor> for a non-tensor argument.
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                at::TensorList inputs,
                                                std::weak_ptr<Unit> unit) {
    ctx->saved_data["unit"] =
        c10::IValue::make_capsule(c10::make_intrusive<UnitRef>(std::move(unit)));
    return inputs.vec();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads);
};

enum class UnitState { kIdle, kForward, kPreBackward, kPostBackward };

class Unit : public ForwardHook, public std::enable_shared_from_this<Unit> {
 public:
  Unit(std::vector<std::shared_ptr<Param>> params, std::vector<at::Tensor> full,
       std::vector<std::shared_ptr<FsdpParamGroup>> groups, FsdpOptions options)
      : params_(std::move(params)),
        full_(std::move(full)),
        groups_(std::move(groups)),
        options_(options),
        context_(std::make_shared<UnitContext>()) {
    // Which of full_ each group member is (groups are per dtype, so their
    // members interleave).
    for (const auto& group : groups_) {
      std::vector<size_t>& indices = full_index_.emplace_back();
      for (size_t m = 0; m < group->num_params(); ++m) {
        for (size_t i = 0; i < params_.size(); ++i) {
          if (FsdpStateOf(*params_[i]) == &group->member(m)) indices.push_back(i);
        }
      }
    }
  }

  const GatherCounts& counts() const { return counts_; }
  const std::shared_ptr<UnitContext>& context() const { return context_; }
  void set_context(std::shared_ptr<UnitContext> context) {
    context_ = std::move(context);
  }
  void Borrow(const std::shared_ptr<Unit>& owner) {
    for (const auto& unit : borrowed_) {
      if (unit.lock() == owner) return;
    }
    borrowed_.push_back(owner);
  }

  size_t unsharded_bytes() const {
    size_t total = 0;
    for (const auto& group : groups_) total += group->unsharded_bytes();
    return total;
  }

  // ---- Forward (ForwardHook) ----

  void PreForward(std::vector<at::Tensor>& inputs) override {
    try {
      EnterForward(inputs);
    } catch (...) {
      // Forward's scope runs ForwardFailed only for hooks whose PreForward
      // returned.
      ForwardFailed();
      throw;
    }
  }

  void EnterForward(std::vector<at::Tensor>& inputs) {
    UnitContext& context = *context_;
    if (InBackward()) {
      // Recomputation inside backward (activation checkpointing): gather
      // whatever it needs, and leave the schedule alone; resharding is the
      // post-backward's.
      recomputing_ = true;
      Gather();
      HoldBorrowed();
      RegisterPostBackward(inputs);
      return;
    }
    if (context.forward_root == nullptr) {
      context.forward_root = this;
      RootPreForward();
    }
    state_ = UnitState::kForward;
    context.pre_forward_order.push_back(this);
    Gather();
    HoldBorrowed();
    // Prefetch what came next in the last iteration, while this one has
    // followed it so far.
    const size_t at = context.pre_forward_order.size() - 1;
    const std::vector<Unit*>& before = context.previous_pre_forward_order;
    if (at + 1 < before.size() && before[at] == this && before[at + 1] != this) {
      before[at + 1]->StartGather();
    }
    RegisterPostBackward(inputs);
  }

  void PostForward(std::vector<at::Tensor>& outputs) override {
    UnitContext& context = *context_;
    ReleaseBorrowed();
    const bool recomputing = std::exchange(recomputing_, false);
    const bool grad = at::GradMode::is_enabled();
    bool hooked = false;
    if (grad) {
      for (const at::Tensor& output : outputs) {
        if (!output.defined() || !output.requires_grad()) continue;
        std::weak_ptr<Unit> self = weak_from_this();
        output.register_hook([self](const at::Tensor& /*grad*/) {
          if (auto unit = self.lock()) unit->PreBackward();
        });
        hooked = true;
      }
    }
    if (recomputing) return;
    if (hooked) {
      post_forward_indices_.push_back(context.post_forward_order.size());
      context.post_forward_order.push_back(this);
    }
    state_ = UnitState::kIdle;
    const bool root = context.forward_root == this;
    // A forward with nothing to backpropagate (eval, no_grad) keeps nothing,
    // the root included; the root keeps its parameters for the backward
    // that follows, as FSDP2's does.
    keep_gathered_ = hooked && (root || !options_.reshard_after_forward);
    if (!keep_gathered_ && holds_ == 0) Reshard();
    if (root) context.forward_root = nullptr;
  }

  void ForwardFailed() override {
    ReleaseBorrowed();
    recomputing_ = false;
    state_ = UnitState::kIdle;
    if (context_->forward_root == this) context_->forward_root = nullptr;
  }

  // ---- Backward ----

  // A tensor hook on the unit's outputs: the first one reached in a
  // backward gathers the unit before its own backward runs.
  void PreBackward() {
    UnitContext& context = *context_;
    if (!context.backward_pending) {
      context.backward_pending = true;
      std::weak_ptr<UnitContext> weak_context = context_;
      torch::autograd::Engine::get_default_engine().queue_callback([weak_context] {
        if (auto locked = weak_context.lock()) FinalCallback(*locked);
      });
    }
    if (state_ == UnitState::kPreBackward) return;
    state_ = UnitState::kPreBackward;
    Gather();
    HoldBorrowed();
    // Prefetch the unit whose forward ended before this use's (FSDP2's
    // reverse post-forward order).
    if (!post_forward_indices_.empty()) {
      const size_t index = post_forward_indices_.back();
      post_forward_indices_.pop_back();
      if (index > 0 && index - 1 < context.post_forward_order.size()) {
        Unit* previous = context.post_forward_order[index - 1];
        if (previous != this) previous->StartGather();
      }
    }
  }

  // After the unit's backward (PostBackward's node), or from the final
  // callback for a unit whose inputs needed no gradient: reduce-scatters
  // the gradients its parameters have, frees them, reshards.
  void RunPostBackward() {
    UnitContext& context = *context_;
    if (state_ == UnitState::kPreBackward) ReleaseBorrowed();
    state_ = UnitState::kPostBackward;
    keep_gathered_ = false;
    for (size_t g = 0; g < groups_.size(); ++g) {
      const std::shared_ptr<FsdpParamGroup>& group = groups_[g];
      std::vector<at::Tensor> grads(group->num_params());
      for (size_t i = 0; i < group->num_params(); ++i) {
        const at::Tensor& tensor = full_[full_index_[g][i]];
        if (!tensor.grad().defined()) continue;
        grads[i] = tensor.grad();
        tensor.mutable_grad().reset();
      }
      context.FinishScattering();
      if (group->ReduceScatter(grads)) {
        context.scattering = group;
        ++counts_.reduce_scatters;
      }
    }
    if (holds_ == 0) Reshard();
  }

  bool HasFullGrads() const {
    for (const at::Tensor& tensor : full_) {
      if (tensor.grad().defined()) return true;
    }
    return false;
  }

  // ---- Between iterations ----

  // A backward that threw left this unit mid-iteration: wait out and drop
  // its collectives in flight (every rank issued them), its gradients not
  // yet reduce-scattered, and its holds.
  void Abandon() {
    WriteBack();
    for (const auto& group : groups_) group->Abandon();
    full_versions_.clear();
    PointAtShards();
    for (const at::Tensor& tensor : full_) {
      if (tensor.grad().defined()) tensor.mutable_grad().reset();
    }
    holds_ = 0;
    recomputing_ = false;
    keep_gathered_ = false;
    state_ = UnitState::kIdle;
    post_forward_indices_.clear();
    versions_.clear();
  }

  // For Gathered (fully_shard.h).
  void Hold() {
    Gather();
    ++holds_;
  }
  void Release() {
    if (holds_ > 0 && --holds_ == 0 && !keep_gathered_) Reshard();
  }

  void EndBackward() {
    state_ = UnitState::kIdle;
    post_forward_indices_.clear();
    if (holds_ == 0 && !keep_gathered_) Reshard();
  }

  void StartGather() {
    if (Stale()) Reshard();
    IssueGather();
  }

  // Frees the gathered parameters, first copying into the shards what was
  // written to the full tensors while they were gathered (an init or a load
  // under no_grad: never lost).
  void Reshard() {
    WriteBack();
    for (const auto& group : groups_) group->Reshard();
    versions_.clear();
    full_versions_.clear();
    PointAtShards();
  }

  // Between uses, the module's own tensors are this rank's rows of their
  // shards (FSDP2's module attributes are the sharded DTensors then): a
  // read sees them, a write lands in the shard, a full-shape copy fails.
  void PointAtShards() {
    if (!points_at_gathered_) return;
    points_at_gathered_ = false;
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < full_.size(); ++i) {
      full_[i].set_data(params_[i]->data().narrow(0, 0, RowsOf(i).size));
    }
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
    at::NoGradGuard no_grad;
    full_versions_.clear();
    for (size_t i = 0; i < full_.size(); ++i) {
      full_[i].set_data(FsdpStateOf(*params_[i])->UnshardedAlias());
      full_versions_.push_back(full_[i]._version());
    }
    points_at_gathered_ = true;
  }

 private:
  static void FinalCallback(UnitContext& context) {
    // FSDP2's root post-backward final callback: the post-backward of units
    // whose inputs needed no gradient, and of gradients that came after a
    // unit's post-backward (a weight tied into a unit whose backward ran
    // later), then the last reduce-scatter's wait.
    for (const auto& weak : context.units) {
      auto unit = weak.lock();
      if (unit == nullptr) continue;
      if (unit->state_ != UnitState::kPostBackward || unit->HasFullGrads()) {
        unit->RunPostBackward();
      }
    }
    context.FinishScattering();
    for (const auto& weak : context.units) {
      if (auto unit = weak.lock()) unit->EndBackward();
    }
    context.post_forward_order.clear();
    context.backward_pending = false;
  }

  // Once per iteration, before the first unit's forward.
  void RootPreForward() {
    UnitContext& context = *context_;
    if (context.backward_pending) {
      // The last backward never reached its final callback: it threw.
      context.scattering = nullptr;
      for (const auto& weak : context.units) {
        if (auto unit = weak.lock()) unit->Abandon();
      }
      context.backward_pending = false;
    }
    // Units the last forward left gathered with no backward since.
    for (const auto& weak : context.units) {
      auto unit = weak.lock();
      if (unit != nullptr && unit->holds_ == 0) {
        unit->keep_gathered_ = false;
        unit->post_forward_indices_.clear();
        if (unit.get() != this && unit->unsharded_bytes() > 0) unit->Reshard();
      }
    }
    if (!context.pre_forward_order.empty()) {
      context.previous_pre_forward_order = std::move(context.pre_forward_order);
    }
    context.pre_forward_order.clear();
    context.post_forward_order.clear();
  }

  void RegisterPostBackward(std::vector<at::Tensor>& inputs) {
    if (!at::GradMode::is_enabled()) return;
    std::vector<size_t> positions;
    torch::autograd::variable_list wrapped;
    for (size_t i = 0; i < inputs.size(); ++i) {
      if (inputs[i].defined() && inputs[i].requires_grad()) {
        positions.push_back(i);
        wrapped.push_back(inputs[i]);
      }
    }
    if (wrapped.empty()) return;
    wrapped = PostBackward::apply(at::TensorList(wrapped), weak_from_this());
    for (size_t k = 0; k < positions.size(); ++k) inputs[positions[k]] = wrapped[k];
  }

  // The units whose parameters this unit's module uses too (tied weights)
  // stay gathered while this unit's forward or backward runs.
  void HoldBorrowed() {
    for (const auto& weak : borrowed_) {
      auto owner = weak.lock();
      if (owner == nullptr) continue;
      owner->Gather();
      ++owner->holds_;
    }
  }
  void ReleaseBorrowed() {
    for (const auto& weak : borrowed_) {
      auto owner = weak.lock();
      if (owner == nullptr || owner->holds_ == 0) continue;
      if (--owner->holds_ == 0 && !owner->keep_gathered_ &&
          owner->state_ != UnitState::kForward &&
          owner->state_ != UnitState::kPreBackward) {
        owner->Reshard();
      }
    }
  }

  // This rank's rows of param `i` (of the unit's local tensor).
  ChunkExtent RowsOf(size_t i) const {
    const ShardStep& step = params_[i]->steps().back();
    return ChunkOf(FsdpStateOf(*params_[i])->rows(), step.parts, step.index);
  }

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
    for (const auto& group : groups_) {
      if (!group->unsharded() && group->unsharded_bytes() == 0) ++counts_.all_gathers;
      group->StartUnshard();
    }
  }

  void WriteBack() {
    if (full_versions_.size() != full_.size()) return;
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < full_.size(); ++i) {
      if (full_[i]._version() == full_versions_[i]) continue;
      FsdpParam* state = FsdpStateOf(*params_[i]);
      if (state == nullptr || !state->unsharded()) continue;
      const ChunkExtent chunk = RowsOf(i);
      params_[i]
          ->data()
          .narrow(0, 0, chunk.size)
          .copy_(full_[i].narrow(0, chunk.offset, chunk.size));
    }
  }

  std::vector<std::shared_ptr<Param>> params_;
  std::vector<at::Tensor> full_;
  std::vector<std::shared_ptr<FsdpParamGroup>> groups_;
  FsdpOptions options_;
  std::vector<std::vector<size_t>> full_index_;
  std::shared_ptr<UnitContext> context_;
  std::vector<std::weak_ptr<Unit>> borrowed_;
  UnitState state_ = UnitState::kIdle;
  bool recomputing_ = false;
  // The module's tensors lie over the gathered storage (else over the
  // shards' rows); true until the setup points them at the shards.
  bool points_at_gathered_ = true;
  // After a forward in grad mode that did not reshard (the root, or
  // reshard_after_forward off): kept for the backward.
  bool keep_gathered_ = false;
  // Borrowers in their forward or backward.
  int holds_ = 0;
  std::vector<size_t> post_forward_indices_;
  // The shards' versions when their all-gather was issued; the full
  // tensors' when they were gathered.
  std::vector<int64_t> versions_;
  std::vector<int64_t> full_versions_;
  GatherCounts counts_;
};

torch::autograd::variable_list PostBackward::backward(
    torch::autograd::AutogradContext* ctx, torch::autograd::variable_list grads) {
  auto ref =
      c10::static_intrusive_pointer_cast<UnitRef>(ctx->saved_data["unit"].toCapsule());
  if (auto unit = ref->unit.lock()) unit->RunPostBackward();
  grads.emplace_back();  // for the unit argument
  return grads;
}

// Every unit FullyShard made inside `module` (its own included).
std::vector<std::shared_ptr<Unit>> UnitsIn(const torch::nn::Module& module) {
  std::vector<std::shared_ptr<Unit>> units;
  ForEachSubmodule(const_cast<torch::nn::Module&>(module),
                   [&](torch::nn::Module& owner, const std::string& /*path*/) {
                     const ModuleHooks* hooks = FindHooks(owner);
                     if (hooks == nullptr) return;
                     for (const auto& hook : hooks->hooks()) {
                       if (auto unit = std::dynamic_pointer_cast<Unit>(hook)) {
                         units.push_back(std::move(unit));
                       }
                     }
                   });
  return units;
}

std::shared_ptr<Unit> UnitOwning(const at::Tensor& tensor) {
  std::shared_ptr<Param> param = ParamOf(tensor);
  FsdpParam* state = param == nullptr ? nullptr : FsdpStateOf(*param);
  if (state == nullptr) return nullptr;
  return std::static_pointer_cast<Unit>(state->owner());
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
  if (const ModuleHooks* hooks = FindHooks(module)) {
    for (const auto& hook : hooks->hooks()) {
      if (std::dynamic_pointer_cast<Unit>(hook) != nullptr) {
        return absl::FailedPreconditionError(
            absl::StrCat("FullyShard(", module.name(), "): already a unit"));
      }
    }
  }
  // The parameters no earlier unit took; the earlier units below (their
  // shards are registered here), and those whose full tensors are
  // registered here too (weights tied into this module).
  std::vector<Registration> todo;
  std::unordered_map<const c10::TensorImpl*, size_t> seen;
  std::vector<std::shared_ptr<Unit>> contained;
  std::vector<
      std::pair<std::shared_ptr<Unit>, std::pair<torch::nn::Module*, std::string>>>
      tied;
  ForEachSubmodule(module, [&](torch::nn::Module& owner, const std::string& path) {
    const std::string prefix = path.empty() ? "" : path + ".";
    for (const auto& item : owner.named_parameters(/*recurse=*/false)) {
      const at::Tensor& tensor = item.value();
      if (std::shared_ptr<Unit> unit = UnitOwning(tensor)) {
        const bool is_shard =
            ParamOf(tensor)->data().unsafeGetTensorImpl() == tensor.unsafeGetTensorImpl();
        if (is_shard) {
          if (std::find(contained.begin(), contained.end(), unit) == contained.end())
            contained.push_back(unit);
        } else {
          tied.push_back({unit, {&owner, item.key()}});
        }
        continue;
      }
      auto [it, inserted] = seen.emplace(tensor.unsafeGetTensorImpl(), todo.size());
      if (inserted) todo.push_back(Registration{prefix + item.key(), tensor, {}});
      todo[it->second].slots.emplace_back(&owner, item.key());
    }
  });
  if (todo.empty() && contained.empty() && tied.empty()) {
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

  std::vector<std::shared_ptr<Param>> params;
  std::vector<at::Tensor> full;
  for (const Registration& reg : todo) {
    // A TP shard (parallelize.h) is sharded again, on its local rows.
    std::shared_ptr<Param> param = ParamOf(reg.tensor);
    params.push_back(param != nullptr ? param
                                      : Param::FromFull(reg.name, reg.tensor.detach()));
    full.push_back(reg.tensor);
  }
  std::vector<std::shared_ptr<FsdpParamGroup>> groups;
  if (!params.empty()) {
    absl::StatusOr<std::vector<std::shared_ptr<FsdpParamGroup>>> made =
        ShardIntoGroups(params, mesh_dim, group);
    if (!made.ok()) return made.status();
    groups = *std::move(made);
  }
  auto unit = std::make_shared<Unit>(params, full, groups, options);
  // The module's own tensors: this rank's rows until the unit's forward
  // gathers them.
  unit->PointAtShards();
  for (size_t i = 0; i < todo.size(); ++i) {
    FsdpParam* state = FsdpStateOf(*params[i]);
    const bool requires_grad = full[i].requires_grad();
    params[i]->data().set_requires_grad(requires_grad);
    state->set_owner(unit);
    for (const auto& [owner, key] : todo[i].slots) {
      ParameterAccess::Of(*owner)[key] = params[i]->data();
    }
    RecordParam(params[i]->data(), params[i]);
    RecordParam(full[i], params[i]);
  }
  // One context for this unit and every unit below it.
  std::shared_ptr<UnitContext> context = unit->context();
  for (const auto& below : contained) {
    std::shared_ptr<UnitContext> theirs = below->context();
    if (theirs == context) continue;
    for (const auto& weak : theirs->units) {
      if (auto member = weak.lock()) {
        member->set_context(context);
        context->units.push_back(member);
      }
    }
  }
  context->units.push_back(unit);
  // A weight of an earlier unit tied into this module: registered as that
  // unit's shard here too (one parameter), gathered for this unit's forward
  // and backward.
  for (auto& [owner_unit, slot] : tied) {
    unit->Borrow(owner_unit);
    const at::Tensor& full_tensor = ParameterAccess::Of(*slot.first)[slot.second];
    ParameterAccess::Of(*slot.first)[slot.second] = ParamOf(full_tensor)->data();
  }
  // FSDP's gather comes before the other hooks of the module (tensor
  // parallelism's), as fully_shard prepends its pre-forward hook.
  HooksOf(module).Add(unit, /*first=*/true);
  return absl::OkStatus();
}

size_t UnshardedBytes(const torch::nn::Module& module) {
  size_t total = 0;
  for (const auto& unit : UnitsIn(module)) total += unit->unsharded_bytes();
  return total;
}

Gathered::Gathered(torch::nn::Module& module) {
  for (auto& unit : UnitsIn(module)) {
    unit->Hold();
    units_.push_back(std::move(unit));
  }
}

Gathered::~Gathered() {
  for (const auto& hook : units_) static_cast<Unit&>(*hook).Release();
}

GatherCounts CountGathers(const torch::nn::Module& module) {
  GatherCounts total;
  for (const auto& unit : UnitsIn(module)) {
    total.gathers += unit->counts().gathers;
    total.prefetched += unit->counts().prefetched;
    total.reduce_scatters += unit->counts().reduce_scatters;
    total.all_gathers += unit->counts().all_gathers;
  }
  return total;
}

}  // namespace meshrun::worker::parallel
