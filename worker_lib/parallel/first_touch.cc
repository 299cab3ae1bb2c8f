#include "worker_lib/parallel/first_touch.h"

#include <ATen/SequenceNumber.h>
#include <ATen/record_function.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <unordered_map>
#include <vector>

// RecordFunction's layout and its inline inputs() (which, without NDEBUG,
// asserts a flag that libtorch's release build never sets) are libtorch's
// only with NDEBUG, which meshrun_torch defines in every build type
// (cmake/MeshrunTorchTarget.cmake). Defining it here instead would give this
// file another RecordFunction than the rest of the program.
#ifndef NDEBUG
#error \
    "libtorch's headers need NDEBUG, as libtorch was built: compile through meshrun_torch"
#endif

namespace meshrun::worker::parallel {
namespace {

struct Registry {
  std::shared_mutex mu;
  std::unordered_map<const c10::StorageImpl*, std::vector<TouchTarget*>> targets;
  // targets.size(), read without the lock on every operator.
  std::atomic<size_t> size{0};
  // The observer, registered while anything is watched: a global callback
  // that needs inputs makes the dispatcher box every operator's arguments.
  std::optional<at::CallbackHandle> observer;
};

Registry& registry() {
  static auto* instance = new Registry();
  return *instance;
}

thread_local bool ignoring = false;
// An operator on this thread whose end a target asked for is running.
thread_local bool in_operator_with_end = false;

struct EndContext : at::ObserverContext {
  std::vector<TouchTarget*> targets;
  std::vector<c10::IValue> inputs;
  uint64_t first_sequence_nr = 0;
};

const c10::StorageImpl* StorageOf(const at::Tensor& tensor) {
  if (!tensor.defined() || !tensor.has_storage()) return nullptr;
  return tensor.storage().unsafeGetStorageImpl();
}

void Collect(const c10::IValue& value, Registry& reg, std::vector<TouchTarget*>& found) {
  auto look_up = [&](const at::Tensor& tensor) {
    const c10::StorageImpl* storage = StorageOf(tensor);
    if (storage == nullptr) return;
    auto it = reg.targets.find(storage);
    if (it == reg.targets.end()) return;
    for (TouchTarget* target : it->second) {
      if (std::find(found.begin(), found.end(), target) == found.end())
        found.push_back(target);
    }
  };
  if (value.isTensor()) {
    look_up(value.toTensor());
  } else if (value.isTensorList()) {
    for (const at::Tensor tensor : value.toTensorList()) look_up(tensor);
  } else if (value.isList()) {
    for (const c10::IValue& element : value.toListRef()) {
      if (element.isTensor()) look_up(element.toTensor());
    }
  }
}

std::unique_ptr<at::ObserverContext> OnOperatorStart(const at::RecordFunction& fn) {
  Registry& reg = registry();
  if (ignoring || reg.size.load(std::memory_order_acquire) == 0) return nullptr;
  std::vector<TouchTarget*> found;
  {
    std::shared_lock lock(reg.mu);
    for (const c10::IValue& input : fn.inputs()) Collect(input, reg, found);
  }
  if (found.empty()) return nullptr;
  ScopedTouchesIgnored ignore;
  std::vector<TouchTarget*> wanting_end;
  for (TouchTarget* target : found) {
    if (target->OnTouch(fn.name())) wanting_end.push_back(target);
  }
  if (wanting_end.empty() || in_operator_with_end) return nullptr;
  in_operator_with_end = true;
  auto context = std::make_unique<EndContext>();
  context->targets = std::move(wanting_end);
  context->inputs.assign(fn.inputs().begin(), fn.inputs().end());
  context->first_sequence_nr = at::sequence_number::peek();
  return context;
}

void OnOperatorEnd(const at::RecordFunction& fn, at::ObserverContext* context) {
  if (context == nullptr) return;
  auto* end = static_cast<EndContext*>(context);
  in_operator_with_end = false;
  ScopedTouchesIgnored ignore;
  const OperatorCall call{std::move(end->inputs), fn.outputs(), end->first_sequence_nr};
  for (TouchTarget* target : end->targets) target->OnOperatorEnd(call);
}

}  // namespace

void WatchStorage(const at::Tensor& tensor, TouchTarget* target) {
  Registry& reg = registry();
  const c10::StorageImpl* storage = StorageOf(tensor);
  TORCH_CHECK(storage != nullptr, "WatchStorage: a tensor without storage");
  std::unique_lock lock(reg.mu);
  std::vector<TouchTarget*>& targets = reg.targets[storage];
  if (std::find(targets.begin(), targets.end(), target) == targets.end())
    targets.push_back(target);
  reg.size.store(reg.targets.size(), std::memory_order_release);
  if (!reg.observer) {
    reg.observer =
        at::addGlobalCallback(at::RecordFunctionCallback(&OnOperatorStart, &OnOperatorEnd)
                                  .needsInputs(true)
                                  .needsOutputs(true)
                                  .scopes({at::RecordScope::FUNCTION}));
  }
}

void UnwatchStorage(const at::Tensor& tensor, TouchTarget* target) {
  Registry& reg = registry();
  const c10::StorageImpl* storage = StorageOf(tensor);
  if (storage == nullptr) return;
  std::unique_lock lock(reg.mu);
  auto it = reg.targets.find(storage);
  if (it == reg.targets.end()) return;
  std::erase(it->second, target);
  if (it->second.empty()) reg.targets.erase(it);
  reg.size.store(reg.targets.size(), std::memory_order_release);
  if (reg.targets.empty() && reg.observer) {
    at::removeCallback(*reg.observer);
    reg.observer.reset();
  }
}

void MoveWatches(const c10::Storage& from, const at::Tensor& to) {
  Registry& reg = registry();
  const c10::StorageImpl* storage = StorageOf(to);
  if (storage == nullptr || from.unsafeGetStorageImpl() == storage) return;
  std::unique_lock lock(reg.mu);
  auto it = reg.targets.find(from.unsafeGetStorageImpl());
  if (it == reg.targets.end()) return;
  std::vector<TouchTarget*> moved = std::move(it->second);
  reg.targets.erase(it);
  std::vector<TouchTarget*>& targets = reg.targets[storage];
  targets.insert(targets.begin(), moved.begin(), moved.end());
  reg.size.store(reg.targets.size(), std::memory_order_release);
}

ScopedTouchesIgnored::ScopedTouchesIgnored() : was_ignoring_(ignoring) {
  ignoring = true;
}

ScopedTouchesIgnored::~ScopedTouchesIgnored() { ignoring = was_ignoring_; }

}  // namespace meshrun::worker::parallel
