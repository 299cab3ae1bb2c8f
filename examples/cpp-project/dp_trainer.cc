// Data-parallel training of a small MLP on a 1-D DeviceMesh ("dp"), built
// against an installed meshrun (see CMakeLists.txt). Every rank trains on its
// slice of the same global batch; DataParallel averages the gradients, so
// the replicas stay identical, which the program checks at the end.
//
//   meshrun --standalone --nproc-per-node=2 ./dp_trainer [--steps N]

#include <ATen/ATen.h>

#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "worker_lib/device_mesh.h"
#include "worker_lib/parallel/dp.h"
#include "worker_lib/parallel/layers.h"
#include "worker_lib/process_group.h"

namespace {

namespace worker = meshrun::worker;
namespace parallel = meshrun::worker::parallel;

int Fail(const std::string& what, const absl::Status& status) {
  std::cerr << "dp_trainer: " + what + ": " + std::string(status.message()) + "\n";
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 30;
  if (argc == 3 && std::string(argv[1]) == "--steps") steps = std::atoi(argv[2]);
  constexpr int64_t kGlobalBatch = 32;
  constexpr double kLearningRate = 0.05;

  auto world = worker::InitProcessGroup("gloo");
  if (!world.ok()) return Fail("process group", world.status());
  const int rank = (*world)->rank();
  const int size = (*world)->size();
  if (kGlobalBatch % size != 0) {
    std::cerr << "dp_trainer: the world size must divide " << kGlobalBatch << "\n";
    return 2;
  }
  auto mesh = worker::InitDeviceMesh(*world, "cpu", {size}, {{"dp"}});
  if (!mesh.ok()) return Fail("device mesh", mesh.status());
  auto dp_mesh = (*mesh)["dp"];
  if (!dp_mesh.ok()) return Fail("mesh[\"dp\"]", dp_mesh.status());
  auto dp_group = dp_mesh->GetGroup();
  if (!dp_group.ok()) return Fail("dp group", dp_group.status());

  // The same model on every rank (same seed), as DDP expects.
  parallel::Sequential model = parallel::MakeMlp({8, 32, 1}, /*seed=*/1);
  parallel::DataParallel dp(model.Params(), *dp_group);

  // y = sum of x's features: each rank takes its rows of a batch that
  // depends only on the step.
  const int64_t local_batch = kGlobalBatch / size;
  double first_loss = 0;
  double last_loss = 0;
  for (int step = 0; step < steps; ++step) {
    at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(1000 + step);
    at::Tensor x = at::randn({kGlobalBatch, 8}, generator)
                       .narrow(0, rank * local_batch, local_batch);
    at::Tensor y = x.sum(1, /*keepdim=*/true);
    at::Tensor loss = at::mse_loss(model.Forward(x), y);
    loss.backward();
    dp.SyncGradients();
    {
      at::NoGradGuard no_grad;
      for (at::Tensor& leaf : model.Leaves()) {
        leaf.sub_(leaf.grad() * kLearningRate);
        leaf.grad().zero_();
      }
    }
    // The global batch's loss: the mean of the ranks' (equal-sized) losses.
    at::Tensor global = loss.detach().clone();
    std::vector<at::Tensor> tensors = {global};
    (*dp_group)->allreduce(tensors)->wait();
    const double value = global.item<double>() / size;
    if (step == 0) first_loss = value;
    last_loss = value;
    if (rank == 0 && (step % 10 == 0 || step + 1 == steps))
      std::cout << "step " + std::to_string(step) + " loss " + std::to_string(value) +
                       "\n"
                << std::flush;
  }
  if (absl::Status same = dp.VerifyParamsEqual(); !same.ok())
    return Fail("replicas differ", same);
  if (rank == 0) {
    std::cout << "dp_trainer: " + std::to_string(size) + " ranks on mesh " +
                     mesh->ToString() + ", loss " + std::to_string(first_loss) + " -> " +
                     std::to_string(last_loss) + ", replicas identical\n"
              << std::flush;
  }
  return last_loss < first_loss ? 0 : 1;
}
