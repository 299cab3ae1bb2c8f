#pragma once

// Worker-side support for the parallel-training parity tests: every rank
// also trains the same model in a single process (it is small), so each
// worker checks its own sharded run against the reference and exits 1 with
// one "FAIL ..." line on a mismatch.

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace meshrun::worker::parallel::testing {

// Prints "FAIL rank <r>: <what>" on stderr and exits 1.
[[noreturn]] void Fail(const std::string& what);
void CheckOk(const absl::Status& status, const std::string& context);
template <typename T>
T ValueOrFail(absl::StatusOr<T> value, const std::string& context) {
  CheckOk(value.status(), context);
  return *std::move(value);
}

// ||got - want|| / ||want|| (0 when both are zero).
double RelativeError(const at::Tensor& got, const at::Tensor& want);
// Fails unless shapes match and RelativeError <= rtol.
void ExpectClose(const std::string& what, const at::Tensor& got, const at::Tensor& want,
                 double rtol = 1e-5);
void ExpectClose(const std::string& what, double got, double want, double rtol = 1e-5);

// MSE loss (mean over all elements), as nn.MSELoss.
at::Tensor MseLoss(const at::Tensor& output, const at::Tensor& target);

}  // namespace meshrun::worker::parallel::testing
