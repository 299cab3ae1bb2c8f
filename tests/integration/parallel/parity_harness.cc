#include "tests/integration/parallel/parity_harness.h"

#include <cmath>
#include <cstdlib>
#include <iostream>

namespace meshrun::worker::parallel::testing {

void Fail(const std::string& what) {
  const char* rank = std::getenv("RANK");
  // One write, so that ranks' lines do not interleave.
  std::cerr << "FAIL rank " + std::string(rank ? rank : "?") + ": " + what + "\n"
            << std::flush;
  std::exit(1);
}

void CheckOk(const absl::Status& status, const std::string& context) {
  if (!status.ok()) Fail(context + ": " + std::string(status.message()));
}

double RelativeError(const at::Tensor& got, const at::Tensor& want) {
  // On the CPU: a worker on a GPU compares with references kept there.
  const at::Tensor a = got.to(at::kCPU, at::kDouble), b = want.to(at::kCPU, at::kDouble);
  const double scale = b.norm().item<double>();
  const double diff = (a - b).norm().item<double>();
  return scale == 0 ? diff : diff / scale;
}

void ExpectClose(const std::string& what, const at::Tensor& got, const at::Tensor& want,
                 double rtol) {
  if (!got.sizes().equals(want.sizes())) {
    Fail(what + ": shape " + c10::str(got.sizes()) + ", expected " +
         c10::str(want.sizes()));
  }
  const double error = RelativeError(got, want);
  if (!(error <= rtol)) {
    Fail(what + ": relative error " + std::to_string(error) + " > " +
         std::to_string(rtol));
  }
}

void ExpectClose(const std::string& what, double got, double want, double rtol) {
  const double error = std::abs(got - want) / std::max(std::abs(want), 1e-30);
  if (!(error <= rtol)) {
    Fail(what + ": " + std::to_string(got) + " vs " + std::to_string(want) +
         " (relative error " + std::to_string(error) + ")");
  }
}

at::Tensor MseLoss(const at::Tensor& output, const at::Tensor& target) {
  return (output - target).pow(2).mean();
}

}  // namespace meshrun::worker::parallel::testing
