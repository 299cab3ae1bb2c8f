#include "worker_lib/parallel/transformer.h"

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "worker_lib/parallel/tp.h"
#include "worker_lib/parallel/vocab.h"

namespace meshrun::worker::parallel {

namespace {

std::shared_ptr<LayerNorm> InitLayerNorm(const std::string& name, int64_t dim,
                                         at::Generator& generator) {
  at::Tensor weight = at::empty({dim}, at::kFloat).normal_(0, 0.1, generator).add_(1);
  at::Tensor bias = at::empty({dim}, at::kFloat).normal_(0, 0.1, generator);
  return std::make_shared<LayerNorm>(name, weight, bias);
}

const Linear& AsLinear(const LayerPtr& layer) {
  return dynamic_cast<const Linear&>(*layer);
}

absl::Status CheckDivisible(const std::string& what, int64_t size, int parts,
                            const std::string& mesh_dim) {
  if (size % parts == 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(what, " ", size,
                                                 " does not split evenly over ", parts,
                                                 " ranks of '", mesh_dim, "'"));
}

}  // namespace

LayerNorm::LayerNorm(const std::string& name, const at::Tensor& weight,
                     const at::Tensor& bias)
    : weight_(Param::FromFull(name + ".weight", weight)),
      bias_(Param::FromFull(name + ".bias", bias)) {}

at::Tensor LayerNorm::Forward(const at::Tensor& input) {
  return at::layer_norm(input, {weight_->global_shape()[0]}, weight_->Compute(),
                        bias_->Compute(), 1e-5);
}

std::string LayerNorm::Describe() const {
  return absl::StrCat("LayerNorm(", weight_->global_shape()[0], ")");
}

TransformerBlock::TransformerBlock(const std::string& name,
                                   const TransformerConfig& config,
                                   at::Generator& generator)
    : name_(name), head_dim_(config.d_model / config.heads), heads_(config.heads) {
  TORCH_CHECK(config.d_model % config.heads == 0, "d_model ", config.d_model,
              " is not a multiple of ", config.heads, " heads");
  const int64_t d = config.d_model;
  ln1_ = InitLayerNorm(name + ".ln1", d, generator);
  q_ = Linear::Init(name + ".attn.q", d, d, true, generator);
  k_ = Linear::Init(name + ".attn.k", d, d, true, generator);
  v_ = Linear::Init(name + ".attn.v", d, d, true, generator);
  o_ = Linear::Init(name + ".attn.o", d, d, true, generator);
  ln2_ = InitLayerNorm(name + ".ln2", d, generator);
  fc1_ = Linear::Init(name + ".mlp.fc1", d, config.d_ff, true, generator);
  fc2_ = Linear::Init(name + ".mlp.fc2", config.d_ff, d, true, generator);
}

at::Tensor TransformerBlock::Forward(const at::Tensor& x) {
  TORCH_CHECK(x.dim() == 3, name_, " takes [batch, seq, d_model], got ", x.sizes());
  const int64_t batch = x.size(0);
  const int64_t seq = x.size(1);
  // f once for q, k and v: one all-reduce of dL/dh in backward.
  at::Tensor h = CopyToTpRegion(ln1_->Forward(x), tp_);
  // This rank's heads: [batch, heads_local, seq, head_dim].
  auto heads = [&](const at::Tensor& t) {
    return t.view({batch, seq, -1, head_dim_}).transpose(1, 2);
  };
  at::Tensor q = heads(q_->Forward(h));
  at::Tensor k = heads(k_->Forward(h));
  at::Tensor v = heads(v_->Forward(h));
  at::Tensor scores =
      at::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(head_dim_));
  at::Tensor future = at::ones({seq, seq}, x.options().dtype(at::kBool)).triu(1);
  scores = scores.masked_fill(future, -std::numeric_limits<float>::infinity());
  at::Tensor context =
      at::matmul(at::softmax(scores, -1), v).transpose(1, 2).reshape({batch, seq, -1});
  at::Tensor y = x + o_->Forward(context);
  return y + fc2_->Forward(at::gelu(fc1_->Forward(ln2_->Forward(y))));
}

std::vector<std::shared_ptr<Param>> TransformerBlock::Params() const {
  std::vector<std::shared_ptr<Param>> params;
  for (const LayerPtr& layer : {ln1_, q_, k_, v_, o_, ln2_, fc1_, fc2_}) {
    for (auto& param : layer->Params()) params.push_back(param);
  }
  return params;
}

