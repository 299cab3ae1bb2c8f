#pragma once

// PyTorch's parallelize_module with ColwiseParallel and RowwiseParallel, on
// the torch::nn::Linear modules of a user's own libtorch module:
//
//   ParallelizePlan plan = {{"blocks.*.fc1", ColwiseParallel()},
//                           {"blocks.*.fc2", RowwiseParallel()}};
//   CheckOk(ParallelizeModule(*model, "tp", tp_group, plan));
//   // and in the model's forward: h = parallel::Forward(fc1, x);
//   // then, for FSDP + TP: FullyShard(...) over the other mesh dimension
//
// As in PyTorch (Megatron-LM's layout):
//   - ColwiseParallel: the weight's rows (output features) and the bias are
//     split over the group; the input is replicated, the output is this
//     rank's slice of the last dim (use_local_output). In backward the
//     input's gradient from this layer is all-reduced (Megatron's f).
//   - RowwiseParallel: the weight's columns are split; the input is this
//     rank's slice of the last dim (a Colwise layer's output), the output
//     is all-reduced (g) and replicated; the bias is replicated and added
//     once.
// After the call the module's parameters are this rank's shards (the
// optimizer steps them); FullTensor of ShardedParams (module_params.h)
// gives the global values. A module whose code splits attention heads must
// compute with the local number (view(B, T, -1, head_dim) does).
//
// The model calls a parallelized Linear through Forward (module_hooks.h),
// which runs its hooks: f on the input of a Colwise layer (its backward
// all-reduces the input's gradient), g on the output of a Rowwise one.
//
//   x = parallel::Forward(fc1, x);   // instead of fc1->forward(x)
//
// A forward run again inside backward (activation checkpointing's
// recomputation) goes through Forward as well and gets both again. A
// parallelized Linear called without Forward computes with its shards
// alone: the wrong result.
//
// loss_parallel: a ColwiseParallel LM head's output is this rank's slice of
// the vocabulary; LossParallel takes the cross-entropy of those slices
// without gathering them (Megatron's vocab-parallel cross-entropy, vocab.h),
// as PyTorch's F.cross_entropy does on Shard(-1) logits under loss_parallel().
//
// Plan keys are module paths relative to `module`; "*" matches one name
// component. Errors (nothing changed then): a key matching no module, a
// module that is not a torch::nn::Linear, a split dimension the group's
// size does not divide, a module already parallelized.
//
// Collective: every rank of `group` runs the same forwards and backwards on
// the same (replicated) inputs. Setup is not collective and expects the same
// parameters on every rank.

#include <torch/nn/module.h>

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "worker_lib/parallel/param.h"

namespace meshrun::worker::parallel {

struct ParallelStyle {
  enum class Kind { kColwise, kRowwise };
  Kind kind;
};
inline ParallelStyle ColwiseParallel() { return {ParallelStyle::Kind::kColwise}; }
inline ParallelStyle RowwiseParallel() { return {ParallelStyle::Kind::kRowwise}; }

using ParallelizePlan = std::vector<std::pair<std::string, ParallelStyle>>;

absl::Status ParallelizeModule(torch::nn::Module& module, const std::string& mesh_dim,
                               ProcessGroupPtr group, const ParallelizePlan& plan);

// The mean cross-entropy over every position of `local_logits` ([..., vocab /
// group size], this rank's contiguous slice of the vocabulary in rank order)
// against `targets` ([...], int64 global ids). Collective over `group` (same
// targets on every rank); its value and gradient equal the gathered logits'.
at::Tensor LossParallel(const at::Tensor& local_logits, const at::Tensor& targets,
                        const ProcessGroupPtr& group);

}  // namespace meshrun::worker::parallel
