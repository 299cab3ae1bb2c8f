// Seed 000's HSDP printout in C++ on a torch::nn module: nn.Linear(10, 10,
// bias=False) whose weight the seed replaces by a flat parameter
// arange(101., 201.) (here a module holding that parameter alone), FullyShard over "FSDP"
// and DistributedDataParallel over "DP" of a (2, 4) mesh ["DP", "FSDP"] (FSDP2's HSDP).
// Each rank prints
//   Global rank: 6, dp_rank: 1, fsdp_rank:2, Weights array: tensor([151., ...])
// and checks its 25 values and that full_tensor() gives the weight back.
//
//   meshrun --standalone --nproc-per-node=8 hsdp_seed000_worker

#include <torch/nn/module.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tests/integration/parallel/parity_harness.h"
#include "worker_lib/mesh/device_mesh.h"
#include "worker_lib/mesh/process_group.h"
#include "worker_lib/parallel/ddp.h"
#include "worker_lib/parallel/fully_shard.h"
#include "worker_lib/parallel/module_params.h"

namespace meshrun::worker::parallel::testing {
namespace {

// "tensor([151., 152., ...], requires_grad=True)", torch's repr of whole
// floats on one line.
std::string TensorRepr(const at::Tensor& t) {
  std::vector<std::string> values;
  at::Tensor flat = t.detach().reshape({-1}).to(at::kDouble);
  for (int64_t i = 0; i < flat.numel(); ++i)
    values.push_back(absl::StrCat(static_cast<int64_t>(flat[i].item<double>()), "."));
  return "tensor([" + absl::StrJoin(values, ", ") + "], requires_grad=True)";
}

int Run() {
  constexpr int kDp = 2, kFsdp = 4;
  auto world = ValueOrFail(InitProcessGroup("gloo"), "init");
  auto mesh =
      ValueOrFail(InitDeviceMesh(world, "cpu", {kDp, kFsdp}, {{"DP", "FSDP"}}), "mesh");
  ProcessGroupPtr dp_group = ValueOrFail(mesh.GetGroup("DP"), "DP group");
  ProcessGroupPtr fsdp_group = ValueOrFail(mesh.GetGroup("FSDP"), "FSDP group");
  const int dp_rank = dp_group->getRank();
  const int fsdp_rank = fsdp_group->getRank();

  // net1 holds only what the seed leaves of the Linear: its flat weight.
  auto model = std::make_shared<torch::nn::Module>();
  auto net1 = model->register_module("net1", std::make_shared<torch::nn::Module>());
  const at::Tensor weight = at::arange(101., 201., at::kFloat);
  net1->register_parameter("weight", weight.clone());
  CheckOk(FullyShard(*model, "FSDP", fsdp_group), "fully_shard");
  // HSDP: replicas across DP (rank 0's shards broadcast, changing nothing).
  auto ddp = ValueOrFail(DistributedDataParallel::Wrap(*model, dp_group), "DDP over DP");

  const std::shared_ptr<Param> param = ModuleParams(*model).front().param;
  const at::Tensor local = param->LocalValues();
  const int64_t per_rank = 100 / kFsdp;
  ExpectClose("shard of fsdp_rank " + std::to_string(fsdp_rank), local,
              at::arange(101. + per_rank * fsdp_rank, 101. + per_rank * (fsdp_rank + 1),
                         at::kFloat),
              0);
  ExpectClose("full_tensor", FullTensor(*param), weight, 0);

  std::printf("Global rank: %d, dp_rank: %d, fsdp_rank:%d, Weights array: %s\n",
              world->rank(), dp_rank, fsdp_rank, TensorRepr(local).c_str());
  std::printf("DONE rank %d\n", world->rank());
  std::fflush(stdout);
  world->group()->barrier()->wait();
  return 0;
}

}  // namespace
}  // namespace meshrun::worker::parallel::testing

int main() { return meshrun::worker::parallel::testing::Run(); }
