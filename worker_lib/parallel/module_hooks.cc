#include "worker_lib/parallel/module_hooks.h"

#include <algorithm>
#include <exception>

namespace meshrun::worker::parallel {
namespace {

using ChildDict = torch::OrderedDict<std::string, std::shared_ptr<torch::nn::Module>>;

// torch::nn::Module keeps its children in a private member, and
// named_children() copies the whole dictionary; Forward runs on every call of
// every hooked module, so it looks the child up in place. The member pointer
// comes from an explicit template instantiation, where C++ does not check
// access ([temp.spec]/6): the standard way to name a private member.
struct ChildrenTag {
  using Member = ChildDict torch::nn::Module::*;
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpragmas"
#pragma GCC diagnostic ignored "-Wnon-template-friend"
  friend Member MemberOf(ChildrenTag);
#pragma GCC diagnostic pop
};
template <ChildrenTag::Member Member>
struct ChildrenAccess {
  friend ChildrenTag::Member MemberOf(ChildrenTag) { return Member; }
};
template struct ChildrenAccess<&torch::nn::Module::children_>;

const ChildDict& ChildrenOf(const torch::nn::Module& module) {
  return module.*MemberOf(ChildrenTag{});
}

}  // namespace

void ModuleHooks::pretty_print(std::ostream& stream) const {
  stream << "meshrun::ModuleHooks(" << hooks_.size() << ")";
}

void ModuleHooks::Add(std::shared_ptr<ForwardHook> hook, bool first) {
  hooks_.insert(first ? hooks_.begin() : hooks_.end(), std::move(hook));
}

void ModuleHooks::Remove(const ForwardHook* hook) {
  hooks_.erase(std::remove_if(hooks_.begin(), hooks_.end(),
                              [&](const auto& item) { return item.get() == hook; }),
               hooks_.end());
}

ModuleHooks* FindHooks(const torch::nn::Module& module) {
  const std::shared_ptr<torch::nn::Module>* child =
      ChildrenOf(module).find(ModuleHooks::kChildName);
  return child == nullptr ? nullptr : static_cast<ModuleHooks*>(child->get());
}

ModuleHooks& HooksOf(torch::nn::Module& module) {
  if (ModuleHooks* hooks = FindHooks(module)) return *hooks;
  return *module.register_module(ModuleHooks::kChildName,
                                 std::make_shared<ModuleHooks>());
}

namespace internal {

ForwardScope::ForwardScope(const ModuleHooks& hooks, std::vector<at::Tensor>& inputs)
    : hooks_(hooks.hooks()) {
  for (const auto& hook : hooks_) {
    hook->PreForward(inputs);
    ++entered_;
  }
}

ForwardScope::~ForwardScope() {
  if (finished_) return;
  // Unwinding: every hook whose PreForward ran lets go of what it holds.
  for (size_t i = entered_; i-- > 0;) {
    try {
      hooks_[i]->ForwardFailed();
    } catch (const std::exception&) {
      // The forward's own exception is the one to report.
    }
  }
}

void ForwardScope::Finish(std::vector<at::Tensor>& outputs) {
  finished_ = true;
  for (size_t i = hooks_.size(); i-- > 0;) hooks_[i]->PostForward(outputs);
}

}  // namespace internal
}  // namespace meshrun::worker::parallel
