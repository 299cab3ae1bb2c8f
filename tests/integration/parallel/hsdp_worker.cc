// HSDP under meshrun: FSDP over the shard dimension, DataParallel over the
// replicate dimension on the shard grads, on a 2-D mesh (replicate, shard).
//
// --seed000: seed 000's printout. A flat weight of 100 values arange(101,
// 201) fully sharded over "FSDP" of a (2, 4) mesh ["DP", "FSDP"]: each rank
// prints
//   Global rank: 6, dp_rank: 1, fsdp_rank:2, Weights array: tensor([151., ...])
// and checks its 25 values and that its "DP" peer holds the same ones.
//
// Default: the MLP trained on a (dp, fsdp) mesh; every step's loss and the
// gathered final params checked against single-process training.
//
//   meshrun --standalone --nproc-per-node=8 hsdp_worker --seed000
//   meshrun --standalone --nproc-per-node=4 hsdp_worker --dp 2 --fsdp 2

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tests/integration/parallel/dp_worker_support.h"
#include "worker_lib/device_mesh.h"
#include "worker_lib/parallel/dp.h"
#include "worker_lib/parallel/fsdp.h"
#include "worker_lib/process_group.h"

namespace meshrun::worker::parallel::testing {
namespace {

// "tensor([151., 152., ...])", torch's repr of whole floats on one line.
std::string TensorRepr(const at::Tensor& t) {
  std::vector<std::string> values;
  at::Tensor flat = t.detach().reshape({-1}).to(at::kDouble);
  for (int64_t i = 0; i < flat.numel(); ++i) {
    values.push_back(absl::StrCat(static_cast<int64_t>(flat[i].item<double>()), "."));
  }
  return "tensor([" + absl::StrJoin(values, ", ") + "], requires_grad=True)";
}

int Seed000(int dp_size, int fsdp_size) {
  auto world = ValueOrFail(InitProcessGroup("gloo"), "init");
  auto mesh = ValueOrFail(
      InitDeviceMesh(world, "cpu", {dp_size, fsdp_size}, {{"DP", "FSDP"}}), "mesh");
  ProcessGroupPtr dp_group = ValueOrFail(mesh.GetGroup("DP"), "DP group");
  ProcessGroupPtr fsdp_group = ValueOrFail(mesh.GetGroup("FSDP"), "FSDP group");
  const int dp_rank =
      ValueOrFail(ValueOrFail(mesh["DP"], "DP").GetLocalRank(), "dp rank");
  const int fsdp_rank =
      ValueOrFail(ValueOrFail(mesh["FSDP"], "FSDP").GetLocalRank(), "fsdp rank");

  // nn.Linear(10, 10, bias=False) whose weight the seed replaces by a flat
  // Parameter(torch.arange(101., 201.)).
  auto weight = Param::FromFull("net1.weight", at::arange(101., 201., at::kFloat));
  CheckOk(FullyShard(*weight, "FSDP", fsdp_group), "FullyShard");
  // HSDP: replicated across DP; the broadcast must change nothing.
  DataParallel dp({weight}, dp_group);
  CheckOk(dp.VerifyParamsEqual(), "shards across DP");

  const at::Tensor local = weight->LocalValues();
  const int64_t per_rank = 100 / fsdp_size;
  at::Tensor expected = at::arange(101. + per_rank * fsdp_rank,
                                   101. + per_rank * (fsdp_rank + 1), at::kFloat);
  ExpectClose("shard of fsdp_rank " + std::to_string(fsdp_rank), local, expected, 0);
  // The full weight comes back from any rank's shard.
  ExpectClose("full_tensor", FullTensor(*weight), at::arange(101., 201., at::kFloat), 0);

  std::printf("Global rank: %d, dp_rank: %d, fsdp_rank:%d, Weights array: %s\n",
              world->rank(), dp_rank, fsdp_rank, TensorRepr(local).c_str());
  std::printf("DONE rank %d\n", world->rank());
  std::fflush(stdout);
  return 0;
}

int Train(const std::vector<int64_t>& sizes, int dp_size, int fsdp_size,
          TrainOptions options, bool reshard) {
  auto world = ValueOrFail(InitProcessGroup("gloo"), "init");
  auto mesh = ValueOrFail(
      InitDeviceMesh(world, "cpu", {dp_size, fsdp_size}, {{"dp", "fsdp"}}), "mesh");
  ProcessGroupPtr dp_group = ValueOrFail(mesh.GetGroup("dp"), "dp group");
  ProcessGroupPtr fsdp_group = ValueOrFail(mesh.GetGroup("fsdp"), "fsdp group");
  const std::vector<int> coordinate = *mesh.GetCoordinate();
  const int rank = world->rank();

  const ReferenceRun reference = Reference(sizes, options);

  Sequential model = MakeMlp(sizes, kModelSeed);
  CheckOk(FullyShard(model, "fsdp", fsdp_group, FsdpOptions{reshard}), "FullyShard");
  DataParallel dp(model.Params(), dp_group);
  CheckOk(dp.VerifyParamsEqual(), "shards across dp");
  for (const auto& param : model.Params()) {
    std::printf("LOCAL %d dp %d fsdp %d %s\n", rank, coordinate[0], coordinate[1],
                param->Describe().c_str());
  }

  // Every (dp, fsdp) rank sees different rows: dp x fsdp data-parallel ranks.
  options.data_parts = static_cast<int64_t>(dp_size) * fsdp_size;
  options.data_index = static_cast<int64_t>(coordinate[0]) * fsdp_size + coordinate[1];
  options.print = rank == 0;
  // FSDP writes the shard grads, not autograd: their all-reduces start from
  // its shard-grad hooks, during backward.
  int fewest_started = dp.num_buckets();
  TrainAndCheck(model, reference, options, *world->group(), nullptr, [&] {
    dp.SyncGradients();
    fewest_started = std::min(fewest_started, dp.buckets_started_in_backward());
  });
  CheckFinalParams(model, reference);
  CheckOk(dp.VerifyParamsEqual(), "shards across dp after training");
  if (rank == 0) {
    std::printf("OVERLAP at least %d of %d buckets started during backward\n",
                fewest_started, dp.num_buckets());
  }
  std::printf("DONE rank %d\n", rank);
  std::fflush(stdout);
  return 0;
}

int Main(int argc, char** argv) {
  CLI::App app("hsdp_worker");
  std::string sizes_text = "50,50,50,50,4";
  int dp_size = 2;
  int fsdp_size = 4;
  bool seed000 = false;
  bool reshard = true;
  TrainOptions options;
  app.add_option("--sizes", sizes_text);
  app.add_option("--dp", dp_size);
  app.add_option("--fsdp", fsdp_size);
  app.add_option("--steps", options.steps);
  app.add_option("--batch", options.batch);
  app.add_option("--reshard-after-forward", reshard);
  app.add_flag("--seed000", seed000);
  CLI11_PARSE(app, argc, argv);
  if (seed000) return Seed000(dp_size, fsdp_size);
  return Train(ParseSizes(sizes_text), dp_size, fsdp_size, options, reshard);
}

}  // namespace
}  // namespace meshrun::worker::parallel::testing

int main(int argc, char** argv) {
  return meshrun::worker::parallel::testing::Main(argc, argv);
}
