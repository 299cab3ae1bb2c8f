#pragma once

// The layers parallel training works on: a model is a sequence of layers
// (pipeline stages cut it between layers), each owning Params (param.h) that
// TP, FSDP and DP shard and synchronise. Layers compute with
// Param::Compute(), so a layer does not know whether its weight is whole,
// TP-sharded or FSDP-sharded.
//
// Models are built whole and identically on every rank (same seed), then
// parallelised (tp.h replaces layers by tensor-parallel ones, fsdp.h shards
// their params, pp.h keeps a stage's layers), as PyTorch's
// parallelize_module / fully_shard do, so a single-process run of the same
// model is the reference for parity.

#include <ATen/ATen.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "worker_lib/parallel/param.h"

namespace meshrun::worker::parallel {

class Layer {
 public:
  virtual ~Layer() = default;
  virtual at::Tensor Forward(const at::Tensor& input) = 0;
  // Its parameters in a fixed order, the same on every rank holding it.
  virtual std::vector<std::shared_ptr<Param>> Params() const { return {}; }
  // "Linear(50 -> 4)".
  virtual std::string Describe() const = 0;
};

using LayerPtr = std::shared_ptr<Layer>;

// nn.Linear: y = x W^T + b, W of shape [out, in].
class Linear : public Layer {
 public:
  // Takes copies of `weight` ([out, in]) and `bias` ([out], or undefined for none).
  Linear(const std::string& name, const at::Tensor& weight, const at::Tensor& bias);
  // nn.Linear's default initialisation (uniform +-1/sqrt(in)), from `generator`.
  static std::shared_ptr<Linear> Init(const std::string& name, int64_t in, int64_t out,
                                      bool bias, at::Generator& generator);

  at::Tensor Forward(const at::Tensor& input) override;
  std::vector<std::shared_ptr<Param>> Params() const override;
  std::string Describe() const override;

  const std::shared_ptr<Param>& weight() const { return weight_; }
  const std::shared_ptr<Param>& bias() const { return bias_; }  // null without bias
  const std::string& name() const { return name_; }

 private:
  std::string name_;
  std::shared_ptr<Param> weight_;
  std::shared_ptr<Param> bias_;
};

class Relu : public Layer {
 public:
  at::Tensor Forward(const at::Tensor& input) override { return at::relu(input); }
  std::string Describe() const override { return "ReLU()"; }
};

// A model: layers applied in order.
struct Sequential {
  std::vector<LayerPtr> layers;

  at::Tensor Forward(const at::Tensor& input) const;
  // Every layer's params, in layer order.
  std::vector<std::shared_ptr<Param>> Params() const;
  // Their data() leaves, for an optimizer.
  std::vector<at::Tensor> Leaves() const;
};

// An MLP of Linear layers with ReLU between them: sizes {50, 50, 50, 50, 4}
// gives seed 003's four layers (50x50 three times, then 50x4). Layer names
// "fc0", "fc1", ...; deterministic in `seed`.
Sequential MakeMlp(const std::vector<int64_t>& sizes, uint64_t seed, bool bias = true);

}  // namespace meshrun::worker::parallel
