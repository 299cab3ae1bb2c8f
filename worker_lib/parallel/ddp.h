#pragma once

// PyTorch's DistributedDataParallel on the user's own libtorch module
// (torch::nn::Module): the module's parameters stay its own; their grads
// are averaged over the group by the time backward() returns.
//
//   auto ddp = ValueOrFail(DistributedDataParallel::Wrap(*model, group));
//   torch::optim::AdamW optimizer(model->parameters(), options);
//   loss = loss_fn(model->forward(x), y); loss.backward(); optimizer.step();
//
// Wrap checks, as DDP's constructor does, that every rank has the same
// parameters (how many, and each one's shape and dtype: a mismatch is one
// line naming the parameter and the rank), then copies rank 0's parameter
// and buffer values to every rank. Gradients go through DataParallel (dp.h):
// buckets in reverse parameter order, DDP's small first bucket, each
// bucket's all-reduce started during backward once its grads are in, the
// grads living in the buckets (gradient_as_bucket_view); an autograd
// engine callback at the end of backward waits for them. Only parameters
// that require grad take part, as in DDP.
//
// HSDP: FullyShard over the shard dimension first, then Wrap over the
// replicate dimension: the shards' reduce-scattered grads are all-reduced
// as their groups finish, during backward, as FSDP2's HSDP does (which
// leaves buffers alone: DdpOptions::broadcast_buffers off for the same).
//
// Buffers (BatchNorm's running statistics) are rank 0's on every rank, as
// with DDP's broadcast_buffers: broadcast at Wrap and then at the end of
// every backward (DDP: before every forward; libtorch modules have no
// forward hooks), so every forward after a backward sees rank 0's values,
// as under DDP. A run of training-mode forwards with no backward between
// them is not synchronised. Unused parameters need no flag (their grads
// count as zeros).
//
// Collective: Wrap and every backward, on every rank of `group`, in the
// same order. Not thread-safe. The wrapper must outlive the backwards.

#include <torch/nn/module.h>

#include <cstddef>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "worker_lib/parallel/dp.h"
#include "worker_lib/parallel/param.h"

namespace meshrun::worker::parallel {

struct DdpOptions {
  size_t bucket_bytes = DataParallel::kDefaultBucketBytes;
  size_t first_bucket_bytes = DataParallel::kDefaultFirstBucketBytes;
  // DDP's broadcast_buffers. Off for HSDP as FSDP2 does it (fully_shard on a
  // 2-D mesh leaves buffers alone).
  bool broadcast_buffers = true;
};

class DistributedDataParallel {
 public:
  static absl::StatusOr<std::unique_ptr<DistributedDataParallel>> Wrap(
      torch::nn::Module& module, ProcessGroupPtr group, DdpOptions options = {});

  // DDP's no_sync(): while one is alive, backwards only accumulate grads;
  // the first backward after it averages everything accumulated.
  class NoSync {
   public:
    explicit NoSync(DataParallel& reducer) : reducer_(&reducer) {
      reducer_->set_sync_during_backward(false);
    }
    ~NoSync() {
      if (reducer_ != nullptr) reducer_->set_sync_during_backward(true);
    }
    NoSync(NoSync&& other) noexcept : reducer_(std::exchange(other.reducer_, nullptr)) {}
    NoSync(const NoSync&) = delete;
    NoSync& operator=(const NoSync&) = delete;
    NoSync& operator=(NoSync&&) = delete;

   private:
    DataParallel* reducer_;
  };
  NoSync no_sync() { return NoSync(*reducer_); }

  // For pipeline stages, whose schedule runs a backward per microbatch: hold
  // a NoSync over the step, then average the accumulated grads here.
  void SyncGradients() { reducer_->SyncGradients(); }

  const DataParallel& reducer() const { return *reducer_; }

 private:
  explicit DistributedDataParallel(std::unique_ptr<DataParallel> reducer)
      : reducer_(std::move(reducer)) {}
  std::unique_ptr<DataParallel> reducer_;
};

}  // namespace meshrun::worker::parallel
