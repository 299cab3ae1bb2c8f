// RecordFunction::inputs() asserts, in builds without NDEBUG, a flag that
// libtorch's release build never sets; libtorch itself is built with NDEBUG.
// This file is compiled without the precompiled headers
// (worker_lib/CMakeLists.txt) so that the definition below comes first.
#ifndef NDEBUG
#define NDEBUG
#endif

#include "worker_lib/parallel/first_touch.h"

#include <ATen/record_function.h>

#include <atomic>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <unordered_map>
#include <vector>

namespace meshrun::worker::parallel {
namespace {

struct Registry {
  std::shared_mutex mu;
  std::unordered_map<const c10::StorageImpl*, TouchTarget*> targets;
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
    for (TouchTarget* target : found) {
      if (target == it->second) return;
    }
    found.push_back(it->second);
  };
  if (value.isTensor()) {
    look_up(value.toTensor());
  } else if (value.isTensorList()) {
    for (const at::Tensor& tensor : value.toTensorList()) look_up(tensor);
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
  for (TouchTarget* target : found) target->OnTouch();
  return nullptr;
}

}  // namespace

void WatchStorage(const at::Tensor& tensor, TouchTarget* target) {
  Registry& reg = registry();
  const c10::StorageImpl* storage = StorageOf(tensor);
  TORCH_CHECK(storage != nullptr, "WatchStorage: a tensor without storage");
  std::unique_lock lock(reg.mu);
  reg.targets[storage] = target;
  reg.size.store(reg.targets.size(), std::memory_order_release);
  if (!reg.observer) {
    reg.observer = at::addGlobalCallback(at::RecordFunctionCallback(&OnOperatorStart)
                                             .needsInputs(true)
                                             .scopes({at::RecordScope::FUNCTION}));
  }
}

void UnwatchStorage(const at::Tensor& tensor) {
  Registry& reg = registry();
  const c10::StorageImpl* storage = StorageOf(tensor);
  if (storage == nullptr) return;
  std::unique_lock lock(reg.mu);
  reg.targets.erase(storage);
  reg.size.store(reg.targets.size(), std::memory_order_release);
  if (reg.targets.empty() && reg.observer) {
    at::removeCallback(*reg.observer);
    reg.observer.reset();
  }
}

ScopedTouchesIgnored::ScopedTouchesIgnored() : was_ignoring_(ignoring) {
  ignoring = true;
}

ScopedTouchesIgnored::~ScopedTouchesIgnored() { ignoring = was_ignoring_; }

}  // namespace meshrun::worker::parallel
