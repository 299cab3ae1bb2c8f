#include "worker_lib/parallel/dp.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <exception>
#include <utility>

#include "absl/strings/str_cat.h"

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
                           ProcessGroupPtr group, size_t bucket_bytes)
    : params_(std::move(params)), group_(std::move(group)) {
  TORCH_CHECK(bucket_bytes >= 1, "DataParallel: bucket_bytes must be >= 1");
  // Reverse order, as DDP: the last layers' grads are ready first.
  std::vector<int64_t> numels;
  std::vector<at::ScalarType> dtypes;
  size_t bytes = 0;
  for (size_t k = params_.size(); k-- > 0;) {
    const at::Tensor& data = params_[k]->data();
    const size_t size = data.numel() * data.element_size();
    if (buckets_.empty() || bytes + size > bucket_bytes ||
        dtypes.back() != data.scalar_type()) {
      buckets_.emplace_back();
      numels.push_back(0);
      dtypes.push_back(data.scalar_type());
      bytes = 0;
    }
    buckets_.back().members.push_back(k);
    buckets_.back().offsets.push_back(numels.back());
    numels.back() += data.numel();
    bytes += size;
  }
  for (size_t b = 0; b < buckets_.size(); ++b) {
    buckets_[b].flat = at::zeros({numels[b]}, at::TensorOptions().dtype(dtypes[b]));
  }
}

size_t DataParallel::bucket_bytes_allocated() const {
  size_t total = 0;
  for (const Bucket& bucket : buckets_) total += bucket.flat.nbytes();
  return total;
}

void DataParallel::SyncGradients() {
  at::NoGradGuard no_grad;
  const int n = group_->getSize();
  std::vector<c10::intrusive_ptr<c10d::Work>> works;
  works.reserve(buckets_.size());
  for (Bucket& bucket : buckets_) {
    for (size_t m = 0; m < bucket.members.size(); ++m) {
      const at::Tensor& data = params_[bucket.members[m]]->data();
      at::Tensor view = MemberView(bucket.flat, bucket.offsets[m], data);
      const at::Tensor& grad = data.grad();
      if (!grad.defined()) {
        view.zero_();
      } else if (!IsView(grad, view)) {
        view.copy_(grad);
      }
    }
    if (n > 1) works.push_back(AllReduce(*group_, bucket.flat, c10d::ReduceOp::SUM));
  }
  for (size_t b = 0; b < buckets_.size(); ++b) {
    Bucket& bucket = buckets_[b];
    if (n > 1) {
      works[b]->wait();
      bucket.flat.div_(n);
    }
    for (size_t m = 0; m < bucket.members.size(); ++m) {
      const at::Tensor& data = params_[bucket.members[m]]->data();
      at::Tensor& grad = data.mutable_grad();
      if (!grad.defined() ||
          !IsView(grad, MemberView(bucket.flat, bucket.offsets[m], data))) {
        grad = MemberAlias(bucket.flat, bucket.offsets[m], data);
      }
    }
  }
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
      for (size_t m = 0; m < bucket.members.size(); ++m) {
        const at::Tensor& data = params_[bucket.members[m]]->data();
        MemberView(flat, bucket.offsets[m], data).copy_(data);
      }
      std::vector<at::Tensor> tensors{flat};
      c10d::BroadcastOptions options;
      options.rootRank = root;
      group_->broadcast(tensors, options)->wait();
      for (size_t m = 0; m < bucket.members.size(); ++m) {
        const at::Tensor& data = params_[bucket.members[m]]->data();
        data.copy_(MemberView(flat, bucket.offsets[m], data));
      }
    }
  } catch (const std::exception& e) {
    return absl::InternalError(
        absl::StrCat("DataParallel: broadcast failed: ", e.what()));
  }
  return absl::OkStatus();
}

absl::Status DataParallel::VerifyParamsEqual() {
  at::NoGradGuard no_grad;
  const int64_t none = static_cast<int64_t>(params_.size());
  int64_t first_different = none;
  try {
    for (Bucket& bucket : buckets_) {
      at::Tensor mine = at::empty_like(bucket.flat);
      for (size_t m = 0; m < bucket.members.size(); ++m) {
        const at::Tensor& data = params_[bucket.members[m]]->data();
        MemberView(mine, bucket.offsets[m], data).copy_(data);
      }
      std::vector<at::Tensor> tensors{mine.clone()};
      group_->broadcast(tensors)->wait();
      for (size_t m = 0; m < bucket.members.size(); ++m) {
        const at::Tensor& data = params_[bucket.members[m]]->data();
        if (!at::equal(MemberView(tensors[0], bucket.offsets[m], data),
                       MemberView(mine, bucket.offsets[m], data))) {
          first_different =
              std::min(first_different, static_cast<int64_t>(bucket.members[m]));
        }
      }
    }
    at::Tensor flag = at::full({1}, first_different, at::kLong);
    AllReduce(*group_, flag, c10d::ReduceOp::MIN)->wait();
    first_different = flag.item<int64_t>();
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("DataParallel: verify failed: ", e.what()));
  }
  if (first_different == none) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("DataParallel: ", params_[first_different]->name(),
                   " differs between the group's ranks"));
}

}  // namespace meshrun::worker::parallel
