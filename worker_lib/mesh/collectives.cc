#include "worker_lib/mesh/collectives.h"

#include <ATen/ATen.h>

#include <exception>
#include <string>

#include "absl/strings/str_cat.h"

namespace meshrun::worker {

namespace {

std::string FirstLine(const std::exception& e) {
  if (auto* c10_error = dynamic_cast<const c10::Error*>(&e))
    return c10_error->msg().substr(0, c10_error->msg().find('\n'));
  std::string what = e.what();
  return what.substr(0, what.find('\n'));
}

// The op to send over the wire: Gloo has no AVG, so it sums and `output` is
// divided afterwards (FinishAverage).
c10d::ReduceScatterOptions WireOptions(const c10d::ProcessGroup& group,
                                       c10d::ReduceOp op) {
  c10d::ReduceScatterOptions options;
  options.reduceOp = op;
  if (op == c10d::ReduceOp::AVG && group.getBackendName() == "gloo")
    options.reduceOp = c10d::ReduceOp::SUM;
  return options;
}

void FinishAverage(const c10d::ProcessGroup& group, at::Tensor& output,
                   c10d::ReduceOp op) {
  if (op != c10d::ReduceOp::AVG || group.getBackendName() != "gloo") return;
  if (at::isIntegralType(output.scalar_type(), /*includeBool=*/true)) {
    output.div_(group.getSize(), "floor");
  } else {
    output.div_(group.getSize());
  }
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
    std::vector<at::Tensor> outputs{output};
    std::vector<std::vector<at::Tensor>> input_lists{inputs};
    group.reduce_scatter(outputs, input_lists, WireOptions(group, op))->wait();
    FinishAverage(group, output, op);
    return absl::OkStatus();
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
    // The flat reduce-scatter wants input = n outputs laid end to end.
    at::Tensor flat_input = input.contiguous().reshape({n * output.numel()});
    at::Tensor flat_output = output.is_contiguous()
                                 ? output.view({-1})
                                 : at::empty({output.numel()}, output.options());
    ReduceScatterSingle(group, flat_output, flat_input, WireOptions(group, op))->wait();
    if (!output.is_contiguous()) output.copy_(flat_output.view(output.sizes()));
    FinishAverage(group, output, op);
    return absl::OkStatus();
  } catch (const std::exception& e) {
    return absl::InternalError(
        absl::StrCat("reduce_scatter_tensor failed: ", FirstLine(e)));
  }
}

}  // namespace meshrun::worker
