#pragma once

// Data parallelism: gradients averaged over a process group (one mesh
// dimension, or a flattened one), as DistributedDataParallel does, in
// buckets: the grads are laid out in flat buffers of up to `bucket_bytes`
// (flat_layout.h: reverse param order, one buffer per dtype run), one
// all-reduce per bucket.
//
//   DataParallel dp(params, mesh["dp"]->GetGroup().value());  // ddp.h wraps it
//   loss.backward();       // each bucket's all-reduce starts once its grads are in
//   dp.SyncGradients();    // waits for them: every grad = mean over the group
//   optimizer.step();
//
// Overlap with backward, as DDP does: a hook after each param's
// AccumulateGrad marks the param ready (copying its grad into the bucket if
// it is not there already); when every param of a bucket is ready, and the
// buckets before it have started, the bucket's all-reduce is issued while
// backward goes on. SyncGradients issues the buckets that did not fill up
// (unused params, grads set outside autograd such as FSDP's shard grads in
// HSDP) and waits for all. Exactly one backward may run between two
// SyncGradients while syncing during backward is on; to accumulate grads over
// several backwards (microbatches, pipeline schedules), turn it off for all
// but the last (set_sync_during_backward(false), DDP's no_sync()), or for
// all of them: SyncGradients then does the whole sync after backward, as
// before. A second backward that reaches a bucket already being all-reduced
// is a programming error that SyncGradients reports (c10::Error).
//
// Gradients live IN the buckets (DDP's gradient_as_bucket_view=True): after
// the first sync each param's grad is a tensor over its slice of the
// bucket's memory (not an autograd view, so an optimizer's zero_grad may
// detach_() it), autograd accumulates into it in place on later steps, and
// a step copies nothing. A grad replaced by another tensor (set to none,
// user code) is detected and copied in, after which the bucket's tensor is
// put back; an undefined grad counts as zeros.
//
// Works on whatever data() holds: whole params, TP shards, FSDP shards (that
// is HSDP: FullyShard over the shard dimension, then DataParallel over the
// replicate dimension on the shard grads). An FSDP shard is ready when its
// group has reduce-scattered its grad (FsdpParam's shard-grad hook), so
// HSDP's all-reduces, too, run during backward, as FSDP2's do.
//
// Collective: SyncGradients and BroadcastParams must be called by every rank
// of `group`, with the same params (shapes, dtypes, order), and every rank
// must run the same backward passes. Not thread-safe.

#include <torch/csrc/autograd/function.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "worker_lib/parallel/flat_layout.h"
#include "worker_lib/parallel/param.h"

namespace meshrun::worker::parallel {

class FsdpParam;

class DataParallel {
 public:
  static constexpr size_t kDefaultBucketBytes = size_t{25} << 20;  // DDP's 25 MiB
  // DDP's _DEFAULT_FIRST_BUCKET_BYTES (MakeBuckets' first_bucket_bytes).
  static constexpr size_t kDefaultFirstBucketBytes = size_t{1} << 20;

  // `params` must stay alive while this object is used; their data() must not
  // be replaced afterwards (shard with TP / FSDP first). bucket_bytes >= 1; a
  // param larger than a bucket gets a bucket of its own; the first bucket
  // closes at first_bucket_bytes when that is smaller (flat_layout.h).
  // Registers the grad-ready hooks (removed by the destructor).
  DataParallel(std::vector<std::shared_ptr<Param>> params, ProcessGroupPtr group,
               size_t bucket_bytes = kDefaultBucketBytes,
               size_t first_bucket_bytes = kDefaultFirstBucketBytes);
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  // Every param's grad := the mean of it over the group. Collective.
  void SyncGradients();

  // Whether a backward that starts buckets also finishes the sync itself
  // (SyncGradients from an autograd engine callback at its end), as
  // PyTorch's DDP does: grads are averaged when backward() returns. Default
  // off (the caller calls SyncGradients).
  void set_sync_at_backward_end(bool on) { sync_at_backward_end_ = on; }
  // Runs `fn` at the end of every backward that gave one of the params a
  // grad (after the sync above, when on), under no_sync too. Collective
  // work in it runs on every rank at the same point.
  void set_at_backward_end(std::function<void()> fn) { at_backward_end_ = std::move(fn); }

  // Whether the next backwards start the buckets' all-reduces (default
  // true). Off: grads only accumulate, SyncGradients does all the work.
  void set_sync_during_backward(bool on) { sync_during_backward_ = on; }
  bool sync_during_backward() const { return sync_during_backward_; }

  // Every rank's data() := rank `root`'s (DDP's initial broadcast), in the
  // same buckets. Collective.
  absl::Status BroadcastParams(int root = 0);

  int num_buckets() const { return static_cast<int>(buckets_.size()); }
  // Bytes of the flat buffers (the grads themselves after the first sync).
  size_t bucket_bytes_allocated() const;
  // How many buckets' all-reduces started during backward (before the
  // SyncGradients call) in the last sync: the overlap, for tests.
  int buckets_started_in_backward() const { return last_started_in_backward_; }

 private:
  struct Bucket {
    BucketLayout layout;
    at::Tensor flat;
    std::vector<bool> ready;
    size_t num_ready = 0;
    c10::intrusive_ptr<c10d::Work> work;  // its all-reduce, once started
  };

  // The hook: param `index`'s grad has been accumulated (during backward).
  void OnGradReady(size_t index);
  // Copies param `index`'s grad into its bucket (zeros if undefined) unless
  // it is the bucket's tensor already, which it then becomes.
  void CopyIntoBucket(size_t index);
  void StartBucket(Bucket& bucket);
  // Starts buckets in order while they are full.
  void StartReadyBuckets();
  // Queues the end-of-backward callback (sync, at_backward_end_) once per
  // backward, if either is wanted.
  void QueueBackwardEnd();
  // No param ready, no bucket started: the state between backwards.
  void ResetBackwardState();
  // A backward threw before its end callback: wait for the all-reduces it
  // started and forget its state, so the next backward syncs as usual.
  void AbandonBackward();

  std::vector<std::shared_ptr<Param>> params_;
  ProcessGroupPtr group_;
  std::vector<Bucket> buckets_;
  std::vector<BucketSlot> slots_;
  // The params' AccumulateGrad nodes (kept alive so the hooks stay on
  // them, as DDP's reducer does) and the hooks' keys.
  // As grad_accumulator gives it: a shared_ptr in libtorch 2.11, an intrusive_ptr
  // in 2.15.
  using NodePtr = decltype(torch::autograd::impl::grad_accumulator(
      std::declval<const at::Tensor&>()));
  std::vector<NodePtr> accumulators_;
  std::vector<uintptr_t> hook_keys_;
  // FSDP params whose shard-grad hook is ours (HSDP).
  std::vector<FsdpParam*> fsdp_hooked_;
  bool sync_during_backward_ = true;
  bool sync_at_backward_end_ = false;
  bool end_callback_queued_ = false;
  int queued_for_graph_task_ = -1;  // the backward that queued it
  std::function<void()> at_backward_end_;
  size_t next_bucket_ = 0;  // the first bucket whose all-reduce has not started
  int started_in_backward_ = 0;
  int last_started_in_backward_ = 0;
  std::string misuse_;  // set by a hook, reported by SyncGradients
};

}  // namespace meshrun::worker::parallel
