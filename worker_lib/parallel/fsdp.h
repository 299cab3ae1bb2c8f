#pragma once

// Fully sharded data parallelism, per parameter (FSDP2's fully_shard): each
// parameter's local tensor is split along dim 0 over a mesh dimension
// (torch.chunk semantics, every chunk zero-padded to the first chunk's size
// so that collectives see equal shapes); the optimizer holds and updates
// only the chunk. A layer computes with the parameter all-gathered back
// (Param::Compute()), whose backward reduce-scatters the full gradient,
// averaged over the group, into the chunk's grad.
//
//   FullyShard(model, "fsdp", mesh["fsdp"]->GetGroup().value());  // in place
//   torch::optim::SGD optimizer(model.Leaves(), lr);               // the shards
//   loss = MseLoss(model.Forward(x), y); loss.backward(); optimizer.step();
//
// Params already sharded by TP (Param::Shard) are sharded again on dim 0 of
// their TP-local tensor; the step order (TP, then FSDP) is recorded, so
// FullTensor() reassembles in the right order.
//
// Resharding (the unit is a layer). FullyShard(Sequential&) wraps every layer
// that has params in an FsdpLayer, FSDP2's module hooks done as a wrapper:
//   - before the layer's forward: all-gather its params (Unshard);
//   - after it, with reshard_after_forward (default): free the gathered
//     storage (Reshard), and put an identity autograd function on the layer's
//     output whose backward all-gathers again, into the same storage, before
//     any of the layer's backward nodes run (they wait for its gradient);
//   - each param's all-gather node reduce-scatters its gradient in backward
//     and, once every forward that used the gathered tensor has been
//     backpropagated, frees the storage again (reshard after backward).
// The gathered tensor autograd saved is the same storage throughout; it is
// resized to 0 bytes and back, as PyTorch's FSDP does, so between forward and
// backward only the shard is resident. Trade-offs: one extra all-gather per
// layer in backward (PyTorch's cost too); a saved tensor whose storage is
// freed must not be read outside these hooks (e.g. by a forward hook of your
// own, or after a backward with retain_graph that then runs backward again
// without a forward); a layer must compute with its params only inside
// Forward(). With reshard_after_forward=false the gathered storage stays
// alive from forward until the last backward that needs it: more memory,
// one all-gather fewer. Forwards without grad mode always reshard at once.
//
// A Param sharded alone (FullyShard(Param&)) has no layer around it: it is
// all-gathered at Compute() and resharded after its backward (as with
// reshard_after_forward=false); wrap its layer with FullyShardLayer to get
// resharding after forward.
//
// Collective: forward and backward all-gather / reduce-scatter over the
// group, so every member runs the same layers in the same order. Setup
// (FullyShard) is not collective. Not thread-safe. A Param must outlive the
// backward of every graph its Compute() took part in.

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker_lib/parallel/layers.h"
#include "worker_lib/parallel/param.h"

namespace meshrun::worker::parallel {

struct FsdpOptions {
  // Free the all-gathered params after each layer's forward and gather them
  // again in backward (FSDP2's reshard_after_forward=True).
  bool reshard_after_forward = true;
};

// The FSDP state of one parameter: its materializer (Param::Compute()).
class FsdpParam : public ParamMaterializer {
 public:
  FsdpParam(Param& param, ProcessGroupPtr group, int64_t rows, FsdpOptions options);

  // Differentiable w.r.t. param.data(): the gathered, unpadded local tensor.
  // Gathers first if resharded. In grad mode, its backward reduce-scatters.
  at::Tensor Compute(Param& param) override;

  // All-gathers the shards into the unsharded storage unless it holds them
  // already. Collective over the group.
  void Unshard();
  // Frees the unsharded storage. Local.
  void Reshard();

  bool unsharded() const;
  // Bytes of unsharded (gathered) storage alive on this rank: 0 when resharded.
  size_t unsharded_bytes() const;
  const FsdpOptions& options() const { return options_; }
  const ProcessGroupPtr& group() const { return group_; }

  // For the autograd function (fsdp.cc): grad of the gathered tensor ->
  // grad of the shard, and the bookkeeping of pending backwards.
  at::Tensor ReduceScatterGrad(const at::Tensor& full_grad);
  void BackwardDone();
  // A new tensor over the unsharded storage, unpadded (no autograd history).
  at::Tensor UnshardedAlias() const;

 private:
  Param& param_;
  ProcessGroupPtr group_;
  FsdpOptions options_;
  int64_t rows_;         // the unsharded local tensor's dim 0
  int64_t padded_rows_;  // every shard's dim 0 (with padding)
  // [group size * padded_rows_, ...]: the shards side by side. Its storage
  // is resized to 0 bytes when resharded.
  at::Tensor buffer_;
  size_t buffer_nbytes_;
  int pending_backwards_ = 0;
};

// Shards `param` on dim 0 of its local tensor over `group` (mesh dimension
// `mesh_dim`): keeps chunk group.rank of group.size, zero-padded; installs an
// FsdpParam. Not collective. Errors: a 0-D or empty parameter, one already
// FSDP-sharded.
absl::Status FullyShard(Param& param, const std::string& mesh_dim, ProcessGroupPtr group,
                        FsdpOptions options = {});

// The FSDP state of `param`, or null if it is not FSDP-sharded.
FsdpParam* FsdpStateOf(const Param& param);

// A layer whose params are FSDP-sharded, with FSDP's forward and backward
// hooks (see the file comment). Params()/Describe() are the inner layer's.
class FsdpLayer : public Layer {
 public:
  FsdpLayer(LayerPtr inner, std::vector<FsdpParam*> states, FsdpOptions options);

  at::Tensor Forward(const at::Tensor& input) override;
  std::vector<std::shared_ptr<Param>> Params() const override { return inner_->Params(); }
  std::string Describe() const override { return "FSDP(" + inner_->Describe() + ")"; }

  const LayerPtr& inner() const { return inner_; }
  // Collective; used by the pre-backward hook.
  void UnshardAll();
  void ReshardAll();
  size_t unsharded_bytes() const;

 private:
  LayerPtr inner_;
  std::vector<FsdpParam*> states_;  // owned by the params (materializers)
  FsdpOptions options_;
};

// FullyShard on every param of `layer`, and the FsdpLayer wrapping it.
absl::StatusOr<LayerPtr> FullyShardLayer(LayerPtr layer, const std::string& mesh_dim,
                                         ProcessGroupPtr group, FsdpOptions options = {});

// FullyShardLayer on every layer of `model` that has params, in place.
absl::Status FullyShard(Sequential& model, const std::string& mesh_dim,
                        ProcessGroupPtr group, FsdpOptions options = {});

// Bytes of unsharded parameter storage alive in `model`'s FSDP params.
size_t UnshardedBytes(const Sequential& model);

}  // namespace meshrun::worker::parallel
