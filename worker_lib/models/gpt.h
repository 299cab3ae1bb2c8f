#pragma once

// A GPT in plain libtorch (torch::nn): token and position embeddings,
// pre-norm blocks of causal self-attention and a GELU MLP, a final layer norm
// and a linear head to the vocabulary. The parallelisms are applied from
// outside (FullyShard, ParallelizeModule with GptTpPlan,
// DistributedDataParallel, pipeline stages of GptStage; or all of them
// through ModuleTrainer with GptModel), as a user does with their own model;
// what it knows of meshrun is that it calls the modules they change through
// parallel::Forward (module_hooks.h), which runs their hooks.
//
//   Gpt gpt(GptConfig{.vocab = 96, .context = 64, .dim = 128, .heads = 4, .layers = 4});
//   at::Tensor logits = parallel::Forward(gpt, tokens);   // [B, T] -> [B, T, vocab]
//
// Attention reads its head count from its input (view(B, T, -1, head_dim)),
// so it runs on the local heads when q, k and v are column-wise parallel.

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "worker_lib/parallel/module_hooks.h"
#include "worker_lib/parallel/parallelize.h"
#include "worker_lib/training/module_trainer.h"

namespace meshrun::worker::models {

struct GptConfig {
  int64_t vocab = 96;
  int64_t context = 64;
  int64_t dim = 128;
  int64_t heads = 4;
  int64_t layers = 4;
};

struct CausalSelfAttentionImpl : torch::nn::Module {
  explicit CausalSelfAttentionImpl(const GptConfig& config)
      : head_dim(config.dim / config.heads),
        q(register_module("q", Projection(config))),
        k(register_module("k", Projection(config))),
        v(register_module("v", Projection(config))),
        o(register_module("o", Projection(config))) {}

  // No biases, as in LLaMA: a key bias adds one constant to a row's scores,
  // which softmax ignores (its gradient is rounding noise, which Adam
  // scales up).
  static torch::nn::Linear Projection(const GptConfig& config) {
    return torch::nn::Linear(
        torch::nn::LinearOptions(config.dim, config.dim).bias(false));
  }

  at::Tensor forward(const at::Tensor& x) {
    const int64_t batch = x.size(0), time = x.size(1);
    auto heads = [&](const at::Tensor& t) {
      return t.view({batch, time, -1, head_dim}).transpose(1, 2);
    };
    at::Tensor y = at::scaled_dot_product_attention(
        heads(parallel::Forward(q, x)), heads(parallel::Forward(k, x)),
        heads(parallel::Forward(v, x)), /*attn_mask=*/{},
        /*dropout_p=*/0.0, /*is_causal=*/true);
    return parallel::Forward(o, y.transpose(1, 2).reshape({batch, time, -1}));
  }

