#pragma once

// reduce_scatter as torch.distributed offers it, returning a Status.
// Synchronous: each returns when this rank's part is done.
//
// libtorch 2's Gloo backend has reduce_scatter natively (1.13's had none, and
// an all-to-all stood in for it), but no AVG: on Gloo, AVG runs as SUM
// followed by a local division, as FSDP2 does it there.
//
// Collective: every member of `group` calls it, in the same order as the
// group's other collectives.

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <vector>

#include "absl/status/status.h"

namespace meshrun::worker {

// torch.distributed.reduce_scatter: output = op over ranks r of inputs_r[me].
// REQUIRES: inputs.size() == group.getSize(); every input has output's shape
// and dtype. Ops: SUM, AVG, PRODUCT, MIN, MAX.
absl::Status ReduceScatter(c10d::ProcessGroup& group, at::Tensor& output,
                           const std::vector<at::Tensor>& inputs,
                           c10d::ReduceOp op = c10d::ReduceOp::SUM);

// torch.distributed.reduce_scatter_tensor: `input` holds group.getSize()
// equal chunks along dim 0 (or, flattened, getSize() * output.numel()
// elements); chunk r, reduced over ranks, lands in rank r's `output`.
absl::Status ReduceScatterTensor(c10d::ProcessGroup& group, at::Tensor& output,
                                 const at::Tensor& input,
                                 c10d::ReduceOp op = c10d::ReduceOp::SUM);

// c10d's flat reduce-scatter (input = the group's outputs end to end), by its
// name in this libtorch: reduce_scatter_single, _reduce_scatter_base before
// it was renamed (libtorch 2.11, the GPU machine's, has only that one).
template <typename Group>
c10::intrusive_ptr<c10d::Work> ReduceScatterSingle(
    Group& group, at::Tensor& output, at::Tensor& input,
    const c10d::ReduceScatterOptions& options) {
  if constexpr (requires { group.reduce_scatter_single(output, input, options); }) {
    return group.reduce_scatter_single(output, input, options);
  } else {
    return group._reduce_scatter_base(output, input, options);
  }
}

// c10d's flat all-gather (output = the group's inputs end to end):
// all_gather_single, or _allgather_base before it was renamed (libtorch 2.11).
template <typename Group>
c10::intrusive_ptr<c10d::Work> AllGatherSingle(Group& group, at::Tensor& output,
                                               at::Tensor& input) {
  if constexpr (requires { group.all_gather_single(output, input); }) {
    return group.all_gather_single(output, input);
  } else {
    return group._allgather_base(output, input);
  }
}

}  // namespace meshrun::worker
