#pragma once

// FSDP2's fully_shard on the user's own libtorch module (torch::nn::Module):
// blocks first, then the root, as in PyTorch 2.
//
//   for (auto& block : *model->blocks) CheckOk(FullyShard(*block, "fsdp", group));
//   CheckOk(FullyShard(*model, "fsdp", group));
//   torch::optim::AdamW optimizer(model->parameters(), options);  // the shards
//   loss = model->forward(x) ...; loss.backward(); optimizer.step();
//
// Each call makes one FSDP unit of the parameters of `module` (its own and
// its submodules') that no earlier call took: one flat all-gather and one
// flat reduce-scatter per unit and dtype (FsdpParamGroup, fsdp.h: flat
// buffers, prefetch, reduce-scatter during backward). After the call:
//   - module.parameters() are the shards: dim-0 chunks (torch.chunk's rows,
//     zero-padded at the end to the first chunk's rows), leaves that the
//     optimizer steps, so its state is sharded too; their grads are the
//     averaged, reduce-scattered ones, there when backward() returns;
//   - the tensors the module computes with (its members, e.g. a Linear's
//     `weight`) keep their full shape; their storage holds the gathered
//     values only while needed, and is empty (0 bytes) otherwise.
//
// libtorch modules have no forward hooks, so the units' hooks are
// first-touch hooks on that storage (first_touch.h): the first operator
// that reads a unit's parameter in forward or in backward gathers the unit
// (waiting for its all-gather if prefetched) before it runs. In forward,
// that also issues the all-gather of the unit that came next in the
// previous forward (prefetch) and, with reshard_after_forward, frees the
// unit touched before it, unless that is the root (the unit no other unit's
// module contains; FSDP2 keeps the root's parameters after forward too). In
// backward it issues the all-gather of the unit before it in forward order.
// A unit's gradients are reduce-scattered once every parameter it used in
// forward has its gradient (post-accumulate-grad hooks on the full-shape
// tensors), and the unit is freed then; at the end of backward whatever is
// left is. A unit used again after it was freed (a tied weight, a block
// called twice) is simply gathered again. A shard changed while its unit
// is gathered (the optimizer's step, a load) is seen by its version counter
// and gathered again at the next touch.
//
// Limits: grad accumulation over several forwards before their backwards
// is correct but reduce-scatters and gathers more often than FSDP2 would;
// code that reads a parameter through model->named_parameters() inside
// forward sees the shard. With RecordFunction turned off
// (at::RecordFunctionGuard(false)) nothing is gathered.
//
// Collective: every rank of `group` runs the same forwards and backwards.
// Setup is not collective and expects identical parameters on every rank
// (same seed), as fully_shard does. Not thread-safe.

#include <torch/nn/module.h>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "worker_lib/parallel/fsdp.h"
#include "worker_lib/parallel/module_params.h"
#include "worker_lib/parallel/param.h"

namespace meshrun::worker::parallel {

// Shards the parameters of `module` not taken by an earlier FullyShard over
// `group` (mesh dimension `mesh_dim`) as one unit. Errors (nothing changed
// then): no group, a 0-d or empty parameter, a module with nothing left to
// shard that contains no unit either.
absl::Status FullyShard(torch::nn::Module& module, const std::string& mesh_dim,
                        ProcessGroupPtr group, FsdpOptions options = {});

// ShardedParams (module_params.h) lists the shards with their Params.

// Bytes of gathered (full) parameter storage alive in the units of `module`
// and its submodules: 0 between steps.
size_t UnshardedBytes(const torch::nn::Module& module);

// How the units of `module` and its submodules were gathered so far: every
// gather, and those whose all-gather a prefetch had already issued.
struct GatherCounts {
  int gathers = 0;
  int prefetched = 0;
};
GatherCounts CountGathers(const torch::nn::Module& module);

}  // namespace meshrun::worker::parallel
