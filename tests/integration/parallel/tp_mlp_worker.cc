// Tensor-parallel MLP training vs single-process training, run under the
// launcher on a 1-D mesh ("tp") of the whole world:
//   meshrun --standalone --nproc-per-node=2 --no-python tp_mlp_worker
//       --sizes 50,50,50,50,4 --steps 10
// Every rank builds MakeMlp(sizes, seed) whole, trains a copy of it alone
// (the reference), parallelises the other with ParallelizeMlp and trains it
// on the same batches. Checks every step's loss, the output shape, and the
// gathered final params (FullTensor) against the reference (rtol 1e-5), and
// that each param's local shard is its slice of the global tensor. Prints
// "LAYER <describe>" and "LOCAL <rank> <param>" lines, then "step N loss X"
// on rank 0 and "DONE rank <r>"; a mismatch prints "FAIL ..." and exits 1.
//
// With --expect-error TEXT, ParallelizeMlp must fail with a message
// containing TEXT (printed as "ERROR <message>"), and nothing is trained.

#include <torch/optim/sgd.h>

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/integration/parallel/tp_worker_support.h"
#include "worker_lib/parallel/data.h"
#include "worker_lib/parallel/tp.h"

using namespace meshrun::worker::parallel;           // NOLINT
using namespace meshrun::worker::parallel::testing;  // NOLINT

int main(int argc, char** argv) {
  CLI::App app("Tensor-parallel MLP parity worker");
  std::vector<int64_t> sizes{50, 50, 50, 50, 4};
  int steps = 10;
  int64_t batch = 32;
  double lr = 0.5;
  uint64_t model_seed = 3;
  uint64_t data_seed = 11;
  std::string expect_error;
  app.add_option("--sizes", sizes)->delimiter(',');
  app.add_option("--steps", steps);
  app.add_option("--batch", batch);
  app.add_option("--lr", lr);
  app.add_option("--model-seed", model_seed);
  app.add_option("--data-seed", data_seed);
  app.add_option("--expect-error", expect_error);
  CLI11_PARSE(app, argc, argv);

  TpSetup setup = InitTpMesh();
  const int rank = setup.world->rank();

  Sequential model = MakeMlp(sizes, model_seed);
  absl::Status parallelized = ParallelizeMlp(model, "tp", setup.tp);
  if (!expect_error.empty()) {
    ExpectRefused(parallelized, expect_error, model.Params(), setup.tp, rank);
    return 0;
  }
  CheckOk(parallelized, "ParallelizeMlp");
  if (rank == 0) {
    for (const auto& layer : model.layers) Say("LAYER " + layer->Describe());
  }
  const auto params = model.Params();
  for (const auto& param : params)
    Say(absl::StrCat("LOCAL ", rank, " ", param->Describe()));

  Sequential whole = MakeMlp(sizes, model_seed);
  ExpectShardsOf(params, Values(whole.Params()));
  ReferenceRun reference = TrainReference(whole, data_seed, steps, batch, lr);

  torch::optim::SGD optimizer(model.Leaves(), torch::optim::SGDOptions(lr));
  for (int step = 0; step < steps; ++step) {
    Batch data = SyntheticBatch(data_seed, step, batch, sizes.front(), sizes.back());
    optimizer.zero_grad();
    at::Tensor output = model.Forward(data.input);
    if (output.sizes().vec() != std::vector<int64_t>{batch, sizes.back()}) {
      Fail("output shape " + c10::str(output.sizes()));
    }
    at::Tensor loss = MseLoss(output, data.target);
    loss.backward();
    optimizer.step();
    CheckStep(rank, step, loss.item<double>(), reference.losses[step]);
  }
  ExpectFinalParams(params, reference.final_params);
  Barrier(setup.tp);
  Say(absl::StrCat("DONE rank ", rank));
  return 0;
}
