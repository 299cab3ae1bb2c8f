// Pipeline-parallel MLP training vs single-process training, run under the
// launcher on a 1-D mesh ("pp") of the whole world:
//   meshrun --standalone --nproc-per-node=4 --no-python pp_mlp_worker
//       --schedule 1f1b --microbatches 8 --steps 10
// (--schedule interleaved --virtual-stages V: each rank holds V stages.)
// Every rank builds MakeMlp(sizes, seed) whole, trains a copy of it alone
// (the reference), cuts the other into pipeline stages (MakeStage) and trains
// its stage with RunStep on the same batches. Checks on every rank every
// step's loss (broadcast from the last stage) and, at the end, its stage's
// params against the reference's corresponding layers (rtol 1e-5), and on
// the last stage the output shape. Prints "STAGE <describe>" per rank,
// "step N loss X" on rank 0 and "DONE <rank>"; a mismatch prints "FAIL ..."
// and exits 1.
//
// A step that RunStep refuses (INVALID_ARGUMENT, e.g. 1F1B with fewer
// microbatches than stages) prints "ERROR rank <r>: <message>" and exits
// kRefusedExit, on every rank alike.

#include <torch/optim/sgd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/integration/parallel/parity_harness.h"
#include "worker_lib/device_mesh.h"
#include "worker_lib/parallel/data.h"
#include "worker_lib/parallel/pp.h"

namespace {

using namespace meshrun::worker::parallel;           // NOLINT
using namespace meshrun::worker::parallel::testing;  // NOLINT

constexpr int kRefusedExit = 3;

void Say(const std::string& line) { std::cout << line + "\n" << std::flush; }

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("Pipeline-parallel MLP parity worker");
  std::vector<int64_t> sizes{50, 50, 50, 50, 4};
  std::string schedule_name = "gpipe";
  int microbatches = 4;
  int virtual_stages = 1;
  std::vector<int> split_points;
  int steps = 10;
  int64_t batch = 32;
  double lr = 0.05;
  uint64_t model_seed = 3;
  uint64_t data_seed = 11;
  app.add_option("--sizes", sizes)->delimiter(',');
  app.add_option("--schedule", schedule_name);
  app.add_option("--microbatches", microbatches);
  app.add_option("--virtual-stages", virtual_stages);
  app.add_option("--split-points", split_points)->delimiter(',');
  app.add_option("--steps", steps);
  app.add_option("--batch", batch);
  app.add_option("--lr", lr);
  app.add_option("--model-seed", model_seed);
  app.add_option("--data-seed", data_seed);
  CLI11_PARSE(app, argc, argv);
  const Schedule schedule = ValueOrFail(ParseSchedule(schedule_name), "--schedule");

  auto world = ValueOrFail(meshrun::worker::InitProcessGroup("gloo"), "init");
  auto mesh = ValueOrFail(
      meshrun::worker::InitDeviceMesh(world, "cpu", {world->size()}, {{"pp"}}), "mesh");
  ProcessGroupPtr pp = ValueOrFail(mesh.GetGroup("pp"), "pp group");
  const int rank = world->rank();

  PipelineStage stage =
      ValueOrFail(MakeStage(MakeMlp(sizes, model_seed), pp, split_points, virtual_stages),
                  "MakeStage");
  Say(absl::StrCat("STAGE rank ", rank, " ", stage.Describe()));

  Sequential whole = MakeMlp(sizes, model_seed);
  ReferenceRun reference = TrainReference(whole, data_seed, steps, batch, lr);

  // The last stage also checks the pipeline's output shape, once.
  bool checked_shape = false;
  LossFn loss_fn = [&](const at::Tensor& output, const at::Tensor& target) {
    if (!checked_shape) {
      const std::vector<int64_t> want{batch / microbatches, sizes.back()};
      if (output.sizes().vec() != want) Fail("output shape " + c10::str(output.sizes()));
      Say(absl::StrCat("OUTPUT rank ", rank, " microbatch output ",
                       c10::str(output.sizes())));
      checked_shape = true;
    }
    return MseLoss(output, target);
  };

  torch::optim::SGD optimizer(stage.Leaves(), torch::optim::SGDOptions(lr));
  for (int step = 0; step < steps; ++step) {
    Batch data = SyntheticBatch(data_seed, step, batch, sizes.front(), sizes.back());
    optimizer.zero_grad();
    absl::StatusOr<double> loss = RunStep(
        stage, schedule, microbatches, stage.is_first() ? data.input : at::Tensor(),
        stage.is_last() ? data.target : at::Tensor(), loss_fn);
    if (loss.status().code() == absl::StatusCode::kInvalidArgument) {
      std::cerr << absl::StrCat("ERROR rank ", rank, ": ", loss.status().message(), "\n")
                << std::flush;
      return kRefusedExit;
    }
    const double value = ValueOrFail(loss, absl::StrCat("step ", step));
    optimizer.step();
    ExpectClose(absl::StrCat("step ", step, " loss"), value, reference.losses[step]);
    if (rank == 0) {
      char line[64];
      std::snprintf(line, sizeof line, "step %d loss %.9g", step, value);
      Say(line);
    }
  }

  // This rank's params are the reference's params of the same layers.
  std::vector<std::shared_ptr<Param>> reference_params;
  for (int chunk = 0; chunk < stage.virtual_stages(); ++chunk) {
    for (int i = stage.layer_begin(chunk); i < stage.layer_end(chunk); ++i) {
      for (const auto& param : whole.layers[i]->Params())
        reference_params.push_back(param);
    }
  }
  const auto params = stage.Params();
  if (params.size() != reference_params.size()) {
    Fail(absl::StrCat("stage has ", params.size(), " params, reference layers ",
                      reference_params.size()));
  }
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i]->name() != reference_params[i]->name()) {
      Fail(params[i]->name() + " vs reference " + reference_params[i]->name());
    }
    ExpectClose(params[i]->name() + " final", params[i]->data(),
                reference_params[i]->data());
    Say(absl::StrCat("PARAM rank ", rank, " ", params[i]->name(), " matches"));
  }
  Say(absl::StrCat("DONE ", rank));
  return 0;
}
