#pragma once

// FSDP2's fully_shard on the user's own libtorch module (torch::nn::Module):
// blocks first, then the root, as in PyTorch 2; the model calls each unit
// through Forward (module_hooks.h), which runs the unit's lifecycle:
//
//   for (auto& block : *model->blocks) CheckOk(FullyShard(*block, "fsdp", group));
//   CheckOk(FullyShard(*model, "fsdp", group));
//   torch::optim::AdamW optimizer(model->parameters(), options);  // the shards
//   // in the model's forward: x = parallel::Forward(block, x);
//   loss = parallel::Forward(model, x) ...; loss.backward(); optimizer.step();
//
// Each call makes one FSDP unit of the parameters of `module` (its own and
// its submodules') that no earlier call took: one flat all-gather and one
// flat reduce-scatter per unit and dtype (FsdpParamGroup, fsdp.h). After the
// call:
//   - module.parameters() are the shards: dim-0 chunks (torch.chunk's rows,
//     zero-padded at the end to the first chunk's rows), leaves that the
//     optimizer steps, so its state is sharded too; their grads are the
//     averaged, reduce-scattered ones, there when backward() returns;
//   - the tensors the module computes with (its members, e.g. a Linear's
//     `weight`) keep their full shape; their storage holds the gathered
//     values only while the unit is gathered, and is empty (0 bytes)
//     otherwise: an operator on them then fails (ATen's "data is not
//     allocated"), so a unit called without Forward is never silently wrong.
//
// The lifecycle is FSDP2's, on explicit events, with no process-wide state
// (the units of one model share a context owned by their modules' hooks):
//   - pre-forward: the first unit whose forward starts (the iteration's
//     root) settles the last iteration (a backward that threw: its
//     collectives waited for and dropped, its unreduced grads dropped);
//     the unit is gathered (waiting for its prefetch), the unit that came
//     next in the last iteration's forward is prefetched, and its inputs
//     get the post-backward function;
//   - post-forward: resharded, unless it is the root or reshard_after_forward
//     is off, and kept for backward only if its outputs need a gradient (a
//     forward under no_grad frees every unit, the root included); the
//     outputs get the pre-backward hook;
//   - pre-backward (the first output gradient reached): gathered again,
//     the unit before it in post-forward order prefetched; the first one of
//     a backward queues the final callback;
//   - post-backward (once the gradients of all the unit's inputs are
//     computed, so after its own backward): the grads its parameters have
//     are reduce-scattered (one in flight, as FSDP2), the unit resharded;
//   - the final callback: the post-backward of units whose inputs needed no
//     gradient (the root's token ids) and of grads that came later, then the
//     last reduce-scatter's wait.
// Frozen or unused parameters change nothing: the post-backward comes from
// the inputs. Several forwards before a backward (gradient accumulation)
// gather per forward and reduce-scatter the grads a post-backward finds,
// as FSDP2 does. A forward run again inside backward (activation
// checkpointing) gathers what it needs and resharding is left to the
// post-backward.
//
// A weight tied across units (a parameter registered in a module whose
// unit came after the one that took it) stays one parameter (that unit's
// shard, registered in both places); the later unit gathers the owner too
// for its forward and backward, and its gradient, summed once by
// autograd, is reduce-scattered when it is complete.
//
// Writes: a write to a module's full tensor while its unit is gathered
// (custom init or a load under no_grad, inside Gathered below) is copied
// into the shard when the unit is resharded; outside, the storage is empty
// and the write fails. A shard changed while its unit is gathered (the
// optimizer's step) is seen by its version counter and gathered again.
//
// Collective: every rank of `group` runs the same forwards and backwards.
// Setup is not collective and expects identical parameters on every rank
// (same seed), as fully_shard does. One model is used by one thread at a
// time; different models from different threads are independent.

#include <torch/nn/module.h>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "worker_lib/parallel/fsdp.h"
#include "worker_lib/parallel/module_hooks.h"
#include "worker_lib/parallel/module_params.h"
#include "worker_lib/parallel/param.h"

namespace meshrun::worker::parallel {

// Shards the parameters of `module` not taken by an earlier FullyShard over
// `group` (mesh dimension `mesh_dim`) as one unit. Errors (nothing changed
// then): no group, a 0-d or empty parameter, a module with nothing left to
// shard that contains no unit either, a module that is a unit already.
absl::Status FullyShard(torch::nn::Module& module, const std::string& mesh_dim,
                        ProcessGroupPtr group, FsdpOptions options = {});

// ShardedParams (module_params.h) lists the shards with their Params.

// While alive, every unit of `module` and its submodules is gathered, so
// the modules' own tensors hold the full values: read them, or write them
// under no_grad (a custom init, loading pretrained weights); what was
// written is copied into the shards at the end (FSDP1's
// summon_full_params(writeback=True)). Collective (all-gathers) over every
// rank; not during a forward or backward.
class Gathered {
 public:
  explicit Gathered(torch::nn::Module& module);
  ~Gathered();
  Gathered(const Gathered&) = delete;
  Gathered& operator=(const Gathered&) = delete;

 private:
  std::vector<std::shared_ptr<ForwardHook>> units_;
};

// Bytes of gathered (full) parameter storage alive in the units of `module`
// and its submodules: 0 between steps.
size_t UnshardedBytes(const torch::nn::Module& module);

// How the units of `module` and its submodules were gathered so far: every
// gather, and those whose all-gather a prefetch had already issued; and the
// collectives they issued (one per unit and dtype each, prefetches that were
// never waited for included).
struct GatherCounts {
  int gathers = 0;
  int prefetched = 0;
  int all_gathers = 0;
  int reduce_scatters = 0;
};
GatherCounts CountGathers(const torch::nn::Module& module);

}  // namespace meshrun::worker::parallel
