#pragma once

// Collectives c10d's Gloo backend lacks in libtorch 1.13, built from ones it
// has. Synchronous: each returns when this rank's part is done.
//
// ReduceScatter: ProcessGroupGloo 1.13 throws "does not support
// reduce_scatter". On Gloo it runs as one all-to-all (chunk j of every rank
// goes to rank j) followed by a local reduction: each rank sends and receives
// (n-1)/n of the input, the same volume as a ring reduce-scatter and half an
// all-reduce's, at the cost of n chunks of scratch memory. Other backends use
// their native reduce_scatter.
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

}  // namespace meshrun::worker