  int64_t head_dim;
  torch::nn::Linear q, k, v, o;
};
TORCH_MODULE(CausalSelfAttention);

struct GptMlpImpl : torch::nn::Module {
  explicit GptMlpImpl(const GptConfig& config)
      : fc1(register_module("fc1", torch::nn::Linear(config.dim, 4 * config.dim))),
        fc2(register_module("fc2", torch::nn::Linear(4 * config.dim, config.dim))) {}
  at::Tensor forward(const at::Tensor& x) {
    return parallel::Forward(fc2, at::gelu(parallel::Forward(fc1, x)));
  }
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(GptMlp);

struct GptBlockImpl : torch::nn::Module {
  explicit GptBlockImpl(const GptConfig& config)
      : ln1(register_module(
            "ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({config.dim})))),
        attn(register_module("attn", CausalSelfAttention(config))),
        ln2(register_module(
            "ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({config.dim})))),
        mlp(register_module("mlp", GptMlp(config))) {}
  at::Tensor forward(at::Tensor x) {
    x = x + attn->forward(ln1->forward(x));
    return x + mlp->forward(ln2->forward(x));
  }
  torch::nn::LayerNorm ln1;
  CausalSelfAttention attn;
  torch::nn::LayerNorm ln2;
  GptMlp mlp;
};
TORCH_MODULE(GptBlock);

struct GptImpl : torch::nn::Module {
  explicit GptImpl(const GptConfig& config)
      : tok(register_module("tok", torch::nn::Embedding(config.vocab, config.dim))),
        pos(register_module("pos", torch::nn::Embedding(config.context, config.dim))),
        blocks(register_module("blocks", torch::nn::ModuleList())),
        ln_f(register_module(
            "ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({config.dim})))),
        head(register_module(
            "head",
            torch::nn::Linear(
                torch::nn::LinearOptions(config.dim, config.vocab).bias(false)))) {
    for (int64_t i = 0; i < config.layers; ++i) blocks->push_back(GptBlock(config));
  }

  // tokens [B, T] (int64, T <= context) -> logits [B, T, vocab].
  at::Tensor forward(const at::Tensor& tokens) {
    at::Tensor positions = at::arange(tokens.size(1), tokens.options());
    at::Tensor x = tok->forward(tokens) + pos->forward(positions);
    for (const auto& block : *blocks) x = parallel::Forward(block->as<GptBlockImpl>(), x);
    return parallel::Forward(head, ln_f->forward(x));
  }

  torch::nn::Embedding tok, pos;
  torch::nn::ModuleList blocks;
  torch::nn::LayerNorm ln_f;
  torch::nn::Linear head;
};
TORCH_MODULE(Gpt);

// Megatron's layout for the blocks (PyTorch's TP tutorial plan): q, k, v and
// fc1 column-wise, o and fc2 row-wise. With `vocab_parallel_head` the head
// is column-wise too: the logits are then this rank's slice of the
// vocabulary, for LossParallel (parallelize.h) rather than a cross-entropy.
inline parallel::ParallelizePlan GptTpPlan(bool vocab_parallel_head = false) {
  using parallel::ColwiseParallel;
  using parallel::RowwiseParallel;
  parallel::ParallelizePlan plan = {
      {"blocks.*.attn.q", ColwiseParallel()},  {"blocks.*.attn.k", ColwiseParallel()},
      {"blocks.*.attn.v", ColwiseParallel()},  {"blocks.*.attn.o", RowwiseParallel()},
      {"blocks.*.mlp.fc1", ColwiseParallel()}, {"blocks.*.mlp.fc2", RowwiseParallel()}};
  if (vocab_parallel_head) plan.emplace_back("head", ColwiseParallel());
  return plan;
}

// A pipeline stage: parts [first, last] of the whole GPT, sharing its modules
// (part 0 the embeddings, 1..layers the blocks, layers + 1 the final norm and
// head), as TorchTitan cuts its models.
struct GptStageImpl : torch::nn::Module {
  GptStageImpl(const Gpt& gpt, int first_part, int last_part)
      : first(first_part), last(last_part), whole(gpt) {
    const int layers = static_cast<int>(gpt->blocks->size());
    for (int part = first; part <= last; ++part) {
      if (part == 0) {
        register_module("tok", gpt->tok);
        register_module("pos", gpt->pos);
      } else if (part <= layers) {
        register_module("block" + std::to_string(part - 1), (*gpt->blocks)[part - 1]);
      } else {
        register_module("ln_f", gpt->ln_f);
        register_module("head", gpt->head);
      }
    }
  }
  at::Tensor forward(at::Tensor x) {
    const int layers = static_cast<int>(whole->blocks->size());
    for (int part = first; part <= last; ++part) {
      if (part == 0) {
        x = whole->tok->forward(x) +
            whole->pos->forward(at::arange(x.size(1), x.options()));
      } else if (part <= layers) {
        x = parallel::Forward((*whole->blocks)[part - 1]->as<GptBlockImpl>(), x);
      } else {
        x = parallel::Forward(whole->head, whole->ln_f->forward(x));
      }
    }
    return x;
  }
  int first, last;
  Gpt whole{nullptr};
};
TORCH_MODULE(GptStage);

// The cross-entropy of logits [B, T, vocab] against targets [B, T].
inline at::Tensor GptLoss(const at::Tensor& logits, const at::Tensor& targets) {
  return at::cross_entropy_loss(logits.flatten(0, 1), targets.flatten());
}

// What ModuleTrainer needs of the GPT: every block a FullyShard unit,
// GptTpPlan (with `vocab_parallel_head`, LossParallel on the head's slices),
// its parts for pipeline stages.
inline parallel::ModuleModel GptModel(const Gpt& gpt, bool vocab_parallel_head) {
  parallel::ModuleModel model;
  model.root = gpt.ptr();
  for (const auto& block : *gpt->blocks) model.shard_units.push_back(block);
  model.tp_plan = GptTpPlan(vocab_parallel_head);
  model.vocab_parallel_output = vocab_parallel_head;
  model.forward = [impl = gpt.ptr()](const at::Tensor& tokens) {
    return parallel::Forward(impl, tokens);
  };
  model.loss = GptLoss;
  model.num_parts = static_cast<int>(gpt->blocks->size()) + 2;
  model.stage_of = [gpt](int first, int last) {
    return torch::nn::AnyModule(GptStage(gpt, first, last));
  };
  return model;
}

}  // namespace meshrun::worker::models
