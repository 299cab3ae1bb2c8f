#pragma once

// Data parallelism: gradients averaged over a process group (one mesh
// dimension, or a flattened one), as DistributedDataParallel does, in
// buckets: the grads are laid out in flat buffers of up to `bucket_bytes`
// (one buffer per dtype run), one all-reduce per bucket.
//
//   DataParallel dp(model.Params(), mesh["dp"]->GetGroup().value());
//   loss.backward();
//   dp.SyncGradients();   // every grad = mean over the group's ranks
//   optimizer.step();
//
// Gradients live IN the buckets (DDP's gradient_as_bucket_view=True): after
// the first SyncGradients each param's grad is a tensor over its slice of the
// bucket's memory (not an autograd view, so an optimizer's zero_grad may
// detach_() it), autograd accumulates into it in place on later steps, and
// a step copies nothing. A grad replaced by another tensor (set to none,
// user code) is detected and copied in, after which the bucket's tensor is
// put back; an undefined grad counts as zeros.
//
// Works on whatever data() holds: whole params, TP shards, FSDP shards (that
// is HSDP: FullyShard over the shard dimension, then DataParallel over the
// replicate dimension on the shard grads).
//
// Unlike DDP it does not overlap the all-reduces with backward: SyncGradients
// runs after backward, issuing every bucket's all-reduce before waiting for
// the first.
//
// Collective: SyncGradients and BroadcastParams must be called by every rank
// of `group`, with the same params (shapes, dtypes, order). Not thread-safe.

#include <cstddef>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "worker_lib/parallel/param.h"

namespace meshrun::worker::parallel {

class DataParallel {
 public:
  static constexpr size_t kDefaultBucketBytes = size_t{25} << 20;  // DDP's 25 MiB

  // `params` must stay alive while this object is used; their data() must not
  // be replaced afterwards (shard with TP / FSDP first). bucket_bytes >= 1; a
  // param larger than a bucket gets a bucket of its own.
  DataParallel(std::vector<std::shared_ptr<Param>> params, ProcessGroupPtr group,
               size_t bucket_bytes = kDefaultBucketBytes);

  // Every param's grad := the mean of it over the group. Collective.
  void SyncGradients();

  // Every rank's data() := rank `root`'s (DDP's initial broadcast), in the
  // same buckets. Collective.
  absl::Status BroadcastParams(int root = 0);

  // OK when every rank holds the same data() as rank 0 (bitwise); otherwise
  // FAILED_PRECONDITION naming the first param that differs. Collective.
  absl::Status VerifyParamsEqual();

  int num_buckets() const { return static_cast<int>(buckets_.size()); }
  // Bytes of the flat buffers (the grads themselves after the first sync).
  size_t bucket_bytes_allocated() const;

 private:
  struct Bucket {
    std::vector<size_t> members;   // indices into params_
    std::vector<int64_t> offsets;  // element offset of each member in `flat`
    at::Tensor flat;
  };

  std::vector<std::shared_ptr<Param>> params_;
  ProcessGroupPtr group_;
  std::vector<Bucket> buckets_;
};

}  // namespace meshrun::worker::parallel
