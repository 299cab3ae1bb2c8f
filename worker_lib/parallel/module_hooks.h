#pragma once

// Forward hooks for libtorch modules, which have none of their own
// (Python's register_forward_pre_hook / register_forward_hook have no C++
// counterpart, and a module's forward is the user's own non-virtual
// function). A module's hooks run when its forward is called through
// Forward():
//
//   x = parallel::Forward(block, x);   // instead of block->forward(x)
//
// FullyShard (fully_shard.h), ParallelizeModule (parallelize.h) and
// DistributedDataParallel (ddp.h) add hooks to the modules they change;
// Forward on a module without hooks is its plain forward (one hash lookup).
// The hooks are owned by the module (a child module of its own,
// "_meshrun_hooks", that is not serialized, holds no tensors and is skipped
// by ForEachSubmodule): they die with it, and nothing is kept per process.
//
// Forward takes the module as an Impl reference or pointer, a ModuleHolder
// (torch::nn::Linear) or a shared_ptr; the arguments are the forward's.
// Tensor arguments (at::Tensor) go through the hooks' PreForward, which may
// replace them; tensor results (an at::Tensor, a std::vector<at::Tensor>, or
// the at::Tensor members of a std::tuple) through PostForward. A forward that
// throws runs the hooks' ForwardFailed (in reverse order) before the
// exception goes on.
//
// Thread-safe to call on different modules from different threads; the
// hooks themselves say what they allow. A module's hooks are not added or
// removed during its forward (FullyShard and the others are setup).

#include <torch/nn/module.h>
#include <torch/nn/modules/container/any.h>
#include <torch/nn/pimpl.h>

#include <array>
#include <cstddef>
#include <memory>
#include <ostream>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace meshrun::worker::parallel {

class ForwardHook {
 public:
  virtual ~ForwardHook() = default;
  // Before the forward, with its tensor arguments (in order).
  virtual void PreForward(std::vector<at::Tensor>& inputs) = 0;
  // After it returned, with its tensor results (in order).
  virtual void PostForward(std::vector<at::Tensor>& outputs) = 0;
  // The forward (or a later hook's PreForward) threw after this hook's
  // PreForward ran.
  virtual void ForwardFailed() {}
};

// The hooks of one module, in the order their PreForward runs (PostForward
// runs in reverse).
class ModuleHooks : public torch::nn::Module {
 public:
  static constexpr const char* kChildName = "_meshrun_hooks";
  ModuleHooks() : torch::nn::Module("meshrun::ModuleHooks") {}
  bool is_serializable() const override { return false; }
  void pretty_print(std::ostream& stream) const override;

  const std::vector<std::shared_ptr<ForwardHook>>& hooks() const { return hooks_; }
  // `first`: before the hooks there already (FSDP's gather before tensor
  // parallelism's input hook, as fully_shard prepends its pre-forward hook).
  void Add(std::shared_ptr<ForwardHook> hook, bool first = false);
  void Remove(const ForwardHook* hook);

 private:
  std::vector<std::shared_ptr<ForwardHook>> hooks_;
};

// The hooks of `module`, or null if it has none.
ModuleHooks* FindHooks(const torch::nn::Module& module);
// The hooks of `module`, made (and registered as its child) if needed. Not
// thread-safe against a forward of the same module.
ModuleHooks& HooksOf(torch::nn::Module& module);

namespace internal {

// Runs the hooks around one forward: PreForward on construction, PostForward
// in Finish, ForwardFailed for those that ran if destroyed unfinished.
class ForwardScope {
 public:
  ForwardScope(const ModuleHooks& hooks, std::vector<at::Tensor>& inputs);
  ~ForwardScope();
  ForwardScope(const ForwardScope&) = delete;
  ForwardScope& operator=(const ForwardScope&) = delete;
  void Finish(std::vector<at::Tensor>& outputs);

