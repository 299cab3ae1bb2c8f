#!/usr/bin/env python3
"""PyTorch peers of dp_step_bench.cc (DDP, FSDP2): the same MLP, batch and step.

Run under a torchrun-compatible launcher (scripts/bench-parallel.sh uses
`meshrun --standalone --nproc-per-node=4`, the same launcher as the C++ side):

  ddp_step_bench.py --mode ddp --sizes 256,1024,1024,1024,256 --batch 64 --steps 30

Modes: ddp (DistributedDataParallel, 25 MiB buckets all-reduced during
backward); fsdp2 / fsdp2_noreshard (torch.distributed.fsdp.fully_shard on
every Linear, then on the root, reshard_after_forward True / False: FSDP2's
per-layer parameter groups, one all-gather and one reduce-scatter each, with
its implicit prefetching; Gloo on CPU works in torch 2.15).

A step is zero_grad, forward, MSE loss, backward, SGD step. Each step starts
after a barrier; its time is the max over ranks; data is made before the
clock starts. Rank 0 prints `RESULT impl=torch mode=<mode> ...` as
dp_step_bench does, with the largest rank's peak RSS
(max_rss_mb) and its growth over the RSS before the model was built
(rss_growth_mb): the same measure as dp_step_bench's, for per-rank memory.
"""

import argparse
import resource
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP


def rss_mb():
    """This process's resident set now (MiB), from /proc/self/statm."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * resource.getpagesize() / 2**20


def peak_rss_mb():
    """The peak resident set since the process started (MiB; Linux: ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def percentile(values, q):
    values = sorted(values)
    position = q * (len(values) - 1)
    low = int(position)
    high = min(low + 1, len(values) - 1)
    return values[low] + (values[high] - values[low]) * (position - low)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", default="ddp", choices=["ddp", "fsdp2", "fsdp2_noreshard"])
    parser.add_argument("--sizes", default="256,1024,1024,1024,256")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]

    dist.init_process_group("gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    rss_before_model = rss_mb()
    torch.manual_seed(1)
    layers = []
    for i in range(len(sizes) - 1):
        if i > 0:
            layers.append(nn.ReLU())
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
    if args.mode == "ddp":
        model = DDP(nn.Sequential(*layers))
    else:
        model = nn.Sequential(*layers)
        reshard = args.mode == "fsdp2"
        for layer in layers:
            if isinstance(layer, nn.Linear):
                fully_shard(layer, reshard_after_forward=reshard)
        fully_shard(model, reshard_after_forward=reshard)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = nn.MSELoss()
    generator = torch.Generator().manual_seed(7)
    local = args.batch // n

    times = []
    first_loss = last_loss = 0.0
    for step in range(args.warmup + args.steps):
        x = torch.randn(args.batch, sizes[0], generator=generator)
        y = torch.randn(args.batch, sizes[-1], generator=generator)
        x, y = x[rank * local : (rank + 1) * local], y[rank * local : (rank + 1) * local]
        dist.barrier()
        start = time.perf_counter()
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        stop = time.perf_counter()
        if step == 0:
            first_loss = loss.item()
        last_loss = loss.item()
        if step >= args.warmup:
            times.append((stop - start) * 1000.0)
    slowest = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    step_ms = slowest.tolist()
    peak = peak_rss_mb()
    memory = torch.tensor([peak, peak - rss_before_model], dtype=torch.float64)
    dist.all_reduce(memory, op=dist.ReduceOp.MAX)
    if rank == 0:
        print(
            f"RESULT impl=torch mode={args.mode} world={n} sizes={args.sizes} "
            f"batch={args.batch} median_ms={statistics.median(step_ms):.3f} "
            f"p10_ms={percentile(step_ms, 0.1):.3f} p90_ms={percentile(step_ms, 0.9):.3f} "
            f"steps={args.steps} first_loss={first_loss:.6f} last_loss={last_loss:.6f} "
            f"max_rss_mb={memory[0].item():.1f} rss_growth_mb={memory[1].item():.1f}",
            flush=True,
        )
        print(
            f"STEPS impl=torch mode={args.mode} " + ",".join(f"{t:.3f}" for t in step_ms),
            flush=True,
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
