// dp_step_bench: the training step time of an MLP under meshrun's data
// parallelism (issues 5, 29), the C++ side of scripts/bench-parallel.sh,
// whose peer is PyTorch DDP / FSDP2 (ddp_step_bench.py) on the same model,
// batch and launcher.
//
//   meshrun --standalone --nproc-per-node=4 --no-python dp_step_bench
//       --mode module_ddp --sizes 256,1024,1024,1024,256 --batch 64 --steps 30
//
// A step is zero_grad, forward, MSE loss, backward (with the gradient sync:
// DDP's bucketed all-reduces, FSDP's all-gathers and reduce-scatters), SGD
// step. Each step starts after a barrier; its time is
// the max over ranks; data is made before the clock starts. Rank 0 prints
//   RESULT mode=module_ddp world=4 median_ms=... p10_ms=... p90_ms=... steps=...
//       max_rss_mb=... rss_growth_mb=...
// the last two: the largest rank's peak RSS and its growth over the RSS
// before the model was built (ddp_step_bench.py reports the same), a
// per-rank memory measure that needs no allocator hooks on either side.
// Modes, on the MLP as a torch::nn::Sequential of Linear and ReLU (what the
// PyTorch peer builds): module_ddp (DistributedDataParallel), module_fsdp
// (FullyShard on every Linear and the root, reshard after forward),
// module_fsdp_noreshard, module_dptp (mesh (world/2, 2) ["dp", "tp"]:
// ParallelizeModule pairing the Linears column -> row-wise over tp,
// DistributedDataParallel over dp; tp ranks share their dp rank's rows).

#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "examples/cpp/memory_usage.h"
#include "worker_lib/data/data.h"
#include "worker_lib/mesh/device_mesh.h"
#include "worker_lib/mesh/process_group.h"
#include "worker_lib/parallel/ddp.h"
#include "worker_lib/parallel/fully_shard.h"
#include "worker_lib/parallel/parallelize.h"

namespace meshrun::worker::parallel {
namespace {

int Fail(const std::string& what) {
  std::cerr << "dp_step_bench: " << what << std::endl;
  return 1;
}

double Percentile(std::vector<double> values, double q) {
  std::sort(values.begin(), values.end());
  const double position = q * static_cast<double>(values.size() - 1);
  const size_t low = static_cast<size_t>(position);
  const size_t high = std::min(low + 1, values.size() - 1);
  return values[low] +
         (values[high] - values[low]) * (position - static_cast<double>(low));
}

using examples::PeakRssMb;
using examples::RssMb;

int Main(int argc, char** argv) {
  CLI::App app("dp_step_bench");
  std::string mode = "module_ddp";
  std::string sizes_text = "256,1024,1024,1024,256";
  int64_t batch = 64;
  int steps = 30;
  int warmup = 5;
  app.add_option("--mode", mode)
      ->check(CLI::IsMember(
          {"module_ddp", "module_fsdp", "module_fsdp_noreshard", "module_dptp"}));
  app.add_option("--sizes", sizes_text);
  app.add_option("--batch", batch, "global batch");
  app.add_option("--steps", steps, "timed steps");
  app.add_option("--warmup", warmup, "untimed steps first");
  CLI11_PARSE(app, argc, argv);
  std::vector<int64_t> sizes;
  for (absl::string_view part : absl::StrSplit(sizes_text, ',')) {
    int64_t size = 0;
    if (!absl::SimpleAtoi(part, &size) || size <= 0) return Fail("bad --sizes");
    sizes.push_back(size);
  }

  auto world = InitProcessGroup("gloo");
  if (!world.ok()) return Fail(std::string(world.status().message()));
  const int n = (*world)->size();
  const int rank = (*world)->rank();
  const int tp = mode == "module_dptp" ? 2 : 1;
  if (n % tp != 0) return Fail("module_dptp needs an even world");
  auto mesh = InitDeviceMesh(*world, "cpu", {n / tp, tp}, {{"dp", "tp"}});
  if (!mesh.ok()) return Fail(std::string(mesh.status().message()));
  ProcessGroupPtr group = *mesh->GetGroup("dp");
  const int data_parts = n / tp;
  const int data_index = *mesh->GetLocalRank("dp");
  if (batch % data_parts != 0) return Fail("--batch must divide over the dp ranks");

  const double rss_before_model = RssMb();
  torch::nn::Sequential net;
  torch::manual_seed(1);
  for (size_t i = 0; i + 1 < sizes.size(); ++i) {
    if (i > 0) net->push_back(torch::nn::ReLU());
    net->push_back(torch::nn::Linear(sizes[i], sizes[i + 1]));
  }
  std::unique_ptr<DistributedDataParallel> ddp;
  if (mode == "module_ddp" || mode == "module_dptp") {
    if (mode == "module_dptp") {
      // The Linears are children 0, 2, 4, ...: pairs column -> row-wise.
      ParallelizePlan plan;
      for (size_t k = 0; k + 1 < sizes.size() - 1; k += 2) {
        plan.emplace_back(std::to_string(2 * k), ColwiseParallel());
        plan.emplace_back(std::to_string(2 * k + 2), RowwiseParallel());
      }
      absl::Status status = ParallelizeModule(*net, "tp", *mesh->GetGroup("tp"), plan);
      if (!status.ok()) return Fail(std::string(status.message()));
    }
    auto wrapped = DistributedDataParallel::Wrap(*net, group);
    if (!wrapped.ok()) return Fail(std::string(wrapped.status().message()));
    ddp = *std::move(wrapped);
  } else {
    const FsdpOptions options{mode == "module_fsdp"};
    for (const auto& child : net->children()) {
      if (child->named_parameters().is_empty()) continue;
      absl::Status status = FullyShard(*child, "dp", group, options);
      if (!status.ok()) return Fail(std::string(status.message()));
    }
    absl::Status status = FullyShard(*net, "dp", group, options);
    if (!status.ok()) return Fail(std::string(status.message()));
  }
  torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(0.01));

