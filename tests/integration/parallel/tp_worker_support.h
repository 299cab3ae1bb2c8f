#pragma once

// Shared by the tensor-parallel parity workers (tp_mlp_worker, tp_lm_worker):
// a 1-D "tp" mesh over the whole world, the check that each parallelised
// param holds its box of the whole model's initial value, the check that a
// refused parallelisation left the model whole, and the printed step lines.

#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/integration/parallel/parity_harness.h"
#include "worker_lib/device_mesh.h"
#include "worker_lib/parallel/param.h"

namespace meshrun::worker::parallel::testing {

inline void Say(const std::string& line) { std::cout << line + "\n" << std::flush; }

struct TpSetup {
  std::shared_ptr<World> world;
  ProcessGroupPtr tp;
};
// The process group and a 1-D mesh named "tp" over the whole world.
inline TpSetup InitTpMesh() {
  TpSetup setup;
  setup.world = ValueOrFail(InitProcessGroup("gloo"), "init");
  auto mesh = ValueOrFail(
      InitDeviceMesh(setup.world, "cpu", {setup.world->size()}, {{"tp"}}), "mesh");
  setup.tp = ValueOrFail(mesh.GetGroup("tp"), "tp group");
  return setup;
}

// Waits for every rank of `group`. Before a worker exits: a rank leaving while
// a peer is still finishing the group's Gloo rendezvous makes that peer's
// InitProcessGroup fail ("Connection closed by peer").
inline void Barrier(const ProcessGroupPtr& group) { group->barrier()->wait(); }

// For a run that expects `status` to be an error containing `expected`:
// fails otherwise, or if any of `params` was sharded; prints "ERROR <rank>
// <message>" and "DONE rank <r>" after a barrier over `tp`.
inline void ExpectRefused(const absl::Status& status, const std::string& expected,
                          const std::vector<std::shared_ptr<Param>>& params,
                          const ProcessGroupPtr& tp, int rank) {
  if (status.ok()) Fail("parallelisation accepted the model");
  const std::string message(status.message());
  if (message.find(expected) == std::string::npos) {
    Fail("error '" + message + "' does not contain '" + expected + "'");
  }
  for (const auto& param : params) {
    if (!param->steps().empty()) Fail(param->name() + " was sharded on error");
  }
  Barrier(tp);
  Say(absl::StrCat("ERROR ", rank, " ", message));
  Say(absl::StrCat("DONE rank ", rank));
}

// Every param of the parallel model holds exactly its box of the whole
// model's `initial` values (same order).
inline void ExpectShardsOf(const std::vector<std::shared_ptr<Param>>& params,
                           const std::vector<at::Tensor>& initial) {
  if (params.size() != initial.size()) Fail("param count differs from the whole model");
  for (size_t i = 0; i < params.size(); ++i) {
    const Box box = params[i]->box();
    at::Tensor expected = initial[i];
    for (size_t d = 0; d < box.sizes.size(); ++d) {
      expected = expected.narrow(static_cast<int64_t>(d), box.offsets[d], box.sizes[d]);
    }
    ExpectClose(params[i]->name() + " initial shard", params[i]->data(), expected, 0);
  }
}

// Copies of the params' values (of a whole model: the full tensors).
inline std::vector<at::Tensor> Values(const std::vector<std::shared_ptr<Param>>& params) {
  std::vector<at::Tensor> values;
  for (const auto& param : params) values.push_back(param->data().detach().clone());
  return values;
}

// Gathered final params equal the reference's (rtol 1e-5).
inline void ExpectFinalParams(const std::vector<std::shared_ptr<Param>>& params,
                              const std::vector<at::Tensor>& reference) {
  for (size_t i = 0; i < params.size(); ++i) {
    ExpectClose(params[i]->name() + " final (FullTensor)", FullTensor(*params[i]),
                reference[i]);
  }
}

// The step's loss equals the reference's; rank 0 prints "step N loss X".
inline void CheckStep(int rank, int step, double loss, double reference) {
  ExpectClose(absl::StrCat("step ", step, " loss"), loss, reference);
  if (rank == 0) {
    char line[64];
    std::snprintf(line, sizeof line, "step %d loss %.9g", step, loss);
    Say(line);
  }
}

}  // namespace meshrun::worker::parallel::testing
