#include "worker_lib/parallel/module_params.h"

#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "worker_lib/parallel/module_hooks.h"

namespace meshrun::worker::parallel {
namespace {

// Keyed by the registered TensorImpl, which the entry keeps a weak
// reference to: while it does, no other TensorImpl can be made at that
// address (an intrusive weak reference keeps the object's memory), so a
// model destroyed and another built in its place never see its records.
// The Param is the hooks' (owned by the module, module_hooks.h): weak here
// too, so that nothing outlives the model.
struct Record {
  c10::weak_intrusive_ptr<c10::TensorImpl> tensor;
  std::weak_ptr<Param> param;
};
struct Records {
  std::mutex mu;
  std::unordered_map<const c10::TensorImpl*, Record> params;
  size_t inserts_since_prune = 0;
};

Records& records() {
  static auto* instance = new Records();
  return *instance;
}

}  // namespace

void RecordParam(const at::Tensor& registered, std::shared_ptr<Param> param) {
  std::lock_guard lock(records().mu);
  auto& params = records().params;
  // Drop the records of tensors that are gone, now and then (amortized).
  if (++records().inserts_since_prune > params.size()) {
    records().inserts_since_prune = 0;
    for (auto it = params.begin(); it != params.end();) {
      const bool gone = it->second.tensor.expired() || it->second.param.expired();
      it = gone ? params.erase(it) : std::next(it);
    }
  }
  params.insert_or_assign(
      registered.unsafeGetTensorImpl(),
      Record{c10::weak_intrusive_ptr<c10::TensorImpl>(registered.getIntrusivePtr()),
             std::move(param)});
}

std::shared_ptr<Param> ParamOf(const at::Tensor& registered) {
  std::lock_guard lock(records().mu);
  auto it = records().params.find(registered.unsafeGetTensorImpl());
  if (it == records().params.end() || it->second.tensor.expired()) return nullptr;
  return it->second.param.lock();
}

std::vector<NamedParam> ModuleParams(const torch::nn::Module& module) {
  std::vector<NamedParam> found;
  std::unordered_set<const c10::TensorImpl*> listed;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    if (!listed.insert(item.value().unsafeGetTensorImpl()).second) continue;
    std::shared_ptr<Param> param = ParamOf(item.value());
    found.push_back(NamedParam{
        item.key(), param != nullptr ? param : Param::OfLeaf(item.key(), item.value())});
  }
  return found;
}

void ForEachSubmodule(
    torch::nn::Module& module,
    const std::function<void(torch::nn::Module&, const std::string& path)>& visit) {
  std::function<void(torch::nn::Module&, const std::string&)> walk =
      [&](torch::nn::Module& current, const std::string& path) {
        visit(current, path);
        for (const auto& child : current.named_children()) {
          if (child.key() == ModuleHooks::kChildName) continue;
          walk(*child.value(), path.empty() ? child.key() : path + "." + child.key());
        }
      };
  walk(module, "");
}

std::vector<NamedParam> ShardedParams(const torch::nn::Module& module) {
  std::vector<NamedParam> found;
  for (NamedParam& named : ModuleParams(module)) {
    if (ParamOf(named.param->data()) != nullptr) found.push_back(std::move(named));
  }
  return found;
}

}  // namespace meshrun::worker::parallel
