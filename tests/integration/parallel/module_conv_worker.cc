// A convolutional net, shaped unlike the GPT and the residual MLP the other
// module workers train: torch::nn::Conv2d, max-pooling, dropout-free ReLUs,
// flatten, Linear and log_softmax + NLL on synthetic 1 x 12 x 12 images of
// 10 classes (an MNIST classifier in small). Its forward uses the
// functional API (torch::max_pool2d, torch::relu, view), as libtorch's own
// examples do. Trained under DDP, FSDP (every conv and linear a unit, and
// the root) or HSDP against the same net in one process (every step's loss
// and the final parameters within rtol 1e-5, AdamW).
//
// ddp_batchnorm: the net with a BatchNorm2d after its first conv, under DDP.
// Each rank normalises with its own rows' statistics, so the reference is
// DDP's semantics in one process: each step runs every rank's rows in turn
// from rank 0's buffers (DDP's broadcast_buffers), averages their grads and
// keeps the buffers rank 0's rows left. Every rank's buffers must equal the
// reference's at the end, and so must a loss in eval mode (which reads
// them).
//
//   meshrun --standalone --nproc-per-node=4 module_conv_worker --layout fsdp

#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <map>

#include "tests/integration/parallel/module_checks.h"
#include "tests/integration/parallel/parity_harness.h"
#include "worker_lib/data/data.h"
#include "worker_lib/mesh/device_mesh.h"
#include "worker_lib/mesh/process_group.h"
#include "worker_lib/parallel/ddp.h"
#include "worker_lib/parallel/fully_shard.h"

