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
  // On the parameters' device: NCCL gathers CUDA tensors only.
  const at::TensorOptions on_device = at::TensorOptions(at::kLong).device(
      params.empty() ? at::kCPU : params[0]->data().device());
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

absl::Status BroadcastBuffers(torch::nn::Module& module, c10d::ProcessGroup& group) {
  at::NoGradGuard no_grad;
  for (const auto& item : module.named_buffers()) {
    std::vector<at::Tensor> tensors{item.value().contiguous()};
    group.broadcast(tensors)->wait();
    if (!tensors[0].is_same(item.value())) item.value().copy_(tensors[0]);
  }
  return absl::OkStatus();
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
  try {
    if (absl::Status status = VerifySameParams(params, *group); !status.ok())
      return status;
    if (absl::Status status = BroadcastBuffers(module, *group); !status.ok())
      return status;
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(
        "DistributedDataParallel: checking the ranks' parameters: ", e.what()));
  }
  auto reducer = std::make_unique<DataParallel>(
      std::move(params), group, options.bucket_bytes, options.first_bucket_bytes);
  if (absl::Status status = reducer->BroadcastParams(0); !status.ok()) return status;
  reducer->set_sync_at_backward_end(true);
  return std::unique_ptr<DistributedDataParallel>(
      new DistributedDataParallel(std::move(reducer)));
}

}  // namespace meshrun::worker::parallel
