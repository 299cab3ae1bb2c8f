#pragma once

// Fully sharded data parallelism (FSDP2's fully_shard): each parameter's
// local tensor is split along dim 0 over a mesh dimension (torch.chunk
// semantics, every chunk zero-padded to the first chunk's size so that
// collectives see equal shapes); the optimizer holds and updates only the
// chunk. A layer computes with the parameter all-gathered back
// (Param::Compute()), and the full gradient, averaged over the group, is
// reduce-scattered into the chunk's grad.
//
//   FullyShard(model, "fsdp", mesh["fsdp"]->GetGroup().value());  // in place
//   torch::optim::SGD optimizer(model.Leaves(), lr);               // the shards
//   loss = MseLoss(model.Forward(x), y); loss.backward(); optimizer.step();
//
// Params already sharded by TP (Param::Shard) are sharded again on dim 0 of
// their TP-local tensor; the step order (TP, then FSDP) is recorded, so
// FullTensor() reassembles in the right order.
//
// Parameter groups (FSDP2's FSDPParamGroup): the params of one layer (of
// one dtype) are gathered by ONE all-gather into one flat buffer and their
// grads reduce-scattered by ONE reduce-scatter of one flat buffer
// (flat_layout.h has the layout), instead of a collective per param: on
// Gloo a collective's fixed cost dominates these sizes. The gathered values
// are copied out of the flat buffer into each param's own unsharded tensor
// (a param's rows from every rank are not contiguous there).
//
// Resharding and prefetching (the unit is a layer). FullyShard(Sequential&)
// wraps every layer that has params in an FsdpLayer, FSDP2's module hooks
// done as a wrapper:
//   - before the layer's forward: wait for its all-gather (Unshard), then
//     issue the next FSDP layer's all-gather, so that it runs while this
//     layer computes (forward prefetch);
//   - after it, with reshard_after_forward (default): free the gathered
//     storage (Reshard), and put an identity autograd function on the layer's
//     output whose backward gathers again, into the same storage, before any
//     of the layer's backward nodes run (they wait for its gradient), and
//     issues the previous FSDP layer's all-gather (backward prefetch);
//   - once the backward of every forward that used a group's gathered params
//     has delivered their grads, the group's reduce-scatter is issued and the
//     gathered storage freed (reshard after backward). The reduce-scatter
//     runs while backward goes on; it is waited for, and the shard grads
//     assigned, when the next group issues its own or at the end of the
//     backward pass (an autograd engine callback), whichever comes first. A
//     group whose grads came only from some of its forwards (another
//     microbatch's graph still pending) reduce-scatters what it has at the
//     end of that backward, as before.
// The gathered tensor autograd saved is the same storage throughout; it is
// resized to 0 bytes and back, as PyTorch's FSDP does, so between forward and
// backward only the shard is resident. Trade-offs: one extra all-gather per
// layer in backward (PyTorch's cost too); up to two layers gathered at once
// (prefetch) plus one flat buffer in flight; a saved tensor whose storage is
// freed must not be read outside these hooks (e.g. by a forward hook of your
// own, or after a backward with retain_graph that then runs backward again
// without a forward); a layer must compute with its params only inside
// Forward(). With reshard_after_forward=false the gathered storage stays
// alive from forward until the last backward that needs it: more memory,
// one all-gather fewer. Forwards without grad mode always reshard at once.
//
// Gradients: the shard grads are written to data().grad() by the group
// (assigned, or added in place when one is there), not by autograd's
// AccumulateGrad: autograd sees no gradient flowing into data() (so
// torch::autograd::grad w.r.t. a shard, or a hook on its AccumulateGrad,
// sees none); they are there when backward() returns.
//
// A Param sharded alone (FullyShard(Param&)) is a group of its own with no
// layer around it: it is all-gathered at Compute() and resharded after its
// backward (as with reshard_after_forward=false); wrap its layer with
// FullyShardLayer to get resharding after forward.
//
// Collective: forward and backward all-gather / reduce-scatter over the
// group, so every member runs the same layers in the same order. Setup
// (FullyShard) is not collective. Not thread-safe. A Param must outlive the
// backward of every graph its Compute() took part in, and the params of one
// layer live and die together.

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker_lib/parallel/flat_layout.h"
#include "worker_lib/parallel/layers.h"
#include "worker_lib/parallel/param.h"

