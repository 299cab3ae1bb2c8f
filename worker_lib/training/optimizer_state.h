#pragma once

// An optimizer's state of one parameter as named tensors, for what copies
// it elsewhere: module checkpoints (module_checkpoint.h) and the heals of
// fault-tolerant replicas (fault_tolerant.h). libtorch's optimizers keep it
// in classes of their own with no common way to list their tensors; these
// are the built-in ones: Adam and AdamW (step, exp_avg, exp_avg_sq,
// max_exp_avg_sq with amsgrad), SGD (momentum_buffer), RMSprop (step,
// square_avg, momentum_buffer with momentum, grad_avg when centered) and
// Adagrad (step, sum).

#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace meshrun::worker::parallel {

struct StateField {
  std::string name;
  at::Tensor tensor;  // shaped as the parameter
};

struct ParamState {
  std::vector<StateField> fields;
  // The step count, for optimizers that keep one (empty otherwise).
  std::function<int64_t()> step;
  std::function<void(int64_t)> set_step;
};

// The state `optimizer` keeps for `param` (by TensorImpl). With `create`,
// state the optimizer has not made yet (before its first step) is made, as
// zeros and step 0, so that it can be filled; without, a missing state is
// empty. Empty for a parameter the optimizer does not hold. INVALID_ARGUMENT
// for an optimizer of another kind.
absl::StatusOr<ParamState> OptimizerStateOf(torch::optim::Optimizer& optimizer,
                                            const at::Tensor& param, bool create);

}  // namespace meshrun::worker::parallel
