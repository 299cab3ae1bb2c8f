#include "worker_lib/collectives.h"

#include <ATen/ATen.h>

#include <exception>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace meshrun::worker {

namespace {

std::string FirstLine(const std::exception& e) {
  if (auto* c10_error = dynamic_cast<const c10::Error*>(&e))
    return c10_error->msg().substr(0, c10_error->msg().find('\n'));
  std::string what = e.what();
  return what.substr(0, what.find('\n'));
}

// Reduces `stacked` ([n, ...]) over dim 0.
absl::StatusOr<at::Tensor> Reduce(const at::Tensor& stacked, c10d::ReduceOp op) {
  switch (static_cast<c10d::ReduceOp::RedOpType>(op)) {
    case c10d::ReduceOp::SUM:
      return stacked.sum(0, /*keepdim=*/false, stacked.scalar_type());
    case c10d::ReduceOp::AVG:
      if (at::isIntegralType(stacked.scalar_type(), /*includeBool=*/true))
        return stacked.sum(0, false, stacked.scalar_type())
            .div_(stacked.size(0), "floor");
      return stacked.sum(0, false, stacked.scalar_type()).div_(stacked.size(0));
    case c10d::ReduceOp::PRODUCT:
      return stacked.prod(0, false, stacked.scalar_type());
    case c10d::ReduceOp::MIN:
      return stacked.amin(0);
    case c10d::ReduceOp::MAX:
      return stacked.amax(0);
    default:
      return absl::InvalidArgumentError(
          "reduce_scatter: only SUM, AVG, PRODUCT, MIN and MAX are supported on gloo");
  }
}

// The Gloo path: all-to-all of n equal chunks, then a local reduction.
// `flat_input` is contiguous with n * output.numel() elements.
absl::Status AllToAllReduce(c10d::ProcessGroup& group, at::Tensor& output,
                            at::Tensor flat_input, c10d::ReduceOp op) {
  const int64_t n = group.getSize();
  at::Tensor received = at::empty_like(flat_input);
  std::vector<int64_t> equal_split;  // empty: n equal chunks
  auto work = group.alltoall_base(received, flat_input, equal_split, equal_split);
  work->wait();
  auto reduced = Reduce(received.view({n, output.numel()}), op);
  if (!reduced.ok()) return reduced.status();
  output.copy_(reduced->view(output.sizes()));
  return absl::OkStatus();
}

}  // namespace

absl::Status ReduceScatter(c10d::ProcessGroup& group, at::Tensor& output,
                           const std::vector<at::Tensor>& inputs, c10d::ReduceOp op) {
  const int64_t n = group.getSize();
  if (static_cast<int64_t>(inputs.size()) != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "reduce_scatter: ", inputs.size(), " inputs for a group of ", n, " ranks"));
  }
  for (const at::Tensor& input : inputs) {
    if (!input.sizes().equals(output.sizes()) ||
        input.scalar_type() != output.scalar_type())
      return absl::InvalidArgumentError(
          "reduce_scatter: every input must have the output's shape and dtype");
  }
  try {
    if (group.getBackendName() != "gloo") {
      std::vector<at::Tensor> outputs{output};
      std::vector<std::vector<at::Tensor>> input_lists{inputs};
      c10d::ReduceScatterOptions options;
      options.reduceOp = op;
      group.reduce_scatter(outputs, input_lists, options)->wait();
      return absl::OkStatus();
    }
    std::vector<at::Tensor> flat;
    flat.reserve(inputs.size());
    for (const at::Tensor& input : inputs) flat.push_back(input.reshape({-1}));
    return AllToAllReduce(group, output, at::cat(flat), op);
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("reduce_scatter failed: ", FirstLine(e)));
  }
}

absl::Status ReduceScatterTensor(c10d::ProcessGroup& group, at::Tensor& output,
                                 const at::Tensor& input, c10d::ReduceOp op) {
  const int64_t n = group.getSize();
  if (input.numel() != n * output.numel() ||
      input.scalar_type() != output.scalar_type()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "reduce_scatter_tensor: input has ", input.numel(), " elements, expected ", n,
        " x ", output.numel(), " of the output's dtype"));
  }
  try {
    if (group.getBackendName() != "gloo") {
      at::Tensor in = input.contiguous();
      c10d::ReduceScatterOptions options;
      options.reduceOp = op;
      group._reduce_scatter_base(output, in, options)->wait();
      return absl::OkStatus();
    }
    return AllToAllReduce(group, output, input.contiguous().reshape({-1}), op);
  } catch (const std::exception& e) {
    return absl::InternalError(
        absl::StrCat("reduce_scatter_tensor failed: ", FirstLine(e)));
  }
}

}  // namespace meshrun::worker
