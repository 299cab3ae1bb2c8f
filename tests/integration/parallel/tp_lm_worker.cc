// Tensor-parallel transformer LM training vs single-process training, under
// the launcher on a 1-D mesh ("tp") of the whole world:
//   meshrun --standalone --nproc-per-node=2 --no-python tp_lm_worker --steps 10
// Every rank builds TransformerLm::Make(config, seed) twice: one copy trains
// alone (the reference: whole layers, at::embedding, at::cross_entropy), the
// other is parallelised (vocab-parallel embedding, heads split, MLP col ->
// row, column-parallel head with vocab-split logits, vocab-parallel
// cross-entropy) and trains on the same batches. Checks the initial shards,
// every step's loss, and the gathered final params (FullTensor) against the
// reference (rtol 1e-5). Prints "LOCAL <rank> <param>", "step N loss X" on
// rank 0 and "DONE rank <r>"; a mismatch prints "FAIL ..." and exits 1.
//
// With --expect-error TEXT, Parallelize must fail with a message containing
// TEXT ("ERROR <rank> <message>") and leave the model whole.

#include <torch/optim/sgd.h>

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/integration/parallel/tp_worker_support.h"
#include "worker_lib/parallel/transformer.h"

namespace {

using namespace meshrun::worker::parallel;           // NOLINT
using namespace meshrun::worker::parallel::testing;  // NOLINT

// The single-process reference: SGD on the whole model.
ReferenceRun TrainWhole(TransformerLm& lm, uint64_t data_seed, int steps, int64_t batch,
                        double lr) {
  const TransformerConfig& c = lm.config();
  torch::optim::SGD optimizer(lm.model().Leaves(), torch::optim::SGDOptions(lr));
  ReferenceRun run;
  for (int step = 0; step < steps; ++step) {
    TokenBatch data = SyntheticTokens(data_seed, step, batch, c.seq, c.vocab);
    optimizer.zero_grad();
    at::Tensor loss = lm.Loss(data.tokens, data.targets);
    loss.backward();
    optimizer.step();
    run.losses.push_back(loss.item<double>());
  }
  run.final_params = Values(lm.model().Params());
  return run;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("Tensor-parallel transformer LM parity worker");
  TransformerConfig config;
  int steps = 10;
  int64_t batch = 4;
  double lr = 0.5;
  uint64_t model_seed = 5;
  uint64_t data_seed = 17;
  std::string expect_error;
  app.add_option("--vocab", config.vocab);
  app.add_option("--d-model", config.d_model);
  app.add_option("--heads", config.heads);
  app.add_option("--d-ff", config.d_ff);
  app.add_option("--layers", config.layers);
  app.add_option("--seq", config.seq);
  app.add_option("--steps", steps);
  app.add_option("--batch", batch);
  app.add_option("--lr", lr);
  app.add_option("--expect-error", expect_error);
  CLI11_PARSE(app, argc, argv);

  TpSetup setup = InitTpMesh();
  const int rank = setup.world->rank();

  TransformerLm lm = TransformerLm::Make(config, model_seed);
  absl::Status parallelized = lm.Parallelize("tp", setup.tp);
  if (!expect_error.empty()) {
    ExpectRefused(parallelized, expect_error, lm.model().Params(), setup.tp, rank);
    return 0;
  }
  CheckOk(parallelized, "Parallelize");
  if (rank == 0) {
    for (const auto& layer : lm.model().layers) Say("LAYER " + layer->Describe());
  }
  const auto params = lm.model().Params();
  for (const auto& param : params)
    Say(absl::StrCat("LOCAL ", rank, " ", param->Describe()));

  TransformerLm whole = TransformerLm::Make(config, model_seed);
  ExpectShardsOf(params, Values(whole.model().Params()));
  ReferenceRun reference = TrainWhole(whole, data_seed, steps, batch, lr);
  if (!(reference.losses.back() < reference.losses.front())) {
    Fail("the reference loss did not decrease: " +
         std::to_string(reference.losses.front()) + " -> " +
         std::to_string(reference.losses.back()));
  }

  torch::optim::SGD optimizer(lm.model().Leaves(), torch::optim::SGDOptions(lr));
  for (int step = 0; step < steps; ++step) {
    TokenBatch data = SyntheticTokens(data_seed, step, batch, config.seq, config.vocab);
    optimizer.zero_grad();
    at::Tensor logits = lm.Forward(data.tokens);
    const std::vector<int64_t> want{batch, config.seq,
                                    config.vocab / setup.tp->getSize()};
    if (logits.sizes().vec() != want) Fail("logits shape " + c10::str(logits.sizes()));
    at::Tensor loss = lm.LossOfLogits(logits, data.targets);
    loss.backward();
    optimizer.step();
    CheckStep(rank, step, loss.item<double>(), reference.losses[step]);
  }
  ExpectFinalParams(params, reference.final_params);
  Barrier(setup.tp);
  Say(absl::StrCat("DONE rank ", rank));
  return 0;
}
