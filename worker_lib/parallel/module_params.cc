#include "worker_lib/parallel/module_params.h"

#include <mutex>
#include <unordered_map>
#include <unordered_set>
#include <utility>

namespace meshrun::worker::parallel {
namespace {

struct Records {
  std::mutex mu;
  std::unordered_map<const c10::TensorImpl*, std::shared_ptr<Param>> params;
};

Records& records() {
  static auto* instance = new Records();
  return *instance;
}

}  // namespace

void RecordParam(const at::Tensor& registered, std::shared_ptr<Param> param) {
  std::lock_guard lock(records().mu);
  records().params[registered.unsafeGetTensorImpl()] = std::move(param);
}

std::shared_ptr<Param> ParamOf(const at::Tensor& registered) {
  std::lock_guard lock(records().mu);
  auto it = records().params.find(registered.unsafeGetTensorImpl());
  return it == records().params.end() ? nullptr : it->second;
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
