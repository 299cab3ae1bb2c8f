// Where CUDA work lands (issue 44), for scripts/device-check.sh:
//   - InitProcessGroup("nccl") makes the GPU of LOCAL_RANK the current device,
//     as torch.cuda.set_device(LOCAL_RANK) in a torchrun script does;
//   - FullyShard's gathered parameters live on their parameters' device, even
//     when another GPU is current (--other-current-device, after
//     InitProcessGroup: a rank whose code moved the current device): CUDA's
//     caching allocator allocates on the current device unless told.
// module_net.h's MLP on the rank's device (Device(kCUDA, LOCAL_RANK), as
// gpt_worker), FullyShard of the blocks and the root over the world, two
// AdamW steps; after each forward the root unit's parameters are still
// gathered (FSDP2 keeps the root's), and their storage's data pointer must
// be on the tensor's device.
//
//   torchrun --nproc-per-node=2 device_placement_worker --device cuda \
//     --other-current-device
//
// On CPU (Gloo) the same checks hold trivially; the worker then only shows
// that the guards are harmless there.

#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>

#include "tests/integration/parallel/module_checks.h"
#include "tests/integration/parallel/module_net.h"
#include "worker_lib/mesh/process_group.h"
#include "worker_lib/parallel/fully_shard.h"

namespace meshrun::worker::parallel::testing {
namespace {

const c10::impl::DeviceGuardImplInterface& Cuda() {
  return *c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA);
}

// The gathered storage behind `tensor`, a full-shape parameter of the root
// unit right after forward: allocated, and on `tensor`'s device.
void ExpectPlaced(const std::string& name, const at::Tensor& tensor) {
  const c10::Storage& storage = tensor.storage();
  if (storage.nbytes() == 0) Fail(name + " is not gathered after forward");
  const c10::Device actual = storage.data_ptr().device();
  if (actual != tensor.device()) {
    Fail(name + " is a " + tensor.device().str() +
         " tensor whose gathered storage is on " + actual.str());
  }
}

int Run(const WorkerDevice& on, bool other_current_device) {
  auto world = ValueOrFail(InitProcessGroup(on.backend), "init");
  const int rank = world->rank();
  if (on.device.is_cuda()) {
    const c10::Device current = Cuda().getDevice();
    if (current != on.device) {
      Fail("after InitProcessGroup(nccl) the current device is " + current.str() +
           ", not LOCAL_RANK's " + on.device.str());
    }
    std::printf("CURRENT rank %d %s\n", rank, current.str().c_str());
    if (other_current_device) {
      const int count = Cuda().deviceCount();
      if (count < 2) Fail("--other-current-device needs two GPUs");
      const c10::Device other(
          c10::DeviceType::CUDA,
          static_cast<c10::DeviceIndex>((on.device.index() + 1) % count));
      Cuda().setDevice(other);
      std::printf("MOVED rank %d current device to %s\n", rank, other.str().c_str());
    }
  }
  Net net = MakeNet();
  net->to(on.device);
  for (const auto& block : *net->blocks) {
    CheckOk(FullyShard(*block, "dp", world->group()), "FullyShard block");
  }
  CheckOk(FullyShard(*net, "dp", world->group()), "FullyShard root");
  torch::optim::AdamW optimizer(net->parameters(), Adam());
  for (int step = 0; step < 2; ++step) {
    Batch data = SyntheticBatch(kDataSeed, step, kBatch, kIn, kOut);
    optimizer.zero_grad();
    at::Tensor loss =
        MseLoss(Forward(net, data.input.to(on.device)), data.target.to(on.device));
    ExpectPlaced("in.weight", net->in->weight);
    ExpectPlaced("norm.weight", net->norm->weight);
    ExpectPlaced("head.weight", net->head->weight);
    loss.backward();
    optimizer.step();
    const double mean = MeanOver(*world->group(), loss);
    if (rank == 0) std::printf("step %d loss %.6f\n", step, mean);
  }
  std::printf("PLACED rank %d: gathered parameters on %s\n", rank,
              on.device.str().c_str());
  std::printf("DONE rank %d\n", rank);
  std::fflush(stdout);
  return 0;
}

}  // namespace
}  // namespace meshrun::worker::parallel::testing

int main(int argc, char** argv) {
  CLI::App app{"Where gathered parameters and the current CUDA device land"};
  std::string device = "cpu";
  bool other_current_device = false;
  app.add_option("--device", device, "cpu (Gloo) or cuda (NCCL, the GPU of LOCAL_RANK)");
  app.add_flag("--other-current-device", other_current_device,
               "after InitProcessGroup, make another GPU current (needs 2)");
  CLI11_PARSE(app, argc, argv);
  using namespace meshrun::worker::parallel::testing;
  return Run(ParseWorkerDevice(device), other_current_device);
}
