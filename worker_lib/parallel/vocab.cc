#include "worker_lib/parallel/vocab.h"

#include <torch/csrc/autograd/custom_function.h>

#include <vector>

namespace meshrun::worker::parallel {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The group's size; 1 without a group.
int GroupSize(const ProcessGroupPtr& group) { return group ? group->getSize() : 1; }

void AllReduce(c10d::ProcessGroup& group, at::Tensor& t, c10d::ReduceOp op) {
  std::vector<at::Tensor> tensors{t};
  c10d::AllreduceOptions options;
  options.reduceOp = op;
  group.allreduce(tensors, options)->wait();
}

void CheckIds(const at::Tensor& ids, int64_t vocab, const char* what) {
  TORCH_CHECK(ids.scalar_type() == at::kLong, what, " must be int64, got ",
              ids.scalar_type());
  if (ids.numel() == 0) return;
  const int64_t low = ids.min().item<int64_t>();
  const int64_t high = ids.max().item<int64_t>();
  TORCH_CHECK(low >= 0 && high < vocab, what, " outside [0, ", vocab, "): ", low, "..",
              high);
}

// The targets this rank owns, as local column indices (0 where not owned),
// and the mask of those it does not own.
struct Owned {
  at::Tensor local;
  at::Tensor not_mine;
};
Owned OwnedIds(const at::Tensor& ids, int64_t start, int64_t count) {
  at::Tensor not_mine = (ids < start).logical_or(ids >= start + count);
  return {(ids - start).masked_fill(not_mine, 0), not_mine};
}

// Megatron's _VocabParallelCrossEntropy on [N, V_local] logits, [N] targets.
struct VocabCrossEntropy : torch::autograd::Function<VocabCrossEntropy> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& logits,
                            const at::Tensor& targets, const ProcessGroupPtr& tp) {
    const int64_t v_local = logits.size(1);
    at::Tensor max = std::get<0>(logits.max(1));
    AllReduce(*tp, max, c10d::ReduceOp::MAX);
    at::Tensor shifted = logits - max.unsqueeze(1);

    Owned owned = OwnedIds(targets, tp->getRank() * v_local, v_local);
    at::Tensor picked = shifted.gather(1, owned.local.unsqueeze(1))
                            .squeeze(1)
                            .masked_fill(owned.not_mine, 0);
    AllReduce(*tp, picked, c10d::ReduceOp::SUM);

    at::Tensor exp = shifted.exp();
    at::Tensor sum_exp = exp.sum(1);
    AllReduce(*tp, sum_exp, c10d::ReduceOp::SUM);

    at::Tensor softmax = exp.div_(sum_exp.unsqueeze(1));
    ctx->save_for_backward({softmax, owned.local, owned.not_mine});
    return sum_exp.log() - picked;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& softmax = saved[0];
    const at::Tensor& local = saved[1];
    const at::Tensor& not_mine = saved[2];
    // d loss_i / d logit_ij = softmax_ij - [j == target_i].
    at::Tensor grad = softmax.clone();
    grad.scatter_add_(1, local.unsqueeze(1),
                      not_mine.logical_not().to(grad.scalar_type()).neg().unsqueeze(1));
    grad.mul_(grads[0].unsqueeze(1));
    return {grad, at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor VocabParallelCrossEntropy(const at::Tensor& logits, const at::Tensor& targets,
                                     const ProcessGroupPtr& tp) {
  const int64_t v_local = logits.size(-1);
  TORCH_CHECK(targets.sizes().vec() ==
                  std::vector<int64_t>(logits.sizes().begin(), logits.sizes().end() - 1),
              "targets ", targets.sizes(), " do not match logits ", logits.sizes());
  CheckIds(targets, v_local * GroupSize(tp), "targets");
  at::Tensor flat_logits = logits.reshape({-1, v_local});
  at::Tensor flat_targets = targets.reshape({-1});
  at::Tensor losses =
      GroupSize(tp) == 1
          ? at::cross_entropy_loss(flat_logits, flat_targets, {}, at::Reduction::None)
          : VocabCrossEntropy::apply(flat_logits, flat_targets, tp);
  return losses.view(targets.sizes());
}

}  // namespace meshrun::worker::parallel