namespace meshrun::worker::parallel {

struct FsdpOptions {
  // Free the all-gathered params after each layer's forward and gather them
  // again in backward (FSDP2's reshard_after_forward=True).
  bool reshard_after_forward = true;
};

class FsdpParamGroup;

// The FSDP state of one parameter: its materializer (Param::Compute()) and
// its unsharded storage. Owned by the Param; shares ownership of its group.
class FsdpParam : public ParamMaterializer {
 public:
  // `rows`: the unsharded local tensor's dim 0.
  FsdpParam(Param& param, int64_t rows);

  // Differentiable w.r.t. param.data() (see the file comment for where its
  // gradient goes): the gathered, unpadded local tensor. Gathers the group
  // first if resharded.
  at::Tensor Compute(Param& param) override;

  Param& param() const { return param_; }
  int64_t rows() const { return rows_; }
  FsdpParamGroup& group() const { return *group_; }

  bool unsharded() const;
  // Bytes of unsharded (gathered) storage alive on this rank: 0 when resharded.
  size_t unsharded_bytes() const;

  // For FsdpParamGroup (fsdp.cc): the unsharded storage, [parts *
  // padded_rows, ...]; allocated and freed in place, so tensors over it see
  // the refill.
  void JoinGroup(std::shared_ptr<FsdpParamGroup> group, size_t index, int64_t parts,
                 int64_t padded_rows);
  size_t index() const { return index_; }
  const at::Tensor& unsharded_buffer() const { return buffer_; }
  void AllocateUnsharded();
  void FreeUnsharded();
  // A new tensor over the unsharded storage, unpadded (no autograd history).
  at::Tensor UnshardedAlias() const;

  // Called (during backward) once the group has written this param's shard
  // grad, since autograd's AccumulateGrad hooks never see it: HSDP's
  // DataParallel starts its replicate all-reduce from here. Empty: none.
  void set_shard_grad_hook(std::function<void()> hook) {
    shard_grad_hook_ = std::move(hook);
  }
  void RunShardGradHook() const {
    if (shard_grad_hook_) shard_grad_hook_();
  }

 private:
  Param& param_;
  int64_t rows_;
  std::shared_ptr<FsdpParamGroup> group_;
  size_t index_ = 0;
  at::Tensor buffer_;
  size_t buffer_nbytes_ = 0;
  std::function<void()> shard_grad_hook_;
};

// The params of one FSDP unit (a layer's, of one dtype): one flat all-gather,
// one flat reduce-scatter. See the file comment.
class FsdpParamGroup : public std::enable_shared_from_this<FsdpParamGroup> {
 public:
  // `params` must share a dtype and stay alive as long as this group is used.
  FsdpParamGroup(std::vector<FsdpParam*> params, ProcessGroupPtr group,
                 FsdpOptions options);

  // Issues the all-gather unless the params are gathered or it is in
  // flight (asynchronous). Collective over the group.
  void StartUnshard();
  // Gathers the params (StartUnshard, then wait and copy out). Collective.
  void Unshard();
  // Frees the gathered storage (waiting first for an all-gather in flight).
  void Reshard();

  bool unsharded() const { return unsharded_; }
  // Gathered storage alive: the params' and an all-gather's in flight.
  size_t unsharded_bytes() const;
  const FsdpOptions& options() const { return options_; }
  const ProcessGroupPtr& process_group() const { return group_; }
  const FlatShardLayout& layout() const { return layout_; }

  // For the autograd functions (fsdp.cc). A forward in grad mode used a
  // member (its backward is pending); one such backward delivered the
  // gradient of member `index`'s gathered tensor (undefined: zeros).
  void AddUse();
  void GradReady(size_t index, const at::Tensor& full_grad);
  // Issues the reduce-scatter of the grads delivered so far (if any),
  // after finishing the one in flight, if any; frees the gathered storage
  // when no backward is pending. Collective.
  void StartReduceScatter();
  // Waits for this group's reduce-scatter in flight and assigns the shard
  // grads. Local.
  void FinishReduceScatter();
  bool has_grads() const { return has_grads_; }
  // Counts every pending use as backpropagated: for FSDP on modules
  // (fully_shard.h), whose uses are forwards, settled at the end of each
  // backward (then StartReduceScatter reshards).
  void ForgetPendingUses() { pending_uses_ = 0; }
  size_t num_params() const { return params_.size(); }

