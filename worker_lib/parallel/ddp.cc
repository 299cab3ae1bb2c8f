#include "worker_lib/parallel/ddp.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <exception>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "worker_lib/parallel/module_params.h"

namespace meshrun::worker::parallel {
namespace {

// A parameter's dtype and shape as one number (FNV-1a), to compare across
// ranks without gathering shapes of unknown length.
int64_t Signature(const at::Tensor& tensor) {
  uint64_t hash = 1469598103934665603ULL;
  auto mix = [&](uint64_t value) {
    hash ^= value;
    hash *= 1099511628211ULL;
  };
  mix(static_cast<uint64_t>(tensor.scalar_type()));
  mix(static_cast<uint64_t>(tensor.dim()));
  for (int64_t size : tensor.sizes()) mix(static_cast<uint64_t>(size));
  return static_cast<int64_t>(hash >> 1);
}

std::string Describe(const at::Tensor& tensor) {
  return absl::StrCat(c10::toString(tensor.scalar_type()), " ", c10::str(tensor.sizes()));
}

// DDP's _verify_param_shape_across_processes: the same number of
// parameters, each of the same dtype and shape, on every rank.
absl::Status VerifySameParams(const std::vector<std::shared_ptr<Param>>& params,
                              c10d::ProcessGroup& group) {
  const int64_t count = static_cast<int64_t>(params.size());
  const at::TensorOptions on_device =
      at::TensorOptions(at::kLong).device(DeviceOf(params));
  at::Tensor counts = AllGatherAlong(group, at::full({1}, count, on_device), 0).cpu();
  for (int rank = 0; rank < group.getSize(); ++rank) {
    const int64_t theirs = counts[rank].item<int64_t>();
    if (theirs != count) {
      return absl::FailedPreconditionError(
          absl::StrCat("DistributedDataParallel: rank ", group.getRank(), " has ", count,
                       " parameters that require grad, rank ", rank, " has ", theirs));
    }
  }
  if (count == 0) return absl::OkStatus();
  at::Tensor mine = at::empty({count}, at::kLong);
  for (int64_t i = 0; i < count; ++i) mine[i] = Signature(params[i]->data());
  at::Tensor all = AllGatherAlong(group, mine.to(on_device.device()), 0)
                       .cpu()
                       .view({group.getSize(), count});
  for (int64_t i = 0; i < count; ++i) {
    for (int rank = 0; rank < group.getSize(); ++rank) {
      if (all[rank][i].item<int64_t>() != mine[i].item<int64_t>()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "DistributedDataParallel: parameter ", i, " (", params[i]->name(), ", ",
            Describe(params[i]->data()), " on rank ", group.getRank(),
            ") has another shape or dtype on rank ", rank));
      }
    }
  }
  return absl::OkStatus();
}

// Every rank's buffers := rank 0's: one broadcast per dtype and device
// (DDP's coalesced buffer broadcast), in the buffers' order.
void BroadcastBuffers(const std::vector<at::Tensor>& buffers, c10d::ProcessGroup& group) {
  at::NoGradGuard no_grad;
  std::vector<bool> done(buffers.size(), false);
  for (size_t first = 0; first < buffers.size(); ++first) {
    if (done[first]) continue;
    std::vector<size_t> same;
    for (size_t i = first; i < buffers.size(); ++i) {
      if (!done[i] && buffers[i].scalar_type() == buffers[first].scalar_type() &&
          buffers[i].device() == buffers[first].device()) {
        same.push_back(i);
        done[i] = true;
      }
    }
    std::vector<at::Tensor> flats;
    for (size_t i : same) flats.push_back(buffers[i].reshape({-1}));
    std::vector<at::Tensor> flat{at::cat(flats)};
    group.broadcast(flat)->wait();
    int64_t offset = 0;
    for (size_t i : same) {
      const int64_t n = buffers[i].numel();
      buffers[i].copy_(flat[0].narrow(0, offset, n).view_as(buffers[i]));
      offset += n;
    }
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<DistributedDataParallel>> DistributedDataParallel::Wrap(
    torch::nn::Module& module, ProcessGroupPtr group, DdpOptions options) {
  if (group == nullptr) {
    return absl::InvalidArgumentError("DistributedDataParallel: no process group");
  }
  std::vector<std::shared_ptr<Param>> params;
  // A sharded parameter's recorded Param: an FSDP shard's grad comes from
  // its group's reduce-scatter (HSDP), not from autograd.
  for (const NamedParam& named : ModuleParams(module)) {
    if (named.param->data().requires_grad()) params.push_back(named.param);
  }
  std::vector<at::Tensor> buffers;
  for (const at::Tensor& buffer : module.buffers()) {
    if (buffer.numel() > 0) buffers.push_back(buffer);
  }
  try {
    if (absl::Status status = VerifySameParams(params, *group); !status.ok())
      return status;
    BroadcastBuffers(buffers, *group);
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(
        "DistributedDataParallel: checking the ranks' parameters: ", e.what()));
  }
  auto reducer = std::make_unique<DataParallel>(
      std::move(params), group, options.bucket_bytes, options.first_bucket_bytes);
  if (absl::Status status = reducer->BroadcastParams(0); !status.ok()) return status;
  reducer->set_sync_at_backward_end(true);
  // PyTorch's DDP broadcasts them before every forward; libtorch modules have
  // no forward hooks, so here at the end of every backward, the collective
  // point every rank reaches: the next forward sees the same values (rank
  // 0's, which nothing changes in between).
  if (options.broadcast_buffers && !buffers.empty() && group->getSize() > 1) {
    reducer->set_at_backward_end(
        [buffers = std::move(buffers), group] { BroadcastBuffers(buffers, *group); });
  }
  return std::unique_ptr<DistributedDataParallel>(
      new DistributedDataParallel(std::move(reducer)));
}

}  // namespace meshrun::worker::parallel
