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
// OnTouch runs with touches ignored on its thread (ScopedTouchesIgnored),
// so the ops it runs itself (copies into the watched storage) do not call it
// again. Ops called without the dispatcher (a kernel's direct calls into
// another kernel) are not seen, but the operator that called them was, with
// the same tensors.
//
// Thread-safe. A target must outlive its watch.

#include <ATen/ATen.h>

namespace meshrun::worker::parallel {

class TouchTarget {
 public:
  virtual ~TouchTarget() = default;
  // An operator is about to run with a tensor over the watched storage.
  // Exceptions propagate to the operator's caller.
  virtual void OnTouch() = 0;
};

// Starts watching `tensor`'s storage (replacing any earlier target of it).
// The storage must stay the same object (resizing it in place is fine).
void WatchStorage(const at::Tensor& tensor, TouchTarget* target);
void UnwatchStorage(const at::Tensor& tensor);

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
