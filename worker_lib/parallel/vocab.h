#pragma once

// The vocabulary-sized ends of a language model, whole and split over a
// tensor-parallel group along the vocabulary (Megatron-LM):
//
//  - Embedding / VocabParallelEmbedding: the table's rows (token ids) split
//    over tp; each rank looks up the ids it owns, zeros for the others, and
//    an all-reduce sums the rows into the whole output (its backward is the
//    identity, so each rank's gradient lands in its own rows).
//  - VocabParallelCrossEntropy: cross-entropy of logits split along the
//    vocabulary (an LM head that is column-parallel without gather), never
//    gathering them: the max and the sum of exponentials are all-reduced, the
//    target's logit comes from the rank owning it. Its gradient
//    softmax - one_hot(target) is computed locally on each shard.
//
// Both equal their whole counterparts (at::embedding, at::cross_entropy) in
// value and gradient. With a null group, or one of size 1, they are those.
// Collective over tp as tp.h's operators (same calls, same order, same ids
// and targets on every rank of the group).

#include <ATen/ATen.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker_lib/parallel/layers.h"
#include "worker_lib/parallel/param.h"

namespace meshrun::worker::parallel {

// nn.Embedding: Forward(ids) with int64 ids of any shape -> [..., dim].
class Embedding : public Layer {
 public:
  // Takes a copy of `weight` ([vocab, dim]).
  Embedding(std::string name, const at::Tensor& weight);
  // nn.Embedding's initialisation (N(0, 1)) from `generator`.
  static std::shared_ptr<Embedding> Init(const std::string& name, int64_t vocab,
                                         int64_t dim, at::Generator& generator);

  at::Tensor Forward(const at::Tensor& ids) override;
  std::vector<std::shared_ptr<Param>> Params() const override { return {weight_}; }
  // "Embedding(64, 32)".
  std::string Describe() const override;

  const std::string& name() const { return name_; }
  const std::shared_ptr<Param>& weight() const { return weight_; }

 private:
  std::string name_;
  std::shared_ptr<Param> weight_;
};

// An Embedding whose rows are split over tp (Shard(dim=0)): rank r owns ids
// [r * vocab / tp, (r + 1) * vocab / tp).
class VocabParallelEmbedding : public Layer {
 public:
  // `weight` holds this rank's rows, already sharded over `tp`.
  VocabParallelEmbedding(std::string name, std::shared_ptr<Param> weight,
                         ProcessGroupPtr tp);

  at::Tensor Forward(const at::Tensor& ids) override;
  std::vector<std::shared_ptr<Param>> Params() const override { return {weight_}; }
  // "VocabParallelEmbedding(64, 32, tp=2)".
  std::string Describe() const override;

  const std::shared_ptr<Param>& weight() const { return weight_; }

 private:
  std::string name_;
  std::shared_ptr<Param> weight_;
  ProcessGroupPtr tp_;
  int64_t vocab_start_ = 0;  // the first id this rank owns
  int64_t vocab_local_ = 0;  // how many it owns
};

// A vocab-parallel copy of the whole `embedding` (its weight copied and
// sharded with Param::Shard(mesh_dim, 0, tp)). Errors: already sharded;
// vocab not divisible by the group size.
absl::StatusOr<std::shared_ptr<VocabParallelEmbedding>> VocabParallel(
    const Embedding& embedding, const std::string& mesh_dim, ProcessGroupPtr tp);

// Per-token cross-entropy (no reduction) of `logits` ([..., vocab / tp], this
// rank's contiguous slice of the vocabulary, rank order) against int64
// `targets` ([...], global ids in [0, vocab)); returns [...] float.
// Differentiable w.r.t. `logits`. Equals at::cross_entropy(reduction=none)
// of the gathered logits.
at::Tensor VocabParallelCrossEntropy(const at::Tensor& logits, const at::Tensor& targets,
                                     const ProcessGroupPtr& tp);

}  // namespace meshrun::worker::parallel
