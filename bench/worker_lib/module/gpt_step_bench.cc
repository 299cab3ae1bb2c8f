// gpt_step_bench: the training step time of the plain-libtorch GPT
// (worker_lib/models/gpt.h) under meshrun's torch::nn::Module API, the C++
// side of a comparison whose peer, gpt_step_bench.py, trains the Python twin
// (worker_lib/models/gpt.py) under PyTorch's own API with the same
// configuration, batch and launcher. scripts/device-check.sh runs both on
// one GPU.
//
//   torchrun --nproc-per-node=1 --no-python gpt_step_bench --device cuda
//       --layout fsdp --dim 512 --layers 8 --heads 8 --context 256 --batch 16
//
// A step is zero_grad, forward, cross-entropy, backward (with the layout's
// communication), AdamW step; on CUDA it ends with a device synchronize. The
// batch is made before the clock starts. Rank 0 prints
//   RESULT impl=meshrun layout=fsdp device=cuda world=1 median_ms=...
//       p10_ms=... p90_ms=... steps=... peak_mb=...
// peak_mb: the CUDA caching allocator's peak allocated bytes on this rank
// (the number torch.cuda.max_memory_allocated gives the peer); 0 on CPU.
// Layouts: none (one process, no wrapper), ddp (DistributedDataParallel),
// fsdp (FullyShard on every block and the root).

#include <torch/cuda.h>
#include <torch/optim/adamw.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#ifdef MESHRUN_WITH_NCCL
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include "worker_lib/data/data.h"
#include "worker_lib/mesh/process_group.h"
#include "worker_lib/models/gpt.h"
#include "worker_lib/parallel/ddp.h"
#include "worker_lib/parallel/fully_shard.h"

namespace meshrun::worker::parallel {
namespace {

int Fail(const std::string& what) {
  std::cerr << "gpt_step_bench: " << what << std::endl;
  return 1;
}

double Percentile(std::vector<double> values, double q) {
  std::sort(values.begin(), values.end());
  const size_t index = static_cast<size_t>(q * static_cast<double>(values.size() - 1));
  return values[index];
}

double PeakMegabytes(const at::Device& device) {
#ifdef MESHRUN_WITH_NCCL
  if (device.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    return static_cast<double>(stats
                                   .allocated_bytes[static_cast<size_t>(
                                       c10::CachingAllocator::StatType::AGGREGATE)]
                                   .peak) /
           (1 << 20);
  }
#endif
  (void)device;
  return 0;
}

struct Flags {
  std::string layout = "fsdp";
  std::string device = "cpu";
  models::GptConfig config;
  int64_t batch = 16;
  int steps = 20;
  int warmup = 3;
};

int Run(const Flags& flags) {
  const bool cuda = flags.device == "cuda";
  if (!cuda && flags.device != "cpu") return Fail("--device: expected cpu or cuda");
  auto world = InitProcessGroup(cuda ? "nccl" : "gloo");
  if (!world.ok()) return Fail(world.status().ToString());
  const int rank = (*world)->rank();
  const at::Device device =
      cuda ? at::Device(at::kCUDA,
                        static_cast<c10::DeviceIndex>((*world)->env().local_rank))
           : at::Device(at::kCPU);
  ProcessGroupPtr group = (*world)->group();

  torch::manual_seed(1);
  models::Gpt gpt(flags.config);
  gpt->to(device);
  std::unique_ptr<DistributedDataParallel> ddp;
  if (flags.layout == "ddp") {
    auto wrapped = DistributedDataParallel::Wrap(*gpt, group);
    if (!wrapped.ok()) return Fail(wrapped.status().ToString());
    ddp = *std::move(wrapped);
  } else if (flags.layout == "fsdp") {
    for (const auto& block : *gpt->blocks) {
      if (auto status = FullyShard(*block, "fsdp", group); !status.ok())
        return Fail(status.ToString());
    }
    if (auto status = FullyShard(*gpt, "fsdp", group); !status.ok())
      return Fail(status.ToString());
  } else if (flags.layout != "none") {
    return Fail("--layout: expected none, ddp or fsdp");
  }
  torch::optim::AdamW optimizer(gpt->parameters(),
                                torch::optim::AdamWOptions(1e-4).weight_decay(0.1));
  TokenBatch data =
      SyntheticTokens(7, rank, flags.batch, flags.config.context, flags.config.vocab);
  const at::Tensor tokens = data.tokens.to(device), targets = data.targets.to(device);

  std::vector<double> times;
  for (int step = 0; step < flags.warmup + flags.steps; ++step) {
    group->barrier()->wait();
    const auto start = std::chrono::steady_clock::now();
    optimizer.zero_grad();
    at::Tensor logits = parallel::Forward(gpt, tokens);
    at::Tensor loss = at::cross_entropy_loss(logits.reshape({-1, flags.config.vocab}),
                                             targets.reshape({-1}));
    loss.backward();
    optimizer.step();
    if (cuda) torch::cuda::synchronize(device.index());
    const double ms = std::chrono::duration<double, std::milli>(
                          std::chrono::steady_clock::now() - start)
                          .count();
    if (step >= flags.warmup) times.push_back(ms);
  }
  if (rank == 0) {
    std::printf(
        "RESULT impl=meshrun layout=%s device=%s world=%d median_ms=%.3f p10_ms=%.3f "
        "p90_ms=%.3f steps=%d peak_mb=%.1f\n",
        flags.layout.c_str(), flags.device.c_str(), (*world)->size(),
        Percentile(times, 0.5), Percentile(times, 0.1), Percentile(times, 0.9),
        flags.steps, PeakMegabytes(device));
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace
}  // namespace meshrun::worker::parallel

int main(int argc, char** argv) {
  CLI::App app{"Step time of the torch::nn GPT under meshrun's module API"};
  meshrun::worker::parallel::Flags flags;
  app.add_option("--layout", flags.layout, "none, ddp or fsdp");
  app.add_option("--device", flags.device, "cpu (Gloo) or cuda (NCCL, LOCAL_RANK's GPU)");
  app.add_option("--vocab", flags.config.vocab);
  app.add_option("--context", flags.config.context, "sequence length");
  app.add_option("--dim", flags.config.dim);
  app.add_option("--heads", flags.config.heads);
  app.add_option("--layers", flags.config.layers);
  app.add_option("--batch", flags.batch);
  app.add_option("--steps", flags.steps, "timed steps");
  app.add_option("--warmup", flags.warmup, "untimed steps first");
  CLI11_PARSE(app, argc, argv);
  return meshrun::worker::parallel::Run(flags);
}