  std::vector<double> times;
  double first_loss = 0, last_loss = 0;
  for (int step = 0; step < warmup + steps; ++step) {
    Batch data = SyntheticBatch(/*seed=*/7, step, batch, sizes.front(), sizes.back());
    at::Tensor input = DataShard(data.input, data_parts, data_index);
    at::Tensor target = DataShard(data.target, data_parts, data_index);
    (*world)->group()->barrier()->wait();
    const auto start = std::chrono::steady_clock::now();
    optimizer.zero_grad();
    at::Tensor loss = (net->forward(input) - target).pow(2).mean();
    loss.backward();
    optimizer.step();
    const auto stop = std::chrono::steady_clock::now();
    if (step == 0) first_loss = loss.item<double>();
    last_loss = loss.item<double>();
    if (step >= warmup)
      times.push_back(std::chrono::duration<double, std::milli>(stop - start).count());
  }
  // Per step, the slowest rank.
  std::vector<at::Tensor> all{at::tensor(times, at::kDouble)};
  c10d::AllreduceOptions max;
  max.reduceOp = c10d::ReduceOp::MAX;
  (*world)->group()->allreduce(all, max)->wait();
  std::vector<double> step_ms(all[0].data_ptr<double>(),
                              all[0].data_ptr<double>() + steps);
  const double peak = PeakRssMb();
  std::vector<at::Tensor> memory{
      at::tensor({peak, peak - rss_before_model}, at::kDouble)};
  (*world)->group()->allreduce(memory, max)->wait();
  if (rank == 0) {
    std::vector<std::string> formatted;
    for (double t : step_ms) formatted.push_back(std::to_string(t).substr(0, 7));
    std::printf(
        "RESULT impl=meshrun mode=%s world=%d sizes=%s batch=%lld median_ms=%.3f "
        "p10_ms=%.3f "
        "p90_ms=%.3f steps=%d first_loss=%.6f last_loss=%.6f max_rss_mb=%.1f "
        "rss_growth_mb=%.1f\n",
        mode.c_str(), n, sizes_text.c_str(), static_cast<long long>(batch),
        Percentile(step_ms, 0.5), Percentile(step_ms, 0.1), Percentile(step_ms, 0.9),
        steps, first_loss, last_loss, memory[0][0].item<double>(),
        memory[0][1].item<double>());
    std::printf("STEPS impl=meshrun mode=%s %s\n", mode.c_str(),
                absl::StrJoin(formatted, ",").c_str());
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace
}  // namespace meshrun::worker::parallel

int main(int argc, char** argv) { return meshrun::worker::parallel::Main(argc, argv); }
