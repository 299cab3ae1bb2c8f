"""FSDP2's side of fsdp_lifecycle_worker --case accumulate: the same model
(module_net.h's residual MLP: in, three blocks of norm/fc1/fc2, norm, head),
fully_shard on every block and the root over all ranks, and the same step
(two microbatch forwards, one backward of their mean, AdamW), counting the
all-gathers and reduce-scatters FSDP2 issues. Prints the line the C++ worker
prints:

    COUNTS all_gather A reduce_scatter R over S steps

    meshrun --standalone --nproc-per-node=2 tests/integration/parallel/fsdp_counts.py
"""

import argparse
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

IN, DIM, OUT, BLOCKS, BATCH = 12, 30, 5, 3, 16


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(DIM)
        self.fc1 = nn.Linear(DIM, 2 * DIM)
        self.fc2 = nn.Linear(2 * DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(F.gelu(self.fc1(self.norm(x))))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(IN, DIM)
        self.blocks = nn.ModuleList(Block() for _ in range(BLOCKS))
        self.norm = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, OUT)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        for block in self.blocks:
            h = block(h)
        return self.head(self.norm(h))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    world, rank = dist.get_world_size(), dist.get_rank()
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(7)
    net = Net()
    for block in net.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(net, mesh=mesh)
    counts = {"all_gather": 0, "reduce_scatter": 0}

    def counting(name: str, original: Any) -> Any:
        def call(*a: Any, **k: Any) -> Any:
            counts[name] += 1
            return original(*a, **k)

        return call

    # FSDP2 calls these through torch.distributed at call time (torch 2.15:
    # all_gather_single / reduce_scatter_single; older: the *_tensor ones).
    for name, kind in (
        ("all_gather_single", "all_gather"),
        ("all_gather_into_tensor", "all_gather"),
        ("reduce_scatter_single", "reduce_scatter"),
        ("reduce_scatter_tensor", "reduce_scatter"),
    ):
        if hasattr(dist, name):
            setattr(dist, name, counting(kind, getattr(dist, name)))
    optimizer = torch.optim.AdamW(net.parameters(), lr=1e-2, weight_decay=0.05)
    generator = torch.Generator().manual_seed(11)
    for _ in range(args.steps):
        rows = BATCH // world
        x = torch.randn(BATCH, IN, generator=generator)[rank * rows : (rank + 1) * rows]
        y = torch.randn(BATCH, OUT, generator=generator)[rank * rows : (rank + 1) * rows]
        half = rows // 2
        optimizer.zero_grad()
        first = F.mse_loss(net(x[:half]), y[:half])
        second = F.mse_loss(net(x[half:]), y[half:])
        ((first + second) / 2).backward()
        optimizer.step()
    if rank == 0:
        print(
            f"COUNTS all_gather {counts['all_gather']} "
            f"reduce_scatter {counts['reduce_scatter']} over {args.steps} steps",
            flush=True,
        )
    print(f"DONE rank {rank}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