 private:
  const std::vector<std::shared_ptr<ForwardHook>>& hooks_;
  size_t entered_ = 0;
  bool finished_ = false;
};

template <typename T>
constexpr bool kIsTensor = std::is_same_v<std::decay_t<T>, at::Tensor>;

// The index among the tensor arguments of argument `position`.
template <size_t N>
constexpr size_t TensorIndex(const std::array<bool, N>& is_tensor, size_t position) {
  size_t index = 0;
  for (size_t i = 0; i < position; ++i) index += is_tensor[i] ? 1 : 0;
  return index;
}

template <size_t Position, typename Arg, size_t N>
decltype(auto) Pick(Arg&& arg, std::vector<at::Tensor>& inputs,
                    const std::array<bool, N>& is_tensor) {
  if constexpr (kIsTensor<Arg>) {
    return static_cast<const at::Tensor&>(inputs[TensorIndex(is_tensor, Position)]);
  } else {
    return std::forward<Arg>(arg);
  }
}

// Results that are neither tensors nor tuples of them pass through untouched.
template <typename T, typename = void>
struct IsTupleLike : std::false_type {};
template <typename T>
struct IsTupleLike<T, std::void_t<decltype(std::tuple_size<T>::value)>> : std::true_type {
};

template <typename T>
void CollectOutputs(T& result, std::vector<at::Tensor>& tensors) {
  if constexpr (kIsTensor<T>) {
    tensors.push_back(result);
  } else if constexpr (std::is_same_v<T, std::vector<at::Tensor>>) {
    tensors.insert(tensors.end(), result.begin(), result.end());
  } else if constexpr (IsTupleLike<T>::value) {
    std::apply([&](auto&... items) { (CollectOutputs(items, tensors), ...); }, result);
  }
}

template <typename T>
void ReplaceOutputs(T& result, const std::vector<at::Tensor>& tensors, size_t& next) {
  if constexpr (kIsTensor<T>) {
    result = tensors[next++];
  } else if constexpr (std::is_same_v<T, std::vector<at::Tensor>>) {
    for (at::Tensor& item : result) item = tensors[next++];
  } else if constexpr (IsTupleLike<T>::value) {
    std::apply([&](auto&... items) { (ReplaceOutputs(items, tensors, next), ...); },
               result);
  }
}

template <typename Call, typename... Args, size_t... I>
decltype(auto) CallPicked(Call& call, std::vector<at::Tensor>& inputs,
                          std::index_sequence<I...> /*positions*/, Args&&... args) {
  constexpr std::array<bool, sizeof...(Args)> is_tensor{kIsTensor<Args>...};
  return call(Pick<I>(std::forward<Args>(args), inputs, is_tensor)...);
}

// `call(args...)` between the PreForward and PostForward of `hooks`.
template <typename Call, typename... Args>
auto RunHooked(const ModuleHooks* hooks, Call call, Args&&... args)
    -> decltype(call(std::forward<Args>(args)...)) {
  using Result = decltype(call(std::forward<Args>(args)...));
  if (hooks == nullptr || hooks->hooks().empty())
    return call(std::forward<Args>(args)...);
  std::vector<at::Tensor> inputs;
  (
      [&](auto& arg) {
        if constexpr (kIsTensor<decltype(arg)>) inputs.push_back(arg);
      }(args),
      ...);
  ForwardScope scope(*hooks, inputs);
  if constexpr (std::is_void_v<Result>) {
    CallPicked(call, inputs, std::index_sequence_for<Args...>{},
               std::forward<Args>(args)...);
    std::vector<at::Tensor> none;
    scope.Finish(none);
  } else {
    Result result = CallPicked(call, inputs, std::index_sequence_for<Args...>{},
                               std::forward<Args>(args)...);
    std::vector<at::Tensor> outputs;
    CollectOutputs(result, outputs);
    scope.Finish(outputs);
    size_t next = 0;
    ReplaceOutputs(result, outputs, next);
    return result;
  }
}

}  // namespace internal

// `module`'s forward with its hooks (see the file comment).
template <typename Impl, typename... Args,
          typename = std::enable_if_t<std::is_base_of_v<torch::nn::Module, Impl>>>
auto Forward(Impl& module, Args&&... args)
    -> decltype(module.forward(std::forward<Args>(args)...)) {
  return internal::RunHooked(
      FindHooks(module),
      [&module](auto&&... picked) -> decltype(auto) {
        return module.forward(std::forward<decltype(picked)>(picked)...);
      },
      std::forward<Args>(args)...);
}

// An AnyModule's forward (a pipeline stage's) with the hooks of the module
// it holds.
template <typename Result = at::Tensor, typename... Args>
Result ForwardAny(torch::nn::AnyModule& module, Args&&... args) {
  return internal::RunHooked(
      FindHooks(*module.ptr()),
      [&module](auto&&... picked) -> Result {
        return module.forward<Result>(std::forward<decltype(picked)>(picked)...);
      },
      std::forward<Args>(args)...);
}

template <typename Impl, typename... Args>
auto Forward(Impl* module, Args&&... args)
    -> decltype(Forward(*module, std::forward<Args>(args)...)) {
  return Forward(*module, std::forward<Args>(args)...);
}

template <typename Impl, typename... Args>
auto Forward(const std::shared_ptr<Impl>& module, Args&&... args)
    -> decltype(Forward(*module, std::forward<Args>(args)...)) {
  return Forward(*module, std::forward<Args>(args)...);
}

template <typename Impl, typename... Args>
auto Forward(const torch::nn::ModuleHolder<Impl>& module, Args&&... args)
    -> decltype(Forward(*module.ptr(), std::forward<Args>(args)...)) {
  return Forward(*module.ptr(), std::forward<Args>(args)...);
}

}  // namespace meshrun::worker::parallel
