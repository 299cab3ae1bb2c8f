#include "worker_lib/parallel/layers.h"

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>

#include "absl/strings/str_cat.h"

namespace meshrun::worker::parallel {

Linear::Linear(const std::string& name, const at::Tensor& weight, const at::Tensor& bias)
    : name_(name), weight_(Param::FromFull(name + ".weight", weight)) {
  if (bias.defined()) bias_ = Param::FromFull(name + ".bias", bias);
}

std::shared_ptr<Linear> Linear::Init(const std::string& name, int64_t in, int64_t out,
                                     bool bias, at::Generator& generator) {
  const double bound = 1.0 / std::sqrt(static_cast<double>(in));
  at::Tensor weight = at::empty({out, in}, at::kFloat).uniform_(-bound, bound, generator);
  at::Tensor b;
  if (bias) b = at::empty({out}, at::kFloat).uniform_(-bound, bound, generator);
  return std::make_shared<Linear>(name, weight, b);
}

at::Tensor Linear::Forward(const at::Tensor& input) {
  return at::linear(input, weight_->Compute(), bias_ ? bias_->Compute() : at::Tensor());
}

std::vector<std::shared_ptr<Param>> Linear::Params() const {
  if (bias_) return {weight_, bias_};
  return {weight_};
}

std::string Linear::Describe() const {
  return absl::StrCat("Linear(", weight_->global_shape()[1], " -> ",
                      weight_->global_shape()[0], ")");
}

at::Tensor Sequential::Forward(const at::Tensor& input) const {
  at::Tensor x = input;
  for (const LayerPtr& layer : layers) x = layer->Forward(x);
  return x;
}

std::vector<std::shared_ptr<Param>> Sequential::Params() const {
  std::vector<std::shared_ptr<Param>> params;
  for (const LayerPtr& layer : layers) {
    for (auto& param : layer->Params()) params.push_back(param);
  }
  return params;
}

std::vector<at::Tensor> Sequential::Leaves() const {
  std::vector<at::Tensor> leaves;
  for (const auto& param : Params()) leaves.push_back(param->data());
  return leaves;
}

Sequential MakeMlp(const std::vector<int64_t>& sizes, uint64_t seed, bool bias) {
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  Sequential model;
  for (size_t i = 0; i + 1 < sizes.size(); ++i) {
    if (i > 0) model.layers.push_back(std::make_shared<Relu>());
    model.layers.push_back(
        Linear::Init(absl::StrCat("fc", i), sizes[i], sizes[i + 1], bias, generator));
  }
  return model;
}

}  // namespace meshrun::worker::parallel
