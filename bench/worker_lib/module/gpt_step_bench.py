"""The peer of gpt_step_bench.cc: the Python twin of the GPT
(worker_lib/models/gpt.py) under PyTorch's own API, same flags, same
step, same RESULT line (impl=torch).

    torchrun --nproc-per-node=1 gpt_step_bench.py --device cuda --layout fsdp

Layouts: none, ddp (DistributedDataParallel), fsdp (fully_shard on every
block and the root). peak_mb: torch.cuda.max_memory_allocated on rank 0.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "worker_lib" / "models"))
from gpt import Gpt, GptConfig  # noqa: E402


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[int(q * (len(ordered) - 1))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--layout", default="fsdp", choices=["none", "ddp", "fsdp"])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--vocab", type=int, default=96)
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()

    cuda = args.device == "cuda"
    if cuda:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank()

    torch.manual_seed(1)
    config = GptConfig(args.vocab, args.context, args.dim, args.heads, args.layers)
    model: torch.nn.Module = Gpt(config).to(device)
    if args.layout == "ddp":
        model = torch.nn.parallel.DistributedDataParallel(model)
    elif args.layout == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1)
    generator = torch.Generator().manual_seed(7 + rank)
    tokens = torch.randint(args.vocab, (args.batch, args.context), generator=generator)
    targets = torch.randint(args.vocab, (args.batch, args.context), generator=generator)
    tokens, targets = tokens.to(device), targets.to(device)

    times: list[float] = []
    for step in range(args.warmup + args.steps):
        dist.barrier()
        start = time.perf_counter()
        optimizer.zero_grad()
        logits = model(tokens)
        loss = F.cross_entropy(logits.reshape(-1, args.vocab), targets.reshape(-1))
        loss.backward()
        optimizer.step()
        if cuda:
            torch.cuda.synchronize(device)
        if step >= args.warmup:
            times.append((time.perf_counter() - start) * 1000)
    if rank == 0:
        peak = torch.cuda.max_memory_allocated(device) / (1 << 20) if cuda else 0.0
        print(
            f"RESULT impl=torch layout={args.layout} device={args.device} "
            f"world={dist.get_world_size()} median_ms={statistics.median(times):.3f} "
            f"p10_ms={percentile(times, 0.1):.3f} p90_ms={percentile(times, 0.9):.3f} "
            f"steps={args.steps} peak_mb={peak:.1f}",
            flush=True,
        )
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
