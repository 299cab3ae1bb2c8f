"""The Python twin of gpt.h: the same GPT in torch.nn, with the same module
and parameter names (tok, pos, blocks.N.{ln1,attn.{q,k,v,o},ln2,mlp.{fc1,fc2}},
ln_f, head), so that a state dict moves between the two. PyTorch's own
parallelisms (fully_shard, DDP, parallelize_module, pipelining) are applied to
it from outside, as gpt.h's are meshrun's; gpt_tp_plan() is gpt.h's
GptTpPlan().
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class GptConfig:
    vocab: int = 96
    context: int = 64
    dim: int = 128
    heads: int = 4
    layers: int = 4


class CausalSelfAttention(nn.Module):
    def __init__(self, config: GptConfig) -> None:
        super().__init__()
        self.head_dim = config.dim // config.heads
        self.q = nn.Linear(config.dim, config.dim, bias=False)
        self.k = nn.Linear(config.dim, config.dim, bias=False)
        self.v = nn.Linear(config.dim, config.dim, bias=False)
        self.o = nn.Linear(config.dim, config.dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, time = x.shape[0], x.shape[1]

        def heads(t: torch.Tensor) -> torch.Tensor:
            # -1: the local heads when q, k and v are column-wise parallel.
            return t.view(batch, time, -1, self.head_dim).transpose(1, 2)

        y = F.scaled_dot_product_attention(
            heads(self.q(x)), heads(self.k(x)), heads(self.v(x)), is_causal=True
        )
        return self.o(y.transpose(1, 2).reshape(batch, time, -1))


class GptMlp(nn.Module):
    def __init__(self, config: GptConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(config.dim, 4 * config.dim)
        self.fc2 = nn.Linear(4 * config.dim, config.dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class GptBlock(nn.Module):
    def __init__(self, config: GptConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(config.dim)
        self.attn = CausalSelfAttention(config)
        self.ln2 = nn.LayerNorm(config.dim)
        self.mlp = GptMlp(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Gpt(nn.Module):
    def __init__(self, config: GptConfig) -> None:
        super().__init__()
        # Made in gpt.h's order (the blocks last), so one seed gives the
        # same initial weights on both sides.
        self.tok = nn.Embedding(config.vocab, config.dim)
        self.pos = nn.Embedding(config.context, config.dim)
        self.blocks = nn.ModuleList()
        self.ln_f = nn.LayerNorm(config.dim)
        self.head = nn.Linear(config.dim, config.vocab, bias=False)
        for _ in range(config.layers):
            self.blocks.append(GptBlock(config))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.tok(tokens) + self.pos(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def gpt_tp_plan(layers: int, vocab_parallel_head: bool = False) -> dict[str, object]:
    """gpt.h's GptTpPlan for torch.distributed.tensor.parallel.parallelize_module
    on the whole GPT: q, k, v and fc1 column-wise, o and fc2 row-wise; with
    `vocab_parallel_head` the head column-wise with its logits left split
    along the vocabulary (Shard(-1) DTensors) for loss_parallel()."""
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    plan: dict[str, object] = {}
    for i in range(layers):
        for name in ("q", "k", "v"):
            plan[f"blocks.{i}.attn.{name}"] = ColwiseParallel()
        plan[f"blocks.{i}.attn.o"] = RowwiseParallel()
        plan[f"blocks.{i}.mlp.fc1"] = ColwiseParallel()
        plan[f"blocks.{i}.mlp.fc2"] = RowwiseParallel()
    if vocab_parallel_head:
        plan["head"] = ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)
    return plan
