#include "worker_lib/training/module_checkpoint.h"

#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "worker_lib/parallel/module_params.h"
#include "worker_lib/training/checkpoint.h"
#include "worker_lib/training/optimizer_state.h"

namespace meshrun::worker::parallel {
namespace {

// The entries of `module` (and `optimizer`), as Params over the tensors to
// write or fill; `steps` collects each step entry with its setter.
struct Entries {
  std::vector<std::shared_ptr<Param>> params;
  std::vector<std::pair<std::shared_ptr<Param>, std::function<void(int64_t)>>> steps;
};

absl::StatusOr<Entries> EntriesOf(const torch::nn::Module& module,
                                  torch::optim::Optimizer* optimizer, bool create_state,
                                  const TensorFilter& only) {
  Entries entries;
  for (const NamedParam& named : ModuleParams(module)) {
    const std::shared_ptr<Param>& base = named.param;
    const at::Tensor& tensor = base->data();
    if (only && !only(tensor)) continue;
    entries.params.push_back(base->Alias(named.name, tensor));
    if (optimizer == nullptr) continue;
    absl::StatusOr<ParamState> state = OptimizerStateOf(*optimizer, tensor, create_state);
    if (!state.ok()) return state.status();
    for (const StateField& field : state->fields) {
      entries.params.push_back(base->Alias(named.name + "." + field.name, field.tensor));
    }
    if (state->step) {
      auto step =
          Param::OfLeaf(named.name + ".step", at::full({1}, state->step(), at::kLong));
      entries.params.push_back(step);
      entries.steps.emplace_back(step, state->set_step);
    }
  }
  for (const auto& item : module.named_buffers()) {
    if (only && !only(item.value())) continue;
    entries.params.push_back(Param::OfLeaf(item.key(), item.value()));
  }
  return entries;
}

}  // namespace

absl::Status SaveModule(const std::string& dir, const std::string& tag,
                        const torch::nn::Module& module,
                        torch::optim::Optimizer* optimizer, const TensorFilter& only) {
  absl::StatusOr<Entries> entries =
      EntriesOf(module, optimizer, /*create_state=*/false, only);
  if (!entries.ok()) return entries.status();
  return SaveShards(dir, tag, entries->params);
}

absl::Status LoadModule(const std::string& dir, torch::nn::Module& module,
                        torch::optim::Optimizer* optimizer, const TensorFilter& only) {
  absl::StatusOr<Entries> entries =
      EntriesOf(module, optimizer, /*create_state=*/true, only);
  if (!entries.ok()) return entries.status();
  if (absl::Status status = LoadShards(dir, entries->params); !status.ok()) return status;
  for (const auto& [step, set_step] : entries->steps)
    set_step(step->data().item<int64_t>());
  return absl::OkStatus();
}

}  // namespace meshrun::worker::parallel
