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

}  // namespace meshrun::worker
