"""PyTorch's side of the GPT parity check (scripts/parity-torch.sh, model
gpt): trains the Python twin of worker_lib/models/gpt.h
(worker_lib/models/gpt.py) with PyTorch 2's own parallelisms, from the same
initial weights on the same batches as gpt_worker, and writes each step's
loss and the final parameters.

    torchrun --standalone --nproc-per-node=4 tests/parity/torch_gpt.py \\
        --layout fsdp_tp --init INIT_DIR --data DATA.pt --out OUT_DIR

As gpt_worker applies meshrun's: gpt_tp_plan (parallelize_module, the head
column-wise under loss_parallel), fully_shard on every block and the root, DDP (or
replicate() over TP's DTensors in DP x TP x PP), pipeline stages of the
GPT's parts ([embeddings], [block i]..., [final norm, head]) cut as
gpt_worker's CutParts, AdamW. Data-parallel rank i (dp-major, then fsdp)
takes the i-th contiguous block of rows; TP and pipeline ranks share them.

--sizes bench trains layouts.py's larger GPT; --time-steps times each step
as gpt_worker --time-steps does (bench_layouts.py).

Writes OUT_DIR/torch-rank<R>.pt ({"params": {name: full tensor}} from the
first rank of each pipeline stage, and "losses" on rank 0).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "worker_lib", "models"))
import layouts  # noqa: E402
from gpt import Gpt, GptConfig, gpt_tp_plan  # noqa: E402
from torch_parallel import (  # noqa: E402
    add_run_args,
    forward_backward,
    full_value,
    init_layout,
    load_initial_weights,
    make_schedule,
    print_timing,
    rss_mb,
    write_result,
)


class GptStage(nn.Module):
    """Parts [first, last] of the whole GPT (0 the embeddings, 1..layers the
    blocks, layers + 1 the final norm and head), sharing its modules."""

    def __init__(self, whole: Gpt, first: int, last: int) -> None:
        super().__init__()
        self.first, self.last = first, last
        layers = len(whole.blocks)
        self.parts = nn.ModuleList()
        for part in range(first, last + 1):
            if part == 0:
                self.parts.append(nn.ModuleList([whole.tok, whole.pos]))
            elif part <= layers:
                self.parts.append(whole.blocks[part - 1])
            else:
                self.parts.append(nn.Sequential(whole.ln_f, whole.head))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for part, module in zip(range(self.first, self.last + 1), self.parts, strict=True):
            if part == 0:
                tok, pos = module
                x = tok(x) + pos(torch.arange(x.shape[1], device=x.device))
            else:
                x = module(x)
        return x


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def loss_context(tp: int) -> contextlib.AbstractContextManager[None]:
    """loss_parallel() under TP: the head's logits are vocabulary slices."""
    if tp > 1:
        from torch.distributed.tensor.parallel import loss_parallel

        return loss_parallel()
    return contextlib.nullcontext()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_run_args(parser)
    args = parser.parse_args()
    layouts.use_sizes(args.sizes)
    layout = layouts.BY_NAME[args.layout]

    # gpt_worker's mesh order.
    mesh, rank, coord = init_layout(layout, ("dp", "fsdp", "pp", "tp"))
    dp_rank, fsdp_rank, pp_rank, tp_rank = (coord[n] for n in ("dp", "fsdp", "pp", "tp"))

    rss_before_model = rss_mb()
    config = GptConfig(**layouts.GPT)
    whole = Gpt(config)
    load_initial_weights(whole, args.init)

    if layout.tp > 1:
        from torch.distributed.tensor.parallel import parallelize_module

        plan = gpt_tp_plan(config.layers, vocab_parallel_head=True)
        parallelize_module(whole, mesh["tp"], plan)
    stage_ids = [pp_rank]
    modules: list[nn.Module] = [whole]
    if layout.pp > 1:
        parts = layouts.cut_parts(config.layers + 2, layout.pp * layout.virtual)
        stage_ids = [pp_rank + v * layout.pp for v in range(layout.virtual)]
        modules = [GptStage(whole, *parts[s]) for s in stage_ids]
    if layout.fsdp > 1:
        from torch.distributed.fsdp import fully_shard

        fsdp_mesh = mesh["dp", "fsdp"] if layout.dp > 1 else mesh["fsdp"]
        for block in whole.blocks:
            fully_shard(block, mesh=fsdp_mesh, reshard_after_forward=layout.reshard)
        fully_shard(whole, mesh=fsdp_mesh, reshard_after_forward=layout.reshard)
    elif layout.dp > 1 and (layout.tp > 1 or layout.pp > 1):
        # DDP takes no DTensors; replicate() (FSDP2's DDP) does, and
        # pipelining knows it as an FSDPModule.
        from torch.distributed._composable.replicate_with_fsdp import replicate

        modules = [replicate(m, mesh=mesh["dp"]) for m in modules]
    elif layout.dp > 1:
        modules = [nn.parallel.DistributedDataParallel(whole)]

    params = [p for m in modules for p in m.parameters()]
    optimizer = torch.optim.AdamW(params, lr=layouts.GPT_LR, weight_decay=layouts.GPT_WEIGHT_DECAY)

    schedule = None
    has_first = has_last = True
    if layout.pp > 1:
        schedule, has_first, has_last = make_schedule(
            layout, modules, stage_ids, mesh["pp"].get_group(), cross_entropy
        )

    batches = torch.load(args.data, weights_only=True)
    steps = args.steps or len(batches)
    data_parts = layout.dp * layout.fsdp
    data_index = dp_rank * layout.fsdp + fsdp_rank
    # The world's sum of what the ranks add is the global batch's mean: the
    # data ranks' mean, counted once per TP group, where the loss is.
    reports = tp_rank == 0 and has_last
    losses, step_ms, cpu_ms = [], [], []
    for step in range(steps):
        x, y = batches[step]
        rows = x.shape[0] // data_parts
        x = x[data_index * rows : (data_index + 1) * rows]
        y = y[data_index * rows : (data_index + 1) * rows]
        if args.time_steps:
            dist.barrier()
        start, cpu_start = time.perf_counter(), time.process_time()
        optimizer.zero_grad()
        with loss_context(layout.tp):
            local = forward_backward(schedule, modules[0], x, y, cross_entropy, has_first, has_last)
        optimizer.step()
        total = torch.tensor([local / data_parts if reports else 0.0], dtype=torch.float64)
        dist.all_reduce(total)
        losses.append(total.item())
        step_ms.append((time.perf_counter() - start) * 1e3)
        cpu_ms.append((time.process_time() - cpu_start) * 1e3)
    if args.time_steps and steps:
        print_timing(rank, step_ms, cpu_ms, rss_before_model)

    # This rank's parameters by the whole GPT's names (collective for DTensors).
    mine = {id(p) for m in modules for p in m.parameters()}
    full = {name: full_value(p) for name, p in whole.named_parameters() if id(p) in mine}
    write_result(args.out, rank, full, losses, dp_rank == 0 and fsdp_rank == 0 and tp_rank == 0)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # As torch_parallel.py: no interpreter finalization (torch 2.15's Gloo
    # threads may still drop a finished work's tensors then and abort).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