std::string TransformerBlock::Describe() const {
  return absl::StrCat("TransformerBlock(d_model=", heads_ * head_dim_, ", heads=", heads_,
                      ", tp=", TpSize(tp_), ")");
}

absl::Status TransformerBlock::Parallelize(const std::string& mesh_dim,
                                           ProcessGroupPtr tp) {
  if (tp_) {
    return absl::FailedPreconditionError(name_ + " is already tensor-parallel");
  }
  const int parts = TpSize(tp);
  if (parts == 1) return absl::OkStatus();
  if (absl::Status s = CheckDivisible(name_ + ": heads", heads_, parts, mesh_dim);
      !s.ok()) {
    return s;
  }
  ColumnParallelOptions shared_input;
  shared_input.copy_input = false;  // Forward applies f once for q, k, v
  auto q = ColwiseParallel(AsLinear(q_), mesh_dim, tp, shared_input);
  auto k = ColwiseParallel(AsLinear(k_), mesh_dim, tp, shared_input);
  auto v = ColwiseParallel(AsLinear(v_), mesh_dim, tp, shared_input);
  auto o = RowwiseParallel(AsLinear(o_), mesh_dim, tp, /*input_is_parallel=*/true);
  auto fc1 = ColwiseParallel(AsLinear(fc1_), mesh_dim, tp, /*gather_output=*/false);
  auto fc2 = RowwiseParallel(AsLinear(fc2_), mesh_dim, tp, /*input_is_parallel=*/true);
  for (const absl::Status& s :
       {q.status(), k.status(), v.status(), o.status(), fc1.status(), fc2.status()}) {
    if (!s.ok()) return s;
  }
  q_ = *q;
  k_ = *k;
  v_ = *v;
  o_ = *o;
  fc1_ = *fc1;
  fc2_ = *fc2;
  tp_ = std::move(tp);
  return absl::OkStatus();
}

TransformerLm TransformerLm::Make(const TransformerConfig& config, uint64_t seed) {
  at::Generator generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  TransformerLm lm;
  lm.config_ = config;
  lm.model_.layers.push_back(
      Embedding::Init("embed", config.vocab, config.d_model, generator));
  for (int64_t i = 0; i < config.layers; ++i) {
    lm.model_.layers.push_back(std::make_shared<TransformerBlock>(
        absl::StrCat("blocks.", i), config, generator));
  }
  lm.model_.layers.push_back(InitLayerNorm("ln_f", config.d_model, generator));
  lm.model_.layers.push_back(
      Linear::Init("head", config.d_model, config.vocab, /*bias=*/false, generator));
  return lm;
}

absl::Status TransformerLm::Parallelize(const std::string& mesh_dim, ProcessGroupPtr tp) {
  if (tp_) return absl::FailedPreconditionError("the model is already tensor-parallel");
  const int parts = TpSize(tp);
  if (parts == 1) return absl::OkStatus();
  // Every split checked first, so that an error leaves the model whole.
  for (const auto& [what, size] : std::vector<std::pair<std::string, int64_t>>{
           {"vocab", config_.vocab}, {"heads", config_.heads}, {"d_ff", config_.d_ff}}) {
    if (absl::Status s = CheckDivisible(what, size, parts, mesh_dim); !s.ok()) return s;
  }
  std::vector<LayerPtr>& layers = model_.layers;
  auto embedding =
      VocabParallel(dynamic_cast<const Embedding&>(*layers.front()), mesh_dim, tp);
  if (!embedding.ok()) return embedding.status();
  auto head = ColwiseParallel(AsLinear(layers.back()), mesh_dim, tp,
                              /*gather_output=*/false);
  if (!head.ok()) return head.status();
  for (size_t i = 1; i + 2 < layers.size(); ++i) {
    auto& block = dynamic_cast<TransformerBlock&>(*layers[i]);
    if (absl::Status s = block.Parallelize(mesh_dim, tp); !s.ok()) return s;
  }
  layers.front() = *embedding;
  layers.back() = *head;
  tp_ = std::move(tp);
  return absl::OkStatus();
}

at::Tensor TransformerLm::Forward(const at::Tensor& tokens) {
  return model_.Forward(tokens);
}

at::Tensor TransformerLm::LossOfLogits(const at::Tensor& logits,
                                       const at::Tensor& targets) const {
  return VocabParallelCrossEntropy(logits, targets, tp_).mean();
}

at::Tensor TransformerLm::Loss(const at::Tensor& tokens, const at::Tensor& targets) {
  return LossOfLogits(Forward(tokens), targets);
}

}  // namespace meshrun::worker::parallel