namespace meshrun::worker::parallel::testing {
namespace {

constexpr int64_t kBatch = 16, kClasses = 10, kSide = 12;
constexpr uint64_t kSeed = 3;

struct ConvNetImpl : torch::nn::Module {
  explicit ConvNetImpl(bool batch_norm)
      // No bias before a BatchNorm (which removes it): its grads would be
      // rounding noise, which AdamW would scale up to whole steps.
      : conv1(register_module(
            "conv1",
            torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 6, 3).bias(!batch_norm)))),
        conv2(register_module(
            "conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(6, 8, 3).padding(1)))),
        fc1(register_module("fc1", torch::nn::Linear(8 * 2 * 2, 24))),
        fc2(register_module("fc2", torch::nn::Linear(24, kClasses))) {
    if (batch_norm) bn1 = register_module("bn1", torch::nn::BatchNorm2d(6));
  }

  at::Tensor forward(at::Tensor x) {
    x = Forward(conv1, x);
    if (bn1) x = Forward(bn1, x);
    x = torch::relu(torch::max_pool2d(x, 2));                  // 12 -> 10 -> 5
    x = torch::relu(torch::max_pool2d(Forward(conv2, x), 2));  // 5 -> 5 -> 2
    x = x.view({-1, 8 * 2 * 2});
    x = torch::relu(Forward(fc1, x));
    return torch::log_softmax(Forward(fc2, x), /*dim=*/1);
  }

  torch::nn::Conv2d conv1, conv2;
  torch::nn::Linear fc1, fc2;
  torch::nn::BatchNorm2d bn1{nullptr};
};
TORCH_MODULE(ConvNet);

ConvNet MakeNet(bool batch_norm) {
  torch::manual_seed(kSeed);
  return ConvNet(batch_norm);
}

std::vector<at::Tensor> CloneBuffers(ConvNet& net) {
  std::vector<at::Tensor> copies;
  for (const at::Tensor& buffer : net->buffers()) copies.push_back(buffer.clone());
  return copies;
}

void SetBuffers(ConvNet& net, const std::vector<at::Tensor>& values) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> buffers = net->buffers();
  for (size_t i = 0; i < buffers.size(); ++i) buffers[i].copy_(values[i]);
}

torch::optim::AdamWOptions Adam() {
  return torch::optim::AdamWOptions(3e-3).weight_decay(0.01);
}

// Images whose class is where their brightest 3 x 3 patch is (a learnable
// rule), plus noise.
std::pair<at::Tensor, at::Tensor> Images(int step) {
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(1000 + step);
  at::Tensor labels = at::randint(kClasses, {kBatch}, generator, at::kLong);
  at::Tensor images = at::randn({kBatch, 1, kSide, kSide}, generator) * 0.3;
  for (int64_t i = 0; i < kBatch; ++i) {
    const int64_t label = labels[i].item<int64_t>();
    images[i][0].narrow(0, label, 3).narrow(1, label, 3).add_(1.0);
  }
  return {images, labels};
}

at::Tensor Loss(ConvNet& net, const at::Tensor& images, const at::Tensor& labels) {
  return at::nll_loss(Forward(net, images), labels);
}

int Train(const std::string& layout, int steps) {
  auto world = ValueOrFail(InitProcessGroup("gloo"), "init");
  const int rank = world->rank(), n = world->size();
  const int shards = layout == "hsdp" ? std::min(2, n) : (layout == "fsdp" ? n : 1);
  auto mesh = ValueOrFail(
      InitDeviceMesh(world, "cpu", {n / shards, shards}, {{"replicate", "shard"}}),
      "mesh");
  ProcessGroupPtr replicate = ValueOrFail(mesh.GetGroup("replicate"), "replicate group");
  ProcessGroupPtr shard = ValueOrFail(mesh.GetGroup("shard"), "shard group");

  const bool batch_norm = layout == "ddp_batchnorm";
  std::vector<double> reference_losses;
  std::map<std::string, at::Tensor> reference_params;
  std::vector<at::Tensor> reference_buffers;
  double reference_eval_loss = 0;
  {
    ConvNet net = MakeNet(batch_norm);
    torch::optim::AdamW optimizer(net->parameters(), Adam());
    for (int step = 0; step < steps; ++step) {
      auto [images, labels] = Images(step);
      optimizer.zero_grad();
      if (!batch_norm) {
        at::Tensor loss = Loss(net, images, labels);
        loss.backward();
        reference_losses.push_back(loss.item<double>());
      } else {
        // DDP's step, rank by rank: each from rank 0's buffers.
        const std::vector<at::Tensor> from = CloneBuffers(net);
        std::vector<at::Tensor> rank0_left;
        double sum = 0;
        for (int r = 0; r < n; ++r) {
          SetBuffers(net, from);
          at::Tensor loss = Loss(net, DataShard(images, n, r), DataShard(labels, n, r));
          (loss / n).backward();
          sum += loss.item<double>();
          if (r == 0) rank0_left = CloneBuffers(net);
        }
        SetBuffers(net, rank0_left);
        reference_losses.push_back(sum / n);
      }
      optimizer.step();
    }
    for (const auto& item : net->named_parameters())
      reference_params[item.key()] = item.value().detach().clone();
    reference_buffers = CloneBuffers(net);
    if (batch_norm) {
      net->eval();
      auto [images, labels] = Images(steps);
      reference_eval_loss = Loss(net, images, labels).item<double>();
    }
  }

  ConvNet net = MakeNet(batch_norm);
  std::unique_ptr<DistributedDataParallel> ddp;
  if (layout == "fsdp" || layout == "hsdp") {
    for (const auto& child : net->children())
      CheckOk(FullyShard(*child, "shard", shard), "FullyShard(child)");
    CheckOk(FullyShard(*net, "shard", shard), "FullyShard(root)");
  }
  if (layout == "ddp" || layout == "hsdp" || batch_norm)
    ddp = ValueOrFail(DistributedDataParallel::Wrap(*net, replicate), "Wrap");
  if (layout != "ddp" && layout != "fsdp" && layout != "hsdp" && !batch_norm)
    Fail("unknown layout " + layout);

  torch::optim::AdamW optimizer(net->parameters(), Adam());
  for (int step = 0; step < steps; ++step) {
    auto [images, labels] = Images(step);
    optimizer.zero_grad();
    at::Tensor loss = Loss(net, DataShard(images, n, rank), DataShard(labels, n, rank));
    loss.backward();
    optimizer.step();
    const double global = MeanOver(*world->group(), loss);
    ExpectClose("loss at step " + std::to_string(step), global, reference_losses[step]);
    if (rank == 0) std::printf("step %d loss %.6f\n", step, global);
  }
  ExpectModuleParams(*net, reference_params);
  if (batch_norm) {
    const std::vector<at::Tensor> buffers = net->buffers();
    for (size_t i = 0; i < buffers.size(); ++i) {
      if (!at::allclose(buffers[i].to(at::kDouble), reference_buffers[i].to(at::kDouble),
                        1e-5, 1e-7))
        Fail("rank " + std::to_string(rank) + ": buffer " + std::to_string(i) +
             " is not rank 0's as DDP's broadcast_buffers leaves it");
    }
    net->eval();
    auto [images, labels] = Images(steps);
    ExpectClose("eval loss on rank " + std::to_string(rank),
                Loss(net, images, labels).item<double>(), reference_eval_loss);
  }
  std::printf("DONE rank %d\n", rank);
  std::fflush(stdout);
  return 0;
}

}  // namespace
}  // namespace meshrun::worker::parallel::testing

int main(int argc, char** argv) {
  CLI::App app{"A torch::nn conv net under DDP, FSDP or HSDP against one process"};
  std::string layout = "fsdp";
  int steps = 8;
  app.add_option("--layout", layout, "ddp, ddp_batchnorm, fsdp or hsdp");
  app.add_option("--steps", steps);
  CLI11_PARSE(app, argc, argv);
  return meshrun::worker::parallel::testing::Train(layout, steps);
}
