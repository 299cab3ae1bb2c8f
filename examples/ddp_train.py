"""A small DDP training job, written for torchrun and run unchanged by meshrun.

Synthetic regression data (seeded, identical on every run), a two-layer MLP,
DistributedSampler with set_epoch, gloo on CPU. Rank 0 prints the mean loss
over the whole world for each epoch, so runs with the same world size and
global batch can be compared line by line.

    meshrun --standalone --nproc-per-node=4 examples/ddp_train.py --epochs 5
    torchrun --standalone --nproc-per-node=4 examples/ddp_train.py --epochs 5
"""

import argparse
import gc
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def make_dataset(samples: int) -> TensorDataset:
    gen = torch.Generator().manual_seed(1234)
    x = torch.randn(samples, 16, generator=gen)
    w = torch.randn(16, 1, generator=gen)
    y = x @ w + 0.1 * torch.randn(samples, 1, generator=gen)
    return TensorDataset(x, y)


@record
def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=32, help="per worker")
    parser.add_argument("--samples", type=int, default=1024)
    parser.add_argument(
        "--fail-rank",
        type=int,
        default=-1,
        help="this rank raises in epoch 1 of the first attempt (tests)",
    )
    args = parser.parse_args()

    dist.init_process_group("gloo")  # env://: RANK, WORLD_SIZE, MASTER_ADDR/PORT
    rank, world = dist.get_rank(), dist.get_world_size()
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    torch.manual_seed(0)
    model = DDP(
        torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = make_dataset(args.samples)
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=7)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler)

    if rank == 0:
        print(f"world_size={world} restart_count={restart}", flush=True)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        total = torch.zeros(2)
        for x, y in loader:
            opt.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            total += torch.tensor([loss.item() * len(x), len(x)])
        if epoch == 1 and rank == args.fail_rank and restart == 0:
            raise RuntimeError(f"injected failure on rank {rank}")
        dist.all_reduce(total)
        if rank == 0:
            print(f"epoch {epoch} loss {(total[0] / total[1]).item():.6f}", flush=True)
    # torch 2.15's Gloo worker threads drop their last work's tensors after
    # the work completes; one dropped while the interpreter is finalizing
    # takes the GIL, exits the thread and aborts the process ("terminate
    # called without an active exception", seen in 1 of 8 torchrun runs).
    # Releasing DDP (which holds the process group) first lets
    # destroy_process_group join those threads before the exit.
    del model, opt, total
    gc.collect()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
