#pragma once

// The training loop shared by the data-parallel workers (dp_worker,
// fsdp_worker, hsdp_worker): SGD on this rank's rows of the global
// SyntheticBatch, loss averaged over the data-parallel ranks, every step's
// loss and the gathered final params checked against a single-process
// reference (parity_harness.h); exits 1 with a FAIL line on a mismatch.

#include <ATen/ATen.h>
#include <torch/optim/sgd.h>

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "tests/integration/parallel/parity_harness.h"
#include "worker_lib/parallel/data.h"
#include "worker_lib/parallel/layers.h"
#include "worker_lib/parallel/param.h"

namespace meshrun::worker::parallel::testing {

inline std::vector<int64_t> ParseSizes(const std::string& text) {
  std::vector<int64_t> sizes;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    int64_t size = 0;
    if (!absl::SimpleAtoi(part, &size) || size <= 0) Fail("bad --sizes " + text);
    sizes.push_back(size);
  }
  if (sizes.size() < 2) Fail("--sizes needs at least two sizes");
  return sizes;
}

struct TrainOptions {
  uint64_t data_seed = 7;
  int steps = 10;
  int64_t batch = 32;
  double lr = 0.05;
  // This rank's rows of the global batch: chunk `data_index` of `data_parts`.
  int64_t data_parts = 1;
  int64_t data_index = 0;
  bool print = false;  // "step N loss X" lines (rank 0)
};

// The model every rank builds whole before parallelising it.
constexpr uint64_t kModelSeed = 1;

// Single-process training of MakeMlp(sizes, kModelSeed) on the global batch.
inline ReferenceRun Reference(const std::vector<int64_t>& sizes,
                              const TrainOptions& options) {
  Sequential model = MakeMlp(sizes, kModelSeed);
  return TrainReference(model, options.data_seed, options.steps, options.batch,
                        options.lr);
}

// Trains the parallelised `model` and checks every step's loss against
// `reference`. `after_forward(step)` runs between forward and backward,
// `after_backward()` between backward and the optimizer step (gradient
// sync). The loss is averaged over `loss_group` (the data-parallel ranks).
inline void TrainAndCheck(Sequential& model, const ReferenceRun& reference,
                          const TrainOptions& options, c10d::ProcessGroup& loss_group,
                          const std::function<void(int)>& after_forward,
                          const std::function<void()>& after_backward) {
  const auto params = model.Params();
  const int64_t in = params.front()->global_shape()[1];
  const int64_t out = params.back()->global_shape()[0];
  torch::optim::SGD optimizer(model.Leaves(), torch::optim::SGDOptions(options.lr));
  for (int step = 0; step < options.steps; ++step) {
    Batch data = SyntheticBatch(options.data_seed, step, options.batch, in, out);
    at::Tensor input = DataShard(data.input, options.data_parts, options.data_index);
    at::Tensor target = DataShard(data.target, options.data_parts, options.data_index);
    optimizer.zero_grad();
    at::Tensor loss = MseLoss(model.Forward(input), target);
    if (after_forward) after_forward(step);
    loss.backward();
    if (after_backward) after_backward();
    optimizer.step();
    std::vector<at::Tensor> mean{loss.detach().clone()};
    loss_group.allreduce(mean)->wait();
    const double global = mean[0].item<double>() / loss_group.getSize();
    ExpectClose("step " + std::to_string(step) + " loss", global, reference.losses[step]);
    if (options.print) std::printf("step %d loss %.9g\n", step, global);
  }
  std::fflush(stdout);
}

// FullTensor of every param equals the reference's final values.
inline void CheckFinalParams(const Sequential& model, const ReferenceRun& reference) {
  const auto params = model.Params();
  if (params.size() != reference.final_params.size()) Fail("param count differs");
  for (size_t i = 0; i < params.size(); ++i) {
    ExpectClose("final " + params[i]->name(), FullTensor(*params[i]),
                reference.final_params[i]);
  }
}

}  // namespace meshrun::worker::parallel::testing
