// A model of your own, written in plain libtorch, trained with FSDP + TP on
// a 2-D DeviceMesh ("dp", "tp") against an installed meshrun (see
// CMakeLists.txt): every block's first Linear column-wise and second
// row-wise parallel over "tp", every block and the root fully sharded over
// "dp", AdamW on the module's parameters (its shards). Each dp rank trains
// on its slice of the same global batch; at the end every rank gathers the
// parameters, and the program checks that all ranks hold the same model.
//
//   meshrun --standalone --nproc-per-node=4 ./trainer [--steps N]

#include <torch/torch.h>

#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "worker_lib/mesh/device_mesh.h"
#include "worker_lib/mesh/process_group.h"
#include "worker_lib/parallel/fully_shard.h"
#include "worker_lib/parallel/module_hooks.h"
#include "worker_lib/parallel/module_params.h"
#include "worker_lib/parallel/parallelize.h"

namespace {

namespace worker = meshrun::worker;
namespace parallel = meshrun::worker::parallel;

struct BlockImpl : torch::nn::Module {
  explicit BlockImpl(int64_t dim)
      : norm(register_module("norm",
                             torch::nn::LayerNorm(torch::nn::LayerNormOptions({dim})))),
        up(register_module("up", torch::nn::Linear(dim, 4 * dim))),
        down(register_module("down", torch::nn::Linear(4 * dim, dim))) {}
  torch::Tensor forward(const torch::Tensor& x) {
    return x + parallel::Forward(down, torch::gelu(parallel::Forward(up, norm(x))));
  }
  torch::nn::LayerNorm norm;
  torch::nn::Linear up, down;
};
TORCH_MODULE(Block);

struct ModelImpl : torch::nn::Module {
  ModelImpl(int64_t in, int64_t dim, int64_t out, int blocks_count)
      : embed(register_module("embed", torch::nn::Linear(in, dim))),
        blocks(register_module("blocks", torch::nn::ModuleList())),
        head(register_module("head", torch::nn::Linear(dim, out))) {
    for (int i = 0; i < blocks_count; ++i) blocks->push_back(Block(dim));
  }
  torch::Tensor forward(torch::Tensor x) {
    x = embed(x);
    for (const auto& block : *blocks) x = parallel::Forward(block->as<BlockImpl>(), x);
    return head(x);
  }
  torch::nn::Linear embed;
  torch::nn::ModuleList blocks;
  torch::nn::Linear head;
};
TORCH_MODULE(Model);

int Fail(const std::string& what, const absl::Status& status) {
  std::cerr << "trainer: " + what + ": " + std::string(status.message()) + "\n";
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 30;
  if (argc == 3 && std::string(argv[1]) == "--steps") steps = std::atoi(argv[2]);
  constexpr int64_t kGlobalBatch = 32;

  auto world = worker::InitProcessGroup("gloo");
  if (!world.ok()) return Fail("process group", world.status());
  const int rank = (*world)->rank();
  const int size = (*world)->size();
  if (size % 2 != 0 || kGlobalBatch % (size / 2) != 0) {
    std::cerr << "trainer: needs an even world whose half divides " << kGlobalBatch
              << "\n";
    return 2;
  }
  auto mesh = worker::InitDeviceMesh(*world, "cpu", {size / 2, 2}, {{"dp", "tp"}});
  if (!mesh.ok()) return Fail("device mesh", mesh.status());
  auto dp = mesh->GetGroup("dp");
  auto tp = mesh->GetGroup("tp");
  if (!dp.ok() || !tp.ok())
    return Fail("mesh groups", dp.ok() ? tp.status() : dp.status());

  // The same model on every rank (same seed), then sharded in place.
  torch::manual_seed(1);
  Model model(8, 32, 1, 2);
  if (absl::Status status =
          parallel::ParallelizeModule(*model, "tp", *tp,
                                      {{"blocks.*.up", parallel::ColwiseParallel()},
                                       {"blocks.*.down", parallel::RowwiseParallel()}});
      !status.ok())
    return Fail("ParallelizeModule", status);
  for (const auto& block : *model->blocks) {
    if (absl::Status status = parallel::FullyShard(*block, "dp", *dp); !status.ok())
      return Fail("FullyShard", status);
  }
  if (absl::Status status = parallel::FullyShard(*model, "dp", *dp); !status.ok())
    return Fail("FullyShard", status);
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-2));

  // y = sum of x's features: each dp rank takes its rows of a batch that
  // depends only on the step (the tp ranks of a dp rank share them).
  const int64_t dp_size = (*dp)->getSize();
  const int64_t local_batch = kGlobalBatch / dp_size;
  double first_loss = 0;
  double last_loss = 0;
  for (int step = 0; step < steps; ++step) {
    torch::manual_seed(1000 + step);
    torch::Tensor x = torch::randn({kGlobalBatch, 8})
                          .narrow(0, (*dp)->getRank() * local_batch, local_batch);
    torch::Tensor y = x.sum(1, /*keepdim=*/true);
    optimizer.zero_grad();
    torch::Tensor loss = torch::mse_loss(parallel::Forward(model, x), y);
    loss.backward();
    optimizer.step();
    // The global batch's loss: the mean of the dp ranks' (equal-sized) losses.
    std::vector<torch::Tensor> tensors = {loss.detach().clone()};
    (*dp)->allreduce(tensors)->wait();
    const double value = tensors[0].item<double>() / static_cast<double>(dp_size);
    if (step == 0) first_loss = value;
    last_loss = value;
    if (rank == 0 && (step % 10 == 0 || step + 1 == steps))
      std::cout << "step " + std::to_string(step) + " loss " + std::to_string(value) +
                       "\n"
                << std::flush;
  }
  // Every rank gathers the whole model; rank 0's copy must equal everyone's.
  for (const parallel::NamedParam& named : parallel::ShardedParams(*model)) {
    torch::Tensor full = parallel::FullTensor(*named.param);
    std::vector<torch::Tensor> theirs = {full.clone()};
    (*world)->group()->broadcast(theirs)->wait();
    if (!torch::equal(full, theirs[0])) {
      std::cerr << "trainer: " + named.name + " differs from rank 0's\n";
      return 1;
    }
  }
  if (rank == 0) {
    std::cout << "trainer: " + std::to_string(size) + " ranks on mesh " +
                     mesh->ToString() + ", FSDP x TP, loss " +
                     std::to_string(first_loss) + " -> " + std::to_string(last_loss) +
                     ", every rank holds the same model\n"
              << std::flush;
  }
  return last_loss < first_loss ? 0 : 1;
}
