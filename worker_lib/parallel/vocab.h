#pragma once

// Megatron-LM's vocabulary-parallel cross-entropy, behind LossParallel
// (parallelize.h): the cross-entropy of logits split along the vocabulary
// over a tensor-parallel group (a column-parallel LM head's output), never
// gathering them: the max and the sum of exponentials are all-reduced, the
// target's logit comes from the rank owning it. Its gradient softmax -
// one_hot(target) is computed locally on each shard. It equals
// at::cross_entropy of the gathered logits in value and gradient; with a
// null group, or one of size 1, it is that. Collective over the group (same
// calls, same order, same targets on every rank).

#include <ATen/ATen.h>

#include "worker_lib/parallel/param.h"

namespace meshrun::worker::parallel {

// Per-token cross-entropy (no reduction) of `logits` ([..., vocab / tp], this
// rank's contiguous slice of the vocabulary, rank order) against int64
// `targets` ([...], global ids in [0, vocab)); returns [...] float.
// Differentiable w.r.t. `logits`. Equals at::cross_entropy(reduction=none)
// of the gathered logits.
at::Tensor VocabParallelCrossEntropy(const at::Tensor& logits, const at::Tensor& targets,
                                     const ProcessGroupPtr& tp);

}  // namespace meshrun::worker::parallel
