#pragma once

// A small GPT-style language model for the parallel-training example and
// tests, built whole from a seed and tensor-parallelised in place:
//
//   token ids [batch, seq] -> Embedding -> N x TransformerBlock -> LayerNorm
//     -> LM head (Linear, no bias) -> logits [batch, seq, vocab]
//     -> cross-entropy against the next tokens
//
// TransformerBlock is pre-LN: x + Attn(LN1(x)), then x + MLP(LN2(x)), with
// causal multi-head self-attention (separate q, k, v projections) and a GELU
// MLP. Tensor-parallel (Megatron-LM): the heads are split over tp (q, k, v
// column-parallel, sharing one f; the output projection row-parallel), the
// MLP is column -> row, the layer norms are replicated; the embedding is
// vocab-parallel and the head column-parallel with its logits left split
// along the vocabulary for VocabParallelCrossEntropy (vocab.h). Two
// all-reduces per block forward, two in backward.
//
// The model is a Sequential (embedding first, head last) so that pipeline
// stages can cut it between layers and FSDP can shard its params; every
// layer computes with Param::Compute(). The first layer takes int64 token
// ids, the others [batch, seq, d_model] activations.

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "worker_lib/parallel/data.h"
#include "worker_lib/parallel/layers.h"
#include "worker_lib/parallel/param.h"

namespace meshrun::worker::parallel {

struct TransformerConfig {
  int64_t vocab = 64;
  int64_t d_model = 32;
  int64_t heads = 4;
  int64_t d_ff = 64;  // the MLP's hidden size
  int64_t layers = 2;
  int64_t seq = 8;  // the longest sequence (the synthetic data's length)
};

// nn.LayerNorm over the last dim (eps 1e-5), with weight and bias.
class LayerNorm : public Layer {
 public:
  LayerNorm(const std::string& name, const at::Tensor& weight, const at::Tensor& bias);

  at::Tensor Forward(const at::Tensor& input) override;
  std::vector<std::shared_ptr<Param>> Params() const override { return {weight_, bias_}; }
  std::string Describe() const override;

 private:
  std::shared_ptr<Param> weight_;
  std::shared_ptr<Param> bias_;
};

// One pre-LN block on [batch, seq, d_model] (see the file comment).
class TransformerBlock : public Layer {
 public:
  // Whole, initialised from `generator`: Linear::Init for the projections,
  // layer norms with weight 1 + N(0, 0.1) and bias N(0, 0.1) (so that their
  // gradients are not symmetric in the tests).
  TransformerBlock(const std::string& name, const TransformerConfig& config,
                   at::Generator& generator);

  at::Tensor Forward(const at::Tensor& x) override;
  // ln1 (weight, bias), q, k, v, o, ln2, fc1, fc2 (weight, bias each); the
  // order is the same whole and tensor-parallel.
  std::vector<std::shared_ptr<Param>> Params() const override;
  std::string Describe() const override;

  // Splits the heads and the MLP over `tp` (see the file comment). Errors
  // (heads or d_ff not divisible by the group size, already parallel) leave
  // the block unchanged.
  absl::Status Parallelize(const std::string& mesh_dim, ProcessGroupPtr tp);

 private:
  std::string name_;
  int64_t head_dim_;
  int64_t heads_;
  LayerPtr ln1_, q_, k_, v_, o_, ln2_, fc1_, fc2_;
  ProcessGroupPtr tp_;  // null while whole
};

// The language model of the file comment.
class TransformerLm {
 public:
  // The whole model, the same on every rank for the same seed.
  static TransformerLm Make(const TransformerConfig& config, uint64_t seed);

  // Tensor-parallel in place over `tp` (a null group or size 1: unchanged).
  // Errors (uneven splits, named with their sizes) leave it whole.
  absl::Status Parallelize(const std::string& mesh_dim, ProcessGroupPtr tp);

  // Logits [batch, seq, vocab / tp] of int64 `tokens` [batch, seq]: this
  // rank's slice of the vocabulary when tensor-parallel.
  at::Tensor Forward(const at::Tensor& tokens);
  // Per-token cross-entropy of `logits` (from Forward, or from the last
  // pipeline stage) against `targets` [batch, seq], averaged over tokens.
  at::Tensor LossOfLogits(const at::Tensor& logits, const at::Tensor& targets) const;
  // LossOfLogits(Forward(tokens), targets).
  at::Tensor Loss(const at::Tensor& tokens, const at::Tensor& targets);

  const TransformerConfig& config() const { return config_; }
  // The layers: embedding, blocks, final layer norm, head.
  Sequential& model() { return model_; }
  const Sequential& model() const { return model_; }
  const ProcessGroupPtr& tp() const { return tp_; }

 private:
  TransformerConfig config_;
  Sequential model_;
  ProcessGroupPtr tp_;
};

// TokenBatch and SyntheticTokens: data.h.

}  // namespace meshrun::worker::parallel
