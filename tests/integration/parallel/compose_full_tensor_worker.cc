// Seed 000's FSDP2 + TP experiment in C++: a 12x12 torch::nn::Linear without
// bias whose weight is 101..244, on a (2, 4) mesh ["FSDP", "TP"]:
// ParallelizeModule with ColwiseParallel over TP (3 rows a rank), then
// FullyShard over FSDP (rows 2 and 1 of each TP shard). Every rank prints its shard; rank
// 0 prints full_tensor(), which must equal the weight exactly: the rows come back in
// order, where PyTorch 2.3's DTensor reassembled them out of order (pytorch#129229).

#include <torch/nn/modules/linear.h>

#include <iostream>
#include <sstream>

#include "tests/integration/parallel/parity_harness.h"
#include "worker_lib/mesh/device_mesh.h"
#include "worker_lib/mesh/process_group.h"
#include "worker_lib/parallel/fully_shard.h"
#include "worker_lib/parallel/module_params.h"
#include "worker_lib/parallel/parallelize.h"

using namespace meshrun::worker;
using namespace meshrun::worker::parallel;
using parallel::testing::CheckOk;
using parallel::testing::Fail;
using parallel::testing::ValueOrFail;

namespace {

std::string Values(const at::Tensor& t) {
  std::ostringstream out;
  at::Tensor flat = t.flatten();
  for (int64_t i = 0; i < flat.numel(); ++i)
    out << (i ? ", " : "") << flat[i].item<float>();
  return out.str();
}

}  // namespace

int main() {
  auto world = ValueOrFail(InitProcessGroup("gloo"), "init_process_group");
  auto mesh = ValueOrFail(InitDeviceMesh(world, "cpu", {2, 4}, {{"FSDP", "TP"}}), "mesh");
  const at::Tensor weight = at::arange(101, 245, at::kFloat).reshape({12, 12});
  // Seed 000's model: a module holding net1.
  auto model = std::make_shared<torch::nn::Module>();
  auto net1 = model->register_module(
      "net1", torch::nn::Linear(torch::nn::LinearOptions(12, 12).bias(false)));
  {
    at::NoGradGuard no_grad;
    net1->weight.copy_(weight);
  }

  auto tp = ValueOrFail(mesh.GetGroup("TP"), "TP group");
  auto fsdp = ValueOrFail(mesh.GetGroup("FSDP"), "FSDP group");
  CheckOk(ParallelizeModule(*model, "TP", tp, {{"net1", ColwiseParallel()}}),
          "parallelize_module");
  CheckOk(FullyShard(*model, "FSDP", fsdp), "fully_shard");

  const std::shared_ptr<Param> param = ModuleParams(*model).front().param;
  const Box box = param->box();
  std::cout << "SHARD " + std::to_string(world->rank()) +
                   " fsdp_rank:" + std::to_string(fsdp->getRank()) +
                   " tp_rank:" + std::to_string(tp->getRank()) + " rows " +
                   std::to_string(box.offsets[0]) + "+" + std::to_string(box.sizes[0]) +
                   " [" + DescribeSteps(param->steps()) + "] values " +
                   Values(param->LocalValues()) + "\n"
            << std::flush;

  at::Tensor full = FullTensor(*param);
  if (!at::equal(full, weight))
    Fail("full_tensor differs from the weight: " + Values(full));
  if (world->rank() == 0) std::cout << "FULL " + Values(full) + "\n" << std::flush;
  return 0;
}
