// FSDP (fsdp.h) under meshrun.
//
// Default: every rank trains the same MLP FSDP-sharded over all ranks on its
// rows of the global batch; checks every step's loss and the gathered final
// params against single-process training, and that the gathered params are
// freed after forward (--reshard-after-forward=true) or kept until backward
// (false), and freed after backward either way.
//
// --tp-seed000: FSDP on top of TP-sharded params (seed 000's FSDP + TP).
//
// --memory: per-rank parameter + gradient + optimizer-state (SGD momentum)
// bytes of the same model under DataParallel and under FSDP, after two steps;
// prints "MEMORY ..." and checks FSDP's = (DP's + padding) / world.
//
//   meshrun --standalone --nproc-per-node=4 fsdp_worker --sizes 50,50,50,50,4

#include <torch/optim/sgd.h>

#include <CLI/CLI.hpp>
#include <cstdio>

#include "tests/integration/parallel/dp_worker_support.h"
#include "worker_lib/device_mesh.h"
#include "worker_lib/parallel/dp.h"
#include "worker_lib/parallel/fsdp.h"
#include "worker_lib/process_group.h"

namespace meshrun::worker::parallel::testing {
namespace {

// Bytes of the gathered params (with the padding of equal chunks).
size_t PaddedFullBytes(const Sequential& model, int64_t parts) {
  size_t total = 0;
  for (const auto& param : model.Params()) {
    const at::Tensor& shard = param->data();
    total += static_cast<size_t>(parts) * shard.nbytes();
  }
  return total;
}

void CheckShards(const Sequential& model, int rank, int64_t parts) {
  for (const auto& param : model.Params()) {
    const int64_t rows = param->global_shape()[0];
    const ChunkExtent chunk = ChunkOf(rows, parts, rank);
    if (param->data().size(0) != chunk.padded_size ||
        param->LocalValues().size(0) != chunk.size) {
      Fail(param->Describe() + ": expected " + std::to_string(chunk.size) + " of " +
           std::to_string(chunk.padded_size) + " rows");
    }
    std::printf("LOCAL %d %s rows %lld\n", rank, param->Describe().c_str(),
                static_cast<long long>(chunk.size));
  }
}

// Every FSDP layer gathers its params as one group (one all-gather of one
// flat buffer), and its forward issues the next FSDP layer's all-gather
// before computing: a no-grad forward stopped after the first layer finds
// the next one's all-gather in flight; the rest of the forward consumes it.
void CheckGroupsAndPrefetch(Sequential& model, const std::vector<int64_t>& sizes,
                            int rank) {
  for (const auto& layer : model.layers) {
    auto* fsdp = dynamic_cast<FsdpLayer*>(layer.get());
    if (fsdp == nullptr) continue;
    if (fsdp->groups().size() != 1) Fail(layer->Describe() + ": not one param group");
    const FlatShardLayout& layout = fsdp->groups()[0]->layout();
    if (rank == 0) {
      std::printf("GROUP %s: %zu params, %lld elements a rank\n",
                  layer->Describe().c_str(), layout.offsets.size(),
                  static_cast<long long>(layout.segment_numel));
    }
  }
  at::NoGradGuard no_grad;
  at::Tensor x = at::zeros({2, sizes.front()});
  x = model.layers[0]->Forward(x);
  FsdpLayer* next = nullptr;
  for (size_t i = 1; i < model.layers.size() && next == nullptr; ++i)
    next = dynamic_cast<FsdpLayer*>(model.layers[i].get());
  if (next == nullptr) return;
  const size_t in_flight = next->unsharded_bytes();
  if (in_flight == 0) Fail("no all-gather in flight for the second FSDP layer");
  if (rank == 0) {
    std::printf("PREFETCH after %s: %s's all-gather in flight\n",
                model.layers[0]->Describe().c_str(), next->Describe().c_str());
  }
  for (size_t i = 1; i < model.layers.size(); ++i) x = model.layers[i]->Forward(x);
  if (UnshardedBytes(model) != 0) Fail("gathered params alive after a no-grad forward");
}

int Train(const std::vector<int64_t>& sizes, TrainOptions options, bool reshard) {
  auto world = ValueOrFail(InitProcessGroup("gloo"), "init");
  auto mesh =
      ValueOrFail(InitDeviceMesh(world, "cpu", {world->size()}, {{"fsdp"}}), "mesh");
  ProcessGroupPtr group = ValueOrFail(mesh.GetGroup("fsdp"), "fsdp group");
  const int rank = world->rank();
  const int64_t parts = world->size();

  const ReferenceRun reference = Reference(sizes, options);

  Sequential model = MakeMlp(sizes, kModelSeed);
  CheckOk(FullyShard(model, "fsdp", group, FsdpOptions{reshard}), "FullyShard");
  CheckShards(model, rank, parts);
  if (rank == 0) {
    for (const auto& layer : model.layers)
      std::printf("LAYER %s\n", layer->Describe().c_str());
  }
  if (UnshardedBytes(model) != 0)
    Fail("unsharded storage alive before the first forward");
  const size_t full_bytes = PaddedFullBytes(model, parts);
  CheckGroupsAndPrefetch(model, sizes, rank);

  options.data_parts = parts;
  options.data_index = rank;
  options.print = rank == 0;
  TrainAndCheck(
      model, reference, options, *group,
      [&](int step) {
        const size_t alive = UnshardedBytes(model);
        if (alive != (reshard ? 0 : full_bytes)) {
          Fail("after forward " + std::to_string(step) + ": " + std::to_string(alive) +
               " bytes of gathered params alive, expected " +
               std::to_string(reshard ? 0 : full_bytes));
        }
        if (rank == 0 && step == 0)
          std::printf("UNSHARDED after forward: %zu bytes\n", alive);
      },
      [&] {
        if (UnshardedBytes(model) != 0) Fail("gathered params alive after backward");
      });
  CheckFinalParams(model, reference);
  std::printf("DONE rank %d\n", rank);
  std::fflush(stdout);
  return 0;
}

struct Bytes {
  size_t params = 0, grads = 0, state = 0;
  size_t total() const { return params + grads + state; }
};

Bytes Count(const Sequential& model, torch::optim::SGD& optimizer) {
  Bytes bytes;
  for (const auto& param : model.Params()) {
    bytes.params += param->data().nbytes();
    if (param->data().grad().defined()) bytes.grads += param->data().grad().nbytes();
  }
  for (const auto& [key, state] : optimizer.state()) {
    auto* sgd = dynamic_cast<torch::optim::SGDParamState*>(state.get());
    if (sgd != nullptr && sgd->momentum_buffer().defined())
      bytes.state += sgd->momentum_buffer().nbytes();
  }
  return bytes;
}

// Two SGD-with-momentum steps; `sync` after backward; returns the bytes.
Bytes TwoSteps(Sequential& model, const TrainOptions& options,
               const std::function<void()>& sync,
               const std::function<void()>& after_forward) {
  const auto params = model.Params();
  const int64_t in = params.front()->global_shape()[1];
  const int64_t out = params.back()->global_shape()[0];
  torch::optim::SGD optimizer(model.Leaves(),
                              torch::optim::SGDOptions(options.lr).momentum(0.9));
  for (int step = 0; step < 2; ++step) {
    Batch data = SyntheticBatch(options.data_seed, step, options.batch, in, out);
    optimizer.zero_grad();
    at::Tensor loss = MseLoss(
        model.Forward(DataShard(data.input, options.data_parts, options.data_index)),
        DataShard(data.target, options.data_parts, options.data_index));
    after_forward();
    loss.backward();
    sync();
    optimizer.step();
  }
  return Count(model, optimizer);
}

int Memory(const std::vector<int64_t>& sizes, TrainOptions options) {
  auto world = ValueOrFail(InitProcessGroup("gloo"), "init");
  auto mesh =
      ValueOrFail(InitDeviceMesh(world, "cpu", {world->size()}, {{"fsdp"}}), "mesh");
  ProcessGroupPtr group = ValueOrFail(mesh.GetGroup("fsdp"), "group");
  const int rank = world->rank();
  const int64_t parts = world->size();
  options.data_parts = parts;
  options.data_index = rank;

  Sequential dp_model = MakeMlp(sizes, kModelSeed);
  DataParallel dp(dp_model.Params(), group);
  const Bytes dp_bytes = TwoSteps(
      dp_model, options, [&] { dp.SyncGradients(); }, [] {});

  size_t alive_after_forward[2] = {0, 0};
  Bytes fsdp_bytes;
  for (bool reshard : {true, false}) {
    Sequential model = MakeMlp(sizes, kModelSeed);
    CheckOk(FullyShard(model, "fsdp", group, FsdpOptions{reshard}), "FullyShard");
    size_t& alive = alive_after_forward[reshard ? 0 : 1];
    Bytes bytes = TwoSteps(
        model, options, [] {}, [&] { alive = std::max(alive, UnshardedBytes(model)); });
    if (reshard) fsdp_bytes = bytes;
  }

  // Padding: rows added to make equal chunks, per byte of a full row.
  size_t padding_bytes = 0;
  size_t full_param_bytes = 0;
  for (const auto& param : dp_model.Params()) {
    const at::Tensor& full = param->data();
    const int64_t rows = full.size(0);
    const size_t row_bytes = full.nbytes() / rows;
    padding_bytes += (parts * ChunkOf(rows, parts, 0).padded_size - rows) * row_bytes;
    full_param_bytes += full.nbytes();
  }
  std::printf(
      "MEMORY rank %d world %lld dp params %zu grads %zu state %zu total %zu | fsdp "
      "params "
      "%zu grads %zu state %zu total %zu | padding %zu | ratio %.4f | unsharded after "
      "forward: reshard %zu, no reshard %zu\n",
      rank, static_cast<long long>(parts), dp_bytes.params, dp_bytes.grads,
      dp_bytes.state, dp_bytes.total(), fsdp_bytes.params, fsdp_bytes.grads,
      fsdp_bytes.state, fsdp_bytes.total(), padding_bytes,
      static_cast<double>(fsdp_bytes.total()) / dp_bytes.total(), alive_after_forward[0],
      alive_after_forward[1]);
  // Params, grads and momentum: three copies of each.
  if (dp_bytes.params != full_param_bytes || dp_bytes.grads != full_param_bytes ||
      dp_bytes.state != full_param_bytes)
    Fail("DP does not hold params, grads and momentum whole");
  if (parts * fsdp_bytes.params != full_param_bytes + padding_bytes ||
      fsdp_bytes.grads != fsdp_bytes.params || fsdp_bytes.state != fsdp_bytes.params)
    Fail("FSDP bytes are not (DP + padding) / world");
  if (alive_after_forward[0] != 0)
    Fail("gathered params alive after a resharding forward");
  if (alive_after_forward[1] != full_param_bytes + padding_bytes)
    Fail("without resharding, the gathered params should stay alive until backward");
  std::printf("DONE rank %d\n", rank);
  std::fflush(stdout);
  return 0;
}

// Seed 000's FSDP + TP: a 12x12 weight (101..244) column-sharded over "TP"
// (Param::Shard, dim 0: 3 rows each of 4), then FullyShard over "FSDP" (2
// ranks: the 3 TP rows split 2 + 1, padded to 2) on a (2, 4) mesh. Compute()
// gives back the TP-local rows; FullTensor() the whole weight in the right
// row order (pytorch#129229 is the wrong one).
int TpSeed000() {
  auto world = ValueOrFail(InitProcessGroup("gloo"), "init");
  auto mesh = ValueOrFail(InitDeviceMesh(world, "cpu", {2, 4}, {{"FSDP", "TP"}}), "mesh");
  ProcessGroupPtr fsdp_group = ValueOrFail(mesh.GetGroup("FSDP"), "FSDP group");
  ProcessGroupPtr tp_group = ValueOrFail(mesh.GetGroup("TP"), "TP group");
  const int fsdp_rank = fsdp_group->getRank();
  const int tp_rank = tp_group->getRank();
  const at::Tensor full = at::arange(101., 245., at::kFloat).view({12, 12});
  auto weight = Param::FromFull("net1.weight", full);
  CheckOk(weight->Shard("TP", 0, tp_group), "TP shard");
  CheckOk(FullyShard(*weight, "FSDP", fsdp_group), "FullyShard");
  const at::Tensor tp_rows = full.narrow(0, 3 * tp_rank, 3);
  const at::Tensor mine = tp_rows.narrow(0, 2 * fsdp_rank, fsdp_rank == 0 ? 2 : 1);
  ExpectClose("local values", weight->LocalValues(), mine, 0);
  {
    at::NoGradGuard no_grad;
    ExpectClose("Compute()", weight->Compute(), tp_rows, 0);
  }
  const at::Tensor gathered = FullTensor(*weight);
  if (!at::equal(gathered, full)) Fail("full_tensor() differs from the weight");
  std::printf("FSDPTP rank %d fsdp_rank %d tp_rank %d %s first %g\n", world->rank(),
              fsdp_rank, tp_rank, weight->Describe().c_str(),
              weight->LocalValues().reshape({-1})[0].item<double>());
  std::printf("DONE rank %d\n", world->rank());
  std::fflush(stdout);
  return 0;
}

int Main(int argc, char** argv) {
  CLI::App app("fsdp_worker");
  std::string sizes_text = "50,50,50,50,4";
  bool reshard = true;
  bool memory = false;
  bool tp_seed000 = false;
  TrainOptions options;
  app.add_option("--sizes", sizes_text);
  app.add_option("--steps", options.steps);
  app.add_option("--batch", options.batch);
  app.add_option("--reshard-after-forward", reshard);
  app.add_flag("--memory", memory);
  app.add_flag("--tp-seed000", tp_seed000);
  CLI11_PARSE(app, argc, argv);
  const std::vector<int64_t> sizes = ParseSizes(sizes_text);
  if (tp_seed000) return TpSeed000();
  return memory ? Memory(sizes, options) : Train(sizes, options, reshard);
}

}  // namespace
}  // namespace meshrun::worker::parallel::testing

int main(int argc, char** argv) {
  return meshrun::worker::parallel::testing::Main(argc, argv);
}
