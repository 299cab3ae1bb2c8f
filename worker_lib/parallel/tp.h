#pragma once

// Tensor parallelism (Megatron-LM): linear layers split across the ranks of a
// `tp` group, joined by conjugate autograd operators so that forward and
// backward each need one collective per column -> row pair.
//
//   f = CopyToTpRegion      forward identity     backward all-reduce
//   g = ReduceFromTpRegion  forward all-reduce   backward identity
//
//   x -> f -> ColumnParallel (W1 rows split: local h) -> act
//        -> RowParallel (W2 columns split: partial y) -> g -> + b2
//
// Layers are converted from whole ones (layers.h), as PyTorch's
// parallelize_module does: every rank builds the same whole model from a
// seed, then keeps its shard. A tensor-parallel layer's replicated tensors
// (a row-parallel bias, its outputs after g) get identical values and
// gradients on every rank of the group by construction, so they need no
// extra synchronisation. Layers compute with Param::Compute() only, so FSDP
// may shard their params further (after TP).
//
// Collective: every rank of the tp group runs the same layers on the same
// input (tensor-parallel ranks see the same data), in the same order, in
// forward and backward. A null group, or one of size 1, makes every
// operator the identity and the layers compute as whole ones.

#include <ATen/ATen.h>

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker_lib/parallel/layers.h"
#include "worker_lib/parallel/param.h"

namespace meshrun::worker::parallel {

// The conjugate operators; differentiable w.r.t. `x`.
// f: forward identity, backward all-reduce (sum) of the gradient.
at::Tensor CopyToTpRegion(const at::Tensor& x, const ProcessGroupPtr& tp);
// g: forward all-reduce (sum), backward identity.
at::Tensor ReduceFromTpRegion(const at::Tensor& x, const ProcessGroupPtr& tp);
// Forward all-gather along the last dim (rank order), backward keeps this
// rank's slice of the gradient.
at::Tensor GatherFromTpRegion(const at::Tensor& x, const ProcessGroupPtr& tp);
// Forward keeps this rank's slice along the last dim (which must split
// evenly), backward all-gathers the gradient.
at::Tensor ScatterToTpRegion(const at::Tensor& x, const ProcessGroupPtr& tp);

struct ColumnParallelOptions {
  // All-gather the output shards into the whole output (replicated);
  // otherwise the output stays split along its last dim.
  bool gather_output = false;
  // Pass the input through f. Turn off when the caller already did, e.g. for
  // q, k and v reading one input: f once, one all-reduce in backward.
  bool copy_input = true;
};

// nn.Linear with the weight's rows (output features) and the bias split over
// tp: y_local = x W_local^T + b_local.
class ColumnParallelLinear : public Layer {
 public:
  ColumnParallelLinear(std::string name, std::shared_ptr<Param> weight,
                       std::shared_ptr<Param> bias, ProcessGroupPtr tp,
                       ColumnParallelOptions options);

  at::Tensor Forward(const at::Tensor& input) override;
  std::vector<std::shared_ptr<Param>> Params() const override;
  // "ColumnParallelLinear(50 -> 50, tp=2, gather_output)".
  std::string Describe() const override;

  const std::shared_ptr<Param>& weight() const { return weight_; }
  const std::shared_ptr<Param>& bias() const { return bias_; }

 private:
  std::string name_;
  std::shared_ptr<Param> weight_;
  std::shared_ptr<Param> bias_;  // null without bias
  ProcessGroupPtr tp_;
  ColumnParallelOptions options_;
};

// nn.Linear with the weight's columns (input features) split over tp: each
// rank multiplies its slice of the input, g sums the partial outputs, then
// the (replicated) bias is added once.
class RowParallelLinear : public Layer {
 public:
  // `input_is_parallel`: the input arrives split along its last dim (from a
  // column-parallel layer without gather); otherwise it is whole and this
  // layer keeps its slice (ScatterToTpRegion).
  RowParallelLinear(std::string name, std::shared_ptr<Param> weight,
                    std::shared_ptr<Param> bias, ProcessGroupPtr tp,
                    bool input_is_parallel);

  at::Tensor Forward(const at::Tensor& input) override;
  std::vector<std::shared_ptr<Param>> Params() const override;
  // "RowParallelLinear(50 -> 4, tp=2)".
  std::string Describe() const override;

  const std::shared_ptr<Param>& weight() const { return weight_; }
  const std::shared_ptr<Param>& bias() const { return bias_; }

 private:
  std::string name_;
  std::shared_ptr<Param> weight_;
  std::shared_ptr<Param> bias_;
  ProcessGroupPtr tp_;
  bool input_is_parallel_;
};

// A column-parallel copy of the whole `linear` (its params are copied and
// sharded with Param::Shard(mesh_dim, 0, tp); `linear` is left as it is).
// Errors: `linear` already sharded; out_features not divisible by the group
// size (the message names the param and the sizes).
absl::StatusOr<std::shared_ptr<ColumnParallelLinear>> ColwiseParallel(
    const Linear& linear, const std::string& mesh_dim, ProcessGroupPtr tp,
    ColumnParallelOptions options = {});
absl::StatusOr<std::shared_ptr<ColumnParallelLinear>> ColwiseParallel(
    const Linear& linear, const std::string& mesh_dim, ProcessGroupPtr tp,
    bool gather_output);
// A row-parallel copy of the whole `linear` (weight sharded on dim 1, bias
// replicated). Errors as ColwiseParallel, for in_features.
absl::StatusOr<std::shared_ptr<RowParallelLinear>> RowwiseParallel(
    const Linear& linear, const std::string& mesh_dim, ProcessGroupPtr tp,
    bool input_is_parallel = true);

// Makes the Linear layers of `model` tensor-parallel in place: consecutive
// Linears pair up column -> row (the activations between them stay split,
// one all-reduce each way per pair); an odd last Linear becomes
// column-parallel with a gathered output. Other layers (ReLU) must be
// elementwise: they run on the split activations. With
// MakeMlp({50, 50, 50, 50, 4}) and tp=2: fc0 col [25, 50], fc1 row [50, 25],
// fc2 col, fc3 row [4, 25]. On error the model is left unchanged.
absl::Status ParallelizeMlp(Sequential& model, const std::string& mesh_dim,
                            ProcessGroupPtr tp);

// Size and rank in `tp`, with a null group counting as a group of one.
int TpSize(const ProcessGroupPtr& tp);
int TpRank(const ProcessGroupPtr& tp);

}  // namespace meshrun::worker::parallel
