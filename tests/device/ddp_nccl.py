"""DDP over NCCL, one rank a GPU, for scripts/device-check.sh's wheel check
(issue 46 item 4): the pip wheel's `meshrun` launches it on the GPU machine.

Every rank trains the same seeded MLP on its own shard of a synthetic
regression set on cuda:LOCAL_RANK; rank 0 prints each step's world-mean loss
and, at the end, "DDP_NCCL world=N backend=nccl device=cuda:K final_loss=X".
It exits non-zero if the loss did not fall, if the parameters differ across
ranks after training (DDP's all-reduce on NCCL keeps them equal), or if the
launcher did not set torchrun's RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT.

    meshrun --standalone --nproc-per-node=<GPUs> tests/device/ddp_nccl.py
"""

import os
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS = 30


def main() -> int:
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        if name not in os.environ:
            print(f"FAIL ddp_nccl: {name} not set by the launcher", flush=True)
            return 1
    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    rank, world = dist.get_rank(), dist.get_world_size()

    gen = torch.Generator().manual_seed(1234)
    x = torch.randn(world * 256, 16, generator=gen)
    y = x @ torch.randn(16, 1, generator=gen)
    x, y = x[rank::world].to(device), y[rank::world].to(device)

    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    model = DDP(mlp.to(device), device_ids=[local_rank])
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for step in range(STEPS):
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        losses.append(mean.item() / world)
        if rank == 0 and step % 10 == 0:
            print(f"step {step} loss {losses[-1]:.6f}", flush=True)

    # Parameters equal on every rank: the max over ranks of each one minus
    # rank 0's copy (broadcast) is zero.
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    reference = flat.clone()
    dist.broadcast(reference, src=0)
    spread = (flat - reference).abs().max()
    dist.all_reduce(spread, op=dist.ReduceOp.MAX)
    ok = losses[-1] < 0.5 * losses[0] and spread.item() == 0.0
    if rank == 0:
        print(
            f"DDP_NCCL world={world} backend={dist.get_backend()} device={device} "
            f"first_loss={losses[0]:.6f} final_loss={losses[-1]:.6f} "
            f"param_spread={spread.item():g} {'ok' if ok else 'FAILED'}",
            flush=True,
        )
    del model
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
