#pragma once

// The engine of fully sharded data parallelism (FSDP2's FSDPParam and
// FSDPParamGroup), behind FullyShard on torch::nn modules (fully_shard.h,
// which owns the hooks: when to gather, prefetch, reshard): each
// parameter's local tensor is split along dim 0 over a mesh dimension
// (torch.chunk semantics, every chunk zero-padded to the first chunk's size
// so that collectives see equal shapes); the optimizer holds and updates
// only the chunk. The module computes with the parameter all-gathered back
// into its own unsharded storage, and the full gradient, averaged over the
// group, is reduce-scattered into the chunk's grad.
//
// Params already sharded by TP (Param::Shard) are sharded again on dim 0 of
// their TP-local tensor; the step order (TP, then FSDP) is recorded, so
// FullTensor() reassembles in the right order.
//
// Parameter groups: the params of one unit (of one dtype) are gathered by
// ONE all-gather into one flat buffer and their grads reduce-scattered by
// ONE reduce-scatter of one flat buffer (flat_layout.h has the layout),
// instead of a collective per param: on Gloo a collective's fixed cost
// dominates these sizes. The gathered values are copied out of the flat
// buffer into each param's own unsharded tensor (a param's rows from every
// rank are not contiguous there). The unsharded storage is resized to 0
// bytes and back, as PyTorch's FSDP does, so tensors over it (those autograd
// saved) see the refill and only the shard is resident between uses.
//
// Reduce-scatter: the unit's post-backward (fully_shard.h) hands the full
// grads it has to ReduceScatter, which issues one flat reduce-scatter and
// returns while backward goes on; FinishReduceScatter waits for it and
// writes the shard grads. The caller keeps at most one in flight, as FSDP2
// waits for the previous before issuing the next (which bounds the flat grad
// buffers alive).
//
// Gradients: the shard grads are written to data().grad() by the group
// (assigned, or added in place when one is there), not by autograd's
// AccumulateGrad; members that had no grad keep theirs as it was.
//
// Collective: gathers and reduce-scatters run over the group, so every
// member uses the same units in the same order. Setup (ShardIntoGroups) is
// not collective. Not thread-safe.

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker_lib/parallel/flat_layout.h"
#include "worker_lib/parallel/param.h"

namespace meshrun::worker::parallel {

struct FsdpOptions {
  // Free the all-gathered params after each unit's forward and gather them
  // again in backward (FSDP2's reshard_after_forward=True).
  bool reshard_after_forward = true;
};

class FsdpParamGroup;

// The FSDP state of one parameter: its unsharded storage and its group.
// Owned by the Param; shares ownership of its group.
class FsdpParam : public ParamShardState {
 public:
  // `rows`: the unsharded local tensor's dim 0.
  FsdpParam(Param& param, int64_t rows);

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

  // What owns this param's unit (FullyShard's, fully_shard.cc), for a
  // module that uses the parameter too (a tied weight).
  void set_owner(std::weak_ptr<void> owner) { owner_ = std::move(owner); }
  std::shared_ptr<void> owner() const { return owner_.lock(); }

 private:
  Param& param_;
  int64_t rows_;
  std::shared_ptr<FsdpParamGroup> group_;
  size_t index_ = 0;
  at::Tensor buffer_;
  size_t buffer_nbytes_ = 0;
  std::function<void()> shard_grad_hook_;
  std::weak_ptr<void> owner_;
};

// The params of one FSDP unit (of one dtype): one flat all-gather, one flat
// reduce-scatter. See the file comment.
class FsdpParamGroup : public std::enable_shared_from_this<FsdpParamGroup> {
 public:
  // `params` must share a dtype and stay alive as long as this group is used.
  FsdpParamGroup(std::vector<FsdpParam*> params, ProcessGroupPtr group);

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
  const ProcessGroupPtr& process_group() const { return group_; }
  const FlatShardLayout& layout() const { return layout_; }

  // Issues the reduce-scatter of `full_grads` (one per member, undefined:
  // no grad) unless none is defined; returns whether it did. Collective.
  bool ReduceScatter(const std::vector<at::Tensor>& full_grads);
  // Waits for the reduce-scatter in flight, if any, and assigns the shard
  // grads. Local.
  void FinishReduceScatter();
  // Waits for whatever is in flight (a backward that threw left it there:
  // every rank issued it) and drops its result; frees the gathered storage.
  void Abandon();
  size_t num_params() const { return params_.size(); }
  FsdpParam& member(size_t index) const { return *params_[index]; }

 private:
  std::vector<FsdpParam*> params_;
  ProcessGroupPtr group_;
  FlatShardLayout layout_;
  bool unsharded_ = false;
  // The all-gather in flight (StartUnshard until Unshard): its work and
  // flat input / output.
  c10::intrusive_ptr<c10d::Work> gather_work_;
  at::Tensor gather_input_, gather_output_;
  // The reduce-scatter in flight and which members' grads it carries.
  c10::intrusive_ptr<c10d::Work> scatter_work_;
  at::Tensor scatter_input_, scatter_output_;
  std::vector<bool> scatter_members_;
  bool scatter_pending_ = false;
};

// FSDP-shards every param of `params` on dim 0 of its local tensor over
// `group` (mesh dimension `mesh_dim`: each keeps chunk group.rank of
// group.size, zero-padded, and gets an FsdpParam) and groups them, one group
// per dtype, in order of appearance: one FSDP unit (FullyShard of a module,
// fully_shard.h). Not collective. Errors (a 0-D or empty parameter, one
// already sharded by FSDP) leave the params whose sharding succeeded
// sharded, in no group.
absl::StatusOr<std::vector<std::shared_ptr<FsdpParamGroup>>> ShardIntoGroups(
    const std::vector<std::shared_ptr<Param>>& params, const std::string& mesh_dim,
    const ProcessGroupPtr& group);

// The FSDP state of `param`, or null if it is not FSDP-sharded.
FsdpParam* FsdpStateOf(const Param& param);

}  // namespace meshrun::worker::parallel
