#include "worker_lib/parallel/dp.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <exception>
#include <utility>

#include "absl/strings/str_cat.h"
#include "worker_lib/parallel/fsdp.h"

namespace meshrun::worker::parallel {

namespace {

at::Tensor MemberView(const at::Tensor& flat, int64_t offset, const at::Tensor& like) {
  return flat.narrow(0, offset, like.numel()).view(like.sizes());
}

// The same memory as MemberView, as a tensor of its own rather than an
// autograd view of `flat`: optimizers detach_() grads in zero_grad, which
// views refuse ("Can't detach views in-place").
at::Tensor MemberAlias(const at::Tensor& flat, int64_t offset, const at::Tensor& like) {
  at::Tensor alias = at::empty({0}, flat.options());
  alias.set_(flat.storage(), flat.storage_offset() + offset, like.sizes());
  return alias;
}

// Whether `grad` is (already) the bucket view `view`.
bool IsView(const at::Tensor& grad, const at::Tensor& view) {
  return grad.data_ptr() == view.data_ptr() && grad.sizes().equals(view.sizes()) &&
         grad.strides().equals(view.strides()) &&
         grad.scalar_type() == view.scalar_type();
}

c10::intrusive_ptr<c10d::Work> AllReduce(c10d::ProcessGroup& group, at::Tensor& flat,
                                         c10d::ReduceOp op) {
  std::vector<at::Tensor> tensors{flat};
  c10d::AllreduceOptions options;
  options.reduceOp = op;
  return group.allreduce(tensors, options);
}

}  // namespace

DataParallel::DataParallel(std::vector<std::shared_ptr<Param>> params,
                           ProcessGroupPtr group, size_t bucket_bytes,
                           size_t first_bucket_bytes)
    : params_(std::move(params)), group_(std::move(group)) {
  TORCH_CHECK(bucket_bytes >= 1, "DataParallel: bucket_bytes must be >= 1");
  std::vector<int64_t> numels, element_sizes;
  std::vector<int> dtypes;
  for (const auto& param : params_) {
    const at::Tensor& data = param->data();
    numels.push_back(data.numel());
    element_sizes.push_back(static_cast<int64_t>(data.element_size()));
    dtypes.push_back(static_cast<int>(data.scalar_type()));
  }
  std::vector<BucketLayout> layouts =
      MakeBuckets(numels, element_sizes, dtypes, bucket_bytes, first_bucket_bytes);
  slots_ = SlotsOf(layouts, params_.size());
  for (BucketLayout& layout : layouts) {
    Bucket bucket;
    const at::ScalarType dtype = params_[layout.members.front()]->data().scalar_type();
    // On the params' device (CUDA params: a CUDA bucket for NCCL).
    bucket.flat = at::zeros(
        {layout.numel},
        params_[layout.members.front()]->data().options().dtype(dtype).requires_grad(
            false));
    bucket.ready.assign(layout.members.size(), false);
    bucket.layout = std::move(layout);
    buckets_.push_back(std::move(bucket));
  }
  if (group_->getSize() == 1) return;
  for (size_t k = 0; k < params_.size(); ++k) {
    const at::Tensor& data = params_[k]->data();
    if (!data.requires_grad()) continue;
    // An FSDP shard's grad is written by its group, not by autograd (HSDP).
    if (FsdpParam* fsdp = FsdpStateOf(*params_[k])) {
      fsdp->set_shard_grad_hook([this, k] { OnGradReady(k); });
      fsdp_hooked_.push_back(fsdp);
      continue;
    }
    NodePtr accumulator = torch::autograd::impl::grad_accumulator(data);
    // inputs[0]: the gradient AccumulateGrad received; undefined when none
    // flowed (an FSDP shard's grad is set outside autograd).
    hook_keys_.push_back(accumulator->add_post_hook(
        std::make_unique<torch::autograd::utils::LambdaPostHook>(
            [this, k](const torch::autograd::variable_list& outputs,
                      const torch::autograd::variable_list& inputs) {
              if (!inputs.empty() && inputs[0].defined()) OnGradReady(k);
              return outputs;
            })));
    accumulators_.push_back(std::move(accumulator));
  }
}

DataParallel::~DataParallel() {
  for (size_t i = 0; i < accumulators_.size(); ++i)
    accumulators_[i]->del_post_hook(hook_keys_[i]);
  for (FsdpParam* fsdp : fsdp_hooked_) fsdp->set_shard_grad_hook(nullptr);
}

size_t DataParallel::bucket_bytes_allocated() const {
  size_t total = 0;
  for (const Bucket& bucket : buckets_) total += bucket.flat.nbytes();
  return total;
}

void DataParallel::CopyIntoBucket(size_t index) {
  const BucketSlot slot = slots_[index];
  Bucket& bucket = buckets_[slot.bucket];
  const int64_t offset = bucket.layout.offsets[slot.member];
  const at::Tensor& data = params_[index]->data();
  at::Tensor view = MemberView(bucket.flat, offset, data);
  at::Tensor& grad = data.mutable_grad();
  if (!grad.defined()) {
    view.zero_();
  } else if (!IsView(grad, view)) {
    view.copy_(grad);
  } else {
    return;
  }
  grad = MemberAlias(bucket.flat, offset, data);
}

void DataParallel::QueueBackwardEnd() {
  const bool sync = sync_at_backward_end_ && sync_during_backward_;
  const int graph_task = torch::autograd::get_current_graph_task_id();
  if (end_callback_queued_ && graph_task != queued_for_graph_task_) {
    // The backward that queued the callback threw, and its callback was
    // dropped with it: drop what it started (every rank started the same).
    AbandonBackward();
  }
  if (end_callback_queued_ || (!sync && !at_backward_end_)) return;
  end_callback_queued_ = true;
  queued_for_graph_task_ = graph_task;
  torch::autograd::Engine::get_default_engine().queue_callback([this, sync] {
    end_callback_queued_ = false;
    if (sync) SyncGradients();
    if (at_backward_end_) at_backward_end_();
  });
}

void DataParallel::OnGradReady(size_t index) {
  QueueBackwardEnd();
  if (!sync_during_backward_) return;
  const BucketSlot slot = slots_[index];
  Bucket& bucket = buckets_[slot.bucket];
  if (bucket.work) {
    if (misuse_.empty()) {
      misuse_ = absl::StrCat(
          "DataParallel: ", params_[index]->name(),
          " got a gradient while its bucket was being all-reduced: a second backward "
          "before SyncGradients needs set_sync_during_backward(false) first");
    }
    return;
  }
  at::NoGradGuard no_grad;
  // Into the bucket now, so the grad accumulates there in place if another
  // use of the param comes later in this backward.
  CopyIntoBucket(index);
  if (bucket.ready[slot.member]) return;
  bucket.ready[slot.member] = true;
  ++bucket.num_ready;
  StartReadyBuckets();
}

void DataParallel::StartBucket(Bucket& bucket) {
  bucket.work = AllReduce(*group_, bucket.flat, c10d::ReduceOp::SUM);
}

void DataParallel::StartReadyBuckets() {
  // In bucket order, as DDP does, so that every rank issues the same
  // sequence of all-reduces whatever order its grads come in.
  while (next_bucket_ < buckets_.size() &&
         buckets_[next_bucket_].num_ready ==
             buckets_[next_bucket_].layout.members.size()) {
    StartBucket(buckets_[next_bucket_]);
    ++next_bucket_;
    ++started_in_backward_;
  }
}

void DataParallel::SyncGradients() {
  at::NoGradGuard no_grad;
  const int n = group_->getSize();
  if (!misuse_.empty()) {
    std::string misuse = std::move(misuse_);
    misuse_.clear();
    // Drain what was started, so the group stays in step, then report.
    for (Bucket& bucket : buckets_) {
      if (bucket.work) bucket.work->wait();
      bucket.work.reset();
    }
    ResetBackwardState();
    TORCH_CHECK(false, misuse);
  }
  const int started_in_backward = started_in_backward_;
  for (; next_bucket_ < buckets_.size(); ++next_bucket_) {
    Bucket& bucket = buckets_[next_bucket_];
    for (size_t m = 0; m < bucket.layout.members.size(); ++m) {
      if (!bucket.ready[m]) CopyIntoBucket(bucket.layout.members[m]);
    }
    if (n > 1) StartBucket(bucket);
  }
  for (Bucket& bucket : buckets_) {
    if (n > 1) {
      TORCH_INTERNAL_ASSERT(bucket.work, "DataParallel: a bucket was never started");
      bucket.work->wait();
      bucket.work.reset();
      bucket.flat.div_(n);
    }
    // A grad replaced since its bucket was filled (user code) is not the
    // bucket's tensor: put the bucket's back (holding the mean).
    for (size_t m = 0; m < bucket.layout.members.size(); ++m) {
      const at::Tensor& data = params_[bucket.layout.members[m]]->data();
      at::Tensor& grad = data.mutable_grad();
      const int64_t offset = bucket.layout.offsets[m];
      if (!grad.defined() || !IsView(grad, MemberView(bucket.flat, offset, data)))
        grad = MemberAlias(bucket.flat, offset, data);
    }
  }
  ResetBackwardState();
  last_started_in_backward_ = started_in_backward;
}

void DataParallel::AbandonBackward() {
  at::NoGradGuard no_grad;
  for (Bucket& bucket : buckets_) {
    if (bucket.work) bucket.work->wait();
    bucket.work.reset();
  }
  misuse_.clear();
  end_callback_queued_ = false;
  ResetBackwardState();
}

void DataParallel::ResetBackwardState() {
  for (Bucket& bucket : buckets_) {
    bucket.ready.assign(bucket.ready.size(), false);
    bucket.num_ready = 0;
  }
  next_bucket_ = 0;
  started_in_backward_ = 0;
}

absl::Status DataParallel::BroadcastParams(int root) {
  if (root < 0 || root >= group_->getSize()) {
    return absl::InvalidArgumentError(absl::StrCat("DataParallel: broadcast root ", root,
                                                   " outside a group of ",
                                                   group_->getSize()));
  }
  at::NoGradGuard no_grad;
  try {
    for (Bucket& bucket : buckets_) {
      at::Tensor flat = at::empty_like(bucket.flat);
      for (size_t m = 0; m < bucket.layout.members.size(); ++m) {
        const at::Tensor& data = params_[bucket.layout.members[m]]->data();
        MemberView(flat, bucket.layout.offsets[m], data).copy_(data);
      }
      std::vector<at::Tensor> tensors{flat};
      c10d::BroadcastOptions options;
      options.rootRank = root;
      group_->broadcast(tensors, options)->wait();
      for (size_t m = 0; m < bucket.layout.members.size(); ++m) {
        const at::Tensor& data = params_[bucket.layout.members[m]]->data();
        data.copy_(MemberView(flat, bucket.layout.offsets[m], data));
      }
    }
  } catch (const std::exception& e) {
    return absl::InternalError(
        absl::StrCat("DataParallel: broadcast failed: ", e.what()));
  }
  return absl::OkStatus();
}

}  // namespace meshrun::worker::parallel
