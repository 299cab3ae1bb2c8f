// pytorch/examples' cpp/mnist, as its authors wrote it, trained with FSDP
// under meshrun: the lines that meshrun needs end in "// meshrun" (the
// process group and the data split, FullyShard, and the two calls of the
// model through parallel::Forward). This machine has no MNIST download, so
// the dataset is a synthetic one of the same shape: 28x28 images of ten
// classes, each a fixed random pattern plus noise.
//
//   meshrun --standalone --nproc-per-node=2 build/bin/mnist --epochs 2

#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <cstddef>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "worker_lib/mesh/process_group.h"
#include "worker_lib/parallel/fully_shard.h"
#include "worker_lib/parallel/module_hooks.h"

namespace parallel = meshrun::worker::parallel;

// The batch size for training.
const int64_t kTrainBatchSize = 64;

// The batch size for testing.
const int64_t kTestBatchSize = 1000;

// After how many batches to log a new update with the loss value.
const int64_t kLogInterval = 10;

struct Net : torch::nn::Module {
  Net()
      : conv1(torch::nn::Conv2dOptions(1, 10, /*kernel_size=*/5)),
        conv2(torch::nn::Conv2dOptions(10, 20, /*kernel_size=*/5)),
        fc1(320, 50),
        fc2(50, 10) {
    register_module("conv1", conv1);
    register_module("conv2", conv2);
    register_module("conv2_drop", conv2_drop);
    register_module("fc1", fc1);
    register_module("fc2", fc2);
  }

  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(torch::max_pool2d(conv1->forward(x), 2));
    x = torch::relu(torch::max_pool2d(conv2_drop->forward(conv2->forward(x)), 2));
    x = x.view({-1, 320});
    x = torch::relu(fc1->forward(x));
    x = torch::dropout(x, /*p=*/0.5, /*train=*/is_training());
    x = fc2->forward(x);
    return torch::log_softmax(x, /*dim=*/1);
  }

  torch::nn::Conv2d conv1;
  torch::nn::Conv2d conv2;
  torch::nn::Dropout2d conv2_drop;
  torch::nn::Linear fc1;
  torch::nn::Linear fc2;
};

// MNIST's shape without its files: `size` images of ten classes.
class SyntheticDigits : public torch::data::datasets::Dataset<SyntheticDigits> {
 public:
  SyntheticDigits(size_t size, uint64_t seed) : size_(size) {
    auto generator = at::make_generator<at::CPUGeneratorImpl>(1234);
    patterns_ = torch::rand({10, 1, 28, 28}, generator);
    auto noise = at::make_generator<at::CPUGeneratorImpl>(seed);
    labels_ = torch::randint(10, {static_cast<int64_t>(size)}, noise);
    images_ = patterns_.index_select(0, labels_) +
              0.3 * torch::randn({static_cast<int64_t>(size), 1, 28, 28}, noise);
  }
  torch::data::Example<> get(size_t index) override {
    const auto i = static_cast<int64_t>(index);
    return {images_[i], labels_[i]};
  }
  torch::optional<size_t> size() const override { return size_; }

 private:
  size_t size_;
  torch::Tensor patterns_, images_, labels_;
};

template <typename DataLoader>
void train(size_t epoch, Net& model, torch::Device device, DataLoader& data_loader,
           torch::optim::Optimizer& optimizer, size_t dataset_size, int rank) {
  model.train();
  size_t batch_idx = 0;
  for (auto& batch : data_loader) {
    auto data = batch.data.to(device), targets = batch.target.to(device);
    optimizer.zero_grad();
    auto output = parallel::Forward(model, data);  // meshrun
    auto loss = torch::nll_loss(output, targets);
    AT_ASSERT(!std::isnan(loss.template item<float>()));
    loss.backward();
    optimizer.step();

    if (batch_idx++ % kLogInterval == 0 && rank == 0) {
      std::printf("\rTrain Epoch: %ld [%5ld/%5ld] Loss: %.4f\n", epoch,
                  batch_idx * batch.data.size(0), dataset_size,
                  loss.template item<float>());
    }
  }
}

template <typename DataLoader>
void test(Net& model, torch::Device device, DataLoader& data_loader, size_t dataset_size,
          int rank) {
  torch::NoGradGuard no_grad;
  model.eval();
  double test_loss = 0;
  int32_t correct = 0;
  for (const auto& batch : data_loader) {
    auto data = batch.data.to(device), targets = batch.target.to(device);
    auto output = parallel::Forward(model, data);  // meshrun
    test_loss += torch::nll_loss(output, targets,
                                 /*weight=*/{}, torch::Reduction::Sum)
                     .template item<float>();
    auto pred = output.argmax(1);
    correct += pred.eq(targets).sum().template item<int64_t>();
  }

  test_loss /= dataset_size;
  if (rank == 0) {
    std::printf("\nTest set: Average loss: %.4f | Accuracy: %.3f\n", test_loss,
                static_cast<double>(correct) / dataset_size);
  }
}

auto main(int argc, char** argv) -> int {
  CLI::App app{"pytorch/examples' cpp/mnist under meshrun, with FSDP"};
  size_t epochs = 2;
  size_t train_size = 16384;
  app.add_option("--epochs", epochs);
  app.add_option("--train-size", train_size);
  CLI11_PARSE(app, argc, argv);

  torch::manual_seed(1);
  auto world = meshrun::worker::InitProcessGroup("gloo").value();  // meshrun
  const int rank = world->rank();

  torch::DeviceType device_type = torch::kCPU;
  torch::Device device(device_type);

  Net model;
  model.to(device);
  if (!parallel::FullyShard(model, "dp", world->group()).ok()) return 1;  // meshrun

  auto train_dataset = SyntheticDigits(train_size, /*seed=*/1)
                           .map(torch::data::transforms::Normalize<>(0.1307, 0.3081))
                           .map(torch::data::transforms::Stack<>());
  const size_t train_dataset_size = train_dataset.size().value();
  auto train_loader = torch::data::make_data_loader(
      std::move(train_dataset),
      torch::data::samplers::DistributedSequentialSampler(  // meshrun
          train_dataset_size, world->size(), rank),         // meshrun
      kTrainBatchSize);

  auto test_dataset = SyntheticDigits(1000, /*seed=*/2)
                          .map(torch::data::transforms::Normalize<>(0.1307, 0.3081))
                          .map(torch::data::transforms::Stack<>());
  const size_t test_dataset_size = test_dataset.size().value();
  auto test_loader =
      torch::data::make_data_loader(std::move(test_dataset), kTestBatchSize);

  torch::optim::SGD optimizer(model.parameters(),
                              torch::optim::SGDOptions(0.01).momentum(0.5));

  for (size_t epoch = 1; epoch <= epochs; ++epoch) {
    train(epoch, model, device, *train_loader, optimizer, train_dataset_size, rank);
    test(model, device, *test_loader, test_dataset_size, rank);
  }
  std::printf("DONE rank %d\n", rank);
  return 0;
}
