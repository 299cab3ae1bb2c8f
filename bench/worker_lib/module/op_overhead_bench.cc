// op_overhead_bench: what a sharded model alive costs the operators that
// never touch it. FullyShard used to drive FSDP from a process-wide
// RecordFunction observer that every operator of the process paid for
// (+24 to 41% on small ops); on explicit per-module hooks it must cost them
// nothing. Rounds alternate between no model and a FullyShard'd GPT (every
// block and the root, one training step run) kept alive, and time the same
// operator loops; rank 0 prints, per loop, the medians and their ratio:
//
//   RESULT loop=add alone_ns=... with_model_ns=... ratio=...
//
//   meshrun --standalone --nproc-per-node=1 --no-python op_overhead_bench

#include <torch/optim/adamw.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "worker_lib/mesh/process_group.h"
#include "worker_lib/models/gpt.h"
#include "worker_lib/parallel/fully_shard.h"

namespace {

using meshrun::worker::models::Gpt;
using meshrun::worker::models::GptConfig;
namespace parallel = meshrun::worker::parallel;

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// Nanoseconds per iteration of `body`, `iterations` times.
double TimeLoop(int iterations, const std::function<void()>& body) {
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iterations; ++i) body();
  const std::chrono::duration<double, std::nano> took =
      std::chrono::steady_clock::now() - start;
  return took.count() / iterations;
}

struct Loop {
  std::string name;
  std::function<void()> body;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"operators outside a model, with and without a sharded model alive"};
  int rounds = 8;
  int iterations = 20000;
  app.add_option("--rounds", rounds);
  app.add_option("--iterations", iterations);
  CLI11_PARSE(app, argc, argv);
  auto world = meshrun::worker::InitProcessGroup("gloo").value();
  at::set_num_threads(1);

  at::Tensor a = at::randn({8}), b = at::randn({8});
  std::vector<at::Tensor> many, others;
  for (int i = 0; i < 256; ++i) {
    many.push_back(at::randn({4}));
    others.push_back(at::randn({4}));
  }
  at::Tensor m = at::randn({16, 16});
  const std::vector<Loop> loops = {
      {"add", [&] { at::add(a, b); }},
      {"mm16", [&] { at::mm(m, m); }},
      {"foreach_add_256", [&] { at::_foreach_add_(many, others); }},
  };

  std::vector<std::vector<double>> alone(loops.size()), with_model(loops.size());
  // Which is measured first alternates, so that warm caches favour neither.
  auto measure = [&](std::vector<std::vector<double>>& into) {
    for (size_t l = 0; l < loops.size(); ++l)
      into[l].push_back(TimeLoop(iterations, loops[l].body));
  };
  for (int round = 0; round < rounds; ++round) {
    if (round % 2 == 0) measure(alone);
    {
      torch::manual_seed(0);
      Gpt gpt(GptConfig{.vocab = 64, .context = 16, .dim = 64, .heads = 4, .layers = 4});
      for (const auto& block : *gpt->blocks)
        parallel::FullyShard(*block, "fsdp", world->group()).IgnoreError();
      parallel::FullyShard(*gpt, "fsdp", world->group()).IgnoreError();
      torch::optim::AdamW optimizer(gpt->parameters());
      at::Tensor tokens = at::randint(64, {2, 16});
      at::cross_entropy_loss(parallel::Forward(gpt, tokens).flatten(0, 1),
                             tokens.flatten())
          .backward();
      optimizer.step();
      measure(with_model);
    }
    if (round % 2 == 1) measure(alone);
  }
  if (world->rank() == 0) {
    for (size_t l = 0; l < loops.size(); ++l) {
      const double base = Median(alone[l]), with = Median(with_model[l]);
      std::printf(
          "RESULT loop=%s alone_ns=%.1f with_model_ns=%.1f ratio=%.3f rounds=%d\n",
          loops[l].name.c_str(), base, with, with / base, rounds);
    }
  }
  return 0;
}
