// Data-parallel training (DataParallel, dp.h) under meshrun: every rank
// trains the same MLP on its rows of the global batch, gradients averaged
// in buckets; checks every step's loss and the final params against
// single-process training. Ranks other than 0 start from different weights,
// which BroadcastParams must overwrite (DDP's initial broadcast). Checks
// too that every bucket's all-reduce starts during backward (the overlap),
// that backwards accumulate with set_sync_during_backward(false), and that
// a second backward while syncing during backward is reported.
//
//   meshrun --standalone --nproc-per-node=4 dp_worker --sizes 50,50,50,50,4

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <iostream>

#include "tests/integration/parallel/dp_worker_support.h"
#include "worker_lib/device_mesh.h"
#include "worker_lib/parallel/dp.h"
#include "worker_lib/process_group.h"

namespace meshrun::worker::parallel::testing {
namespace {

std::vector<at::Tensor> CloneGrads(const Sequential& model) {
  std::vector<at::Tensor> grads;
  for (const auto& param : model.Params()) grads.push_back(param->data().grad().clone());
  return grads;
}

void ZeroGrads(const Sequential& model) {
  at::NoGradGuard no_grad;
  for (const auto& param : model.Params()) param->data().mutable_grad().zero_();
}

// After training: backwards of one step's loss, synced in the three ways
// (one backward syncing during it; two accumulated with the sync after
// them; two while syncing during backward, a misuse).
void CheckAccumulation(Sequential& model, DataParallel& dp, const TrainOptions& options,
                       int rank) {
  const auto params = model.Params();
  Batch data =
      SyntheticBatch(options.data_seed, 0, options.batch,
                     params.front()->global_shape()[1], params.back()->global_shape()[0]);
  at::Tensor input = DataShard(data.input, options.data_parts, options.data_index);
  at::Tensor target = DataShard(data.target, options.data_parts, options.data_index);
  auto backward = [&] { MseLoss(model.Forward(input), target).backward(); };

  ZeroGrads(model);
  backward();
  dp.SyncGradients();
  const std::vector<at::Tensor> once = CloneGrads(model);

  ZeroGrads(model);
  dp.set_sync_during_backward(false);
  backward();
  backward();
  dp.SyncGradients();
  if (dp.buckets_started_in_backward() != 0)
    Fail("all-reduces started during a backward with the sync off");
  const std::vector<at::Tensor> twice = CloneGrads(model);
  for (size_t i = 0; i < once.size(); ++i)
    ExpectClose("accumulated grad of " + params[i]->name(), twice[i], 2 * once[i]);
  dp.set_sync_during_backward(true);

  ZeroGrads(model);
  backward();
  backward();
  try {
    dp.SyncGradients();
    Fail("a second backward while syncing during backward went unreported");
  } catch (const c10::Error& e) {
    const std::string message = e.msg().substr(0, e.msg().find('\n'));
    if (rank == 0) std::printf("MISUSE %s\n", message.c_str());
  }
  // Usable again afterwards.
  ZeroGrads(model);
  backward();
  dp.SyncGradients();
  for (size_t i = 0; i < once.size(); ++i)
    ExpectClose("grad after the misuse of " + params[i]->name(), params[i]->data().grad(),
                once[i]);
}

int Main(int argc, char** argv) {
  CLI::App app("dp_worker");
  std::string sizes_text = "50,50,50,50,4";
  int64_t bucket_bytes = 4096;
  TrainOptions options;
  app.add_option("--sizes", sizes_text);
  app.add_option("--steps", options.steps);
  app.add_option("--batch", options.batch);
  app.add_option("--bucket-bytes", bucket_bytes);
  CLI11_PARSE(app, argc, argv);
  const std::vector<int64_t> sizes = ParseSizes(sizes_text);

  auto world = ValueOrFail(InitProcessGroup("gloo"), "init");
  auto mesh =
      ValueOrFail(InitDeviceMesh(world, "cpu", {world->size()}, {{"dp"}}), "mesh");
  ProcessGroupPtr group = ValueOrFail(mesh.GetGroup("dp"), "dp group");
  const int rank = world->rank();

  const ReferenceRun reference = Reference(sizes, options);

  // Rank 0 holds the model; the others start elsewhere until the broadcast.
  Sequential model = MakeMlp(sizes, rank == 0 ? kModelSeed : 100 + rank);
  DataParallel dp(model.Params(), group, static_cast<size_t>(bucket_bytes));
  absl::Status before = dp.VerifyParamsEqual();
  if (before.ok()) Fail("VerifyParamsEqual missed different initial weights");
  if (rank == 0) std::printf("VERIFY before broadcast: %s\n", before.ToString().c_str());
  CheckOk(dp.BroadcastParams(0), "broadcast");
  CheckOk(dp.VerifyParamsEqual(), "after broadcast");
  if (rank == 0) {
    std::printf("BUCKETS %d of <= %lld bytes for %zu params\n", dp.num_buckets(),
                static_cast<long long>(bucket_bytes), model.Params().size());
  }

  options.data_parts = world->size();
  options.data_index = rank;
  options.print = rank == 0;
  // After the first sync the grads are views into the buckets: autograd
  // accumulates into them in place, so their addresses stay put.
  std::vector<void*> grad_addresses;
  int fewest_started = dp.num_buckets();
  TrainAndCheck(model, reference, options, *group, nullptr, [&] {
    dp.SyncGradients();
    fewest_started = std::min(fewest_started, dp.buckets_started_in_backward());
    std::vector<void*> addresses;
    for (const auto& param : model.Params())
      addresses.push_back(param->data().grad().data_ptr());
    if (!grad_addresses.empty() && addresses != grad_addresses)
      Fail("grads moved out of the buckets");
    grad_addresses = addresses;
  });
  CheckFinalParams(model, reference);
  CheckOk(dp.VerifyParamsEqual(), "after training");
  if (rank == 0) {
    std::printf("OVERLAP at least %d of %d buckets started during backward\n",
                fewest_started, dp.num_buckets());
  }
  CheckAccumulation(model, dp, options, rank);
  std::printf("DONE rank %d\n", rank);
  std::fflush(stdout);
  return 0;
}

}  // namespace
}  // namespace meshrun::worker::parallel::testing

int main(int argc, char** argv) {
  return meshrun::worker::parallel::testing::Main(argc, argv);
}
