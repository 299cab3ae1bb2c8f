#pragma once

// First-touch hooks on tensor storage: code that runs just before an ATen
// operator reads or writes a watched storage, on any thread, in forward and
// in backward.
//
// libtorch's C++ modules have no forward hooks (Python's
// register_forward_pre_hook has no C++ counterpart), and their forward is
// the user's own non-virtual function, so FSDP on a user's
// torch::nn::Module (fully_shard.h) cannot wrap it. What every forward and
// backward does go through is the dispatcher, and the dispatcher reports
// each operator call with its arguments to RecordFunction observers (the
// profiler's mechanism). A watched storage is looked up by its StorageImpl,
// which views share, so a transposed weight that autograd saved for
// backward counts as a touch of the weight.
//
//   class Gather : public TouchTarget { void OnTouch() override { ...fill... } };
//   WatchStorage(weight, &gather);   // the next op on weight (or a view) calls OnTouch
//   first UnwatchStorage(weight);
//
// OnTouch and OnOperatorEnd run with touches ignored on their thread
// (ScopedTouchesIgnored), so the ops they run themselves (copies into the
// watched storage, collectives) do not call them again. Ops called without the dispatcher
// (a kernel's direct calls into another kernel) are not seen, but the operator that
// called them was, with the same tensors.
//
// Thread-safe. A target must outlive its watch.

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <string_view>
#include <vector>

namespace meshrun::worker::parallel {

// An operator call that a target asked to see the end of: its arguments,
// its results (a target may change their values in place), and the first
// autograd sequence number it could have used (nodes it created have this
// or a later one, on its thread).
struct OperatorCall {
  std::vector<c10::IValue> inputs;
  const std::vector<c10::IValue>& outputs;
  uint64_t first_sequence_nr;
};

class TouchTarget {
 public:
  virtual ~TouchTarget() = default;
  // An operator (`op_name`, "aten::mm") is about to run with a tensor over
  // the watched storage.
  // Returns whether the target wants OnOperatorEnd for this operator, which
  // it gets only if no outer operator on the thread was asked for already
  // (aten::matmul's rather than the aten::mm inside it). Exceptions propagate to the
  // operator's caller.
  virtual bool OnTouch(std::string_view op_name) = 0;
  virtual void OnOperatorEnd(const OperatorCall& /*call*/) {}
};

// Starts watching `tensor`'s storage for `target`, after the targets that
// watch it already (an FSDP unit's gather before tensor parallelism's
// hooks). The storage must stay the same object (resizing it in place is
// fine).
void WatchStorage(const at::Tensor& tensor, TouchTarget* target);
// Stops `target` watching `tensor`'s storage.
void UnwatchStorage(const at::Tensor& tensor, TouchTarget* target);
// The targets watching `from` watch `to`'s storage instead, before its own
// (a tensor whose storage was replaced, set_data, keeps its hooks).
void MoveWatches(const c10::Storage& from, const at::Tensor& to);

// While alive, operators on this thread touch nothing.
class ScopedTouchesIgnored {
 public:
  ScopedTouchesIgnored();
  ~ScopedTouchesIgnored();
  ScopedTouchesIgnored(const ScopedTouchesIgnored&) = delete;
  ScopedTouchesIgnored& operator=(const ScopedTouchesIgnored&) = delete;

 private:
  bool was_ignoring_;
};

}  // namespace meshrun::worker::parallel