 private:
  std::vector<FsdpParam*> params_;
  ProcessGroupPtr group_;
  FsdpOptions options_;
  FlatShardLayout layout_;
  bool unsharded_ = false;
  // The all-gather in flight (StartUnshard until Unshard): its work and
  // flat input / output.
  c10::intrusive_ptr<c10d::Work> gather_work_;
  at::Tensor gather_input_, gather_output_;
  // Backward bookkeeping: uses not yet backpropagated, and the grads (of
  // the gathered tensors, summed over uses) delivered since the last
  // reduce-scatter; `delivered_[i]`: member i had a backward.
  int pending_uses_ = 0;
  bool has_grads_ = false;
  std::vector<at::Tensor> grads_;
  std::vector<bool> delivered_;
  // The reduce-scatter in flight and which members' grads it carries.
  c10::intrusive_ptr<c10d::Work> scatter_work_;
  at::Tensor scatter_input_, scatter_output_;
  std::vector<bool> scatter_members_;
  bool scatter_pending_ = false;
};

// Shards `param` on dim 0 of its local tensor over `group` (mesh dimension
// `mesh_dim`): keeps chunk group.rank of group.size, zero-padded; installs an
// FsdpParam in a group of its own. Not collective. Errors: a 0-D or empty
// parameter, one already sharded by FSDP.
absl::Status FullyShard(Param& param, const std::string& mesh_dim, ProcessGroupPtr group,
                        FsdpOptions options = {});

// FSDP-shards every param of `params` (as FullyShard(Param&) does) and groups
// them, one group per dtype, in order of appearance: one FSDP unit. Errors
// leave the params whose sharding succeeded sharded, in no group.
absl::StatusOr<std::vector<std::shared_ptr<FsdpParamGroup>>> ShardIntoGroups(
    const std::vector<std::shared_ptr<Param>>& params, const std::string& mesh_dim,
    const ProcessGroupPtr& group, FsdpOptions options);

// The FSDP state of `param`, or null if it is not FSDP-sharded.
FsdpParam* FsdpStateOf(const Param& param);

// A layer whose params are FSDP-sharded, in groups, with FSDP's forward and
// backward hooks (see the file comment). Params()/Describe() are the inner
// layer's.
class FsdpLayer : public Layer {
 public:
  FsdpLayer(LayerPtr inner, std::vector<std::shared_ptr<FsdpParamGroup>> groups,
            FsdpOptions options);

  at::Tensor Forward(const at::Tensor& input) override;
  std::vector<std::shared_ptr<Param>> Params() const override { return inner_->Params(); }
  std::string Describe() const override { return "FSDP(" + inner_->Describe() + ")"; }

  const LayerPtr& inner() const { return inner_; }
  const std::vector<std::shared_ptr<FsdpParamGroup>>& groups() const { return groups_; }
  // The FSDP layers run before and after this one in forward, whose
  // all-gathers this one prefetches (FullyShard(Sequential&) sets them).
  void set_neighbours(std::weak_ptr<FsdpLayer> previous, std::weak_ptr<FsdpLayer> next);

  // Collective; used by the pre-backward hook.
  void UnshardAll();
  void StartUnshardAll();
  void ReshardAll();
  // Prefetch (collective): the previous layer's all-gather, in backward.
  void PrefetchPrevious();
  size_t unsharded_bytes() const;

 private:
  LayerPtr inner_;
  std::vector<std::shared_ptr<FsdpParamGroup>> groups_;
  FsdpOptions options_;
  std::weak_ptr<FsdpLayer> previous_, next_;
};

// FullyShard on every param of `layer`, grouped (one group per dtype), and
// the FsdpLayer wrapping it.
absl::StatusOr<LayerPtr> FullyShardLayer(LayerPtr layer, const std::string& mesh_dim,
                                         ProcessGroupPtr group, FsdpOptions options = {});

// FullyShardLayer on every layer of `model` that has params, in place,
// linked for prefetching in model order.
absl::Status FullyShard(Sequential& model, const std::string& mesh_dim,
                        ProcessGroupPtr group, FsdpOptions options = {});

// Bytes of unsharded parameter storage alive in `model`'s FSDP params.
size_t UnshardedBytes(const Sequential& model);

}  // namespace meshrun::worker::parallel
