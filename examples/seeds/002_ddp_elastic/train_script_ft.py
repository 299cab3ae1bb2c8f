# Seed 002 (notes on PyTorch distributed training), "Sample Training Script":
# DDP with @record, a DistributedSampler and a checkpoint saved by rank 0 and
# loaded by every rank around a barrier, launched elastic as the seed's
# multinode.sh does (two agents here, each with 2 workers):
#   torchrun --nnodes=1:4 --nproc_per_node=2 --node_rank=0 --max-restarts=3 \
#            --rdzv_id=JOB --rdzv_backend=c10d --rdzv_endpoint=HOST:PORT train_script.py
# This copy recovers restart-free under meshrun --restart-scope=replica
# --replica-size=N: each line changed for it ends in "# meshrun.ft" (counted
# in the README, checked by tests/e2e/ft_python_test.py); the rest is
# train_script.py as it is.
# The seed's snippets are put together into one program. It names a model, a
# data set and load_checkpoint without giving them: those are "# added:".
# Where the seed's code cannot run as written, the line is "# changed:" and
# says why. Its CPU branch is the backend it names for CPU training, gloo.
import os
import tempfile
import argparse  # added: the seed's snippets take their sizes from argparse

import torch
import torch.nn as nn
import torch.optim as optim
import torch.nn.functional as F
import torch.distributed as dist  # added: the seed calls dist.barrier()

from torch.utils.data import Dataset, DataLoader
from torch.utils.data.distributed import DistributedSampler  # changed: the seed's "DistributeSampler" does not exist
from torch.nn.parallel import DistributedDataParallel as DDP
from meshrun.ft import init_process_group, destroy_process_group  # meshrun.ft
from meshrun import ft  # meshrun.ft
from torch.distributed.elastic.multiprocessing.errors import record

# "gloo" - distributed CPU training
# "nccl" - distributed GPU trianing with CUDA drivers
# "mpi"  - last probable choice
DIST_BACKEND = "nccl" if torch.cuda.is_available() else "gloo"  # changed: "nccl" only; gloo is the seed's CPU choice


class MyModel(nn.Module):  # added: the seed leaves the model out
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 4))

    def forward(self, x):
        return self.net(x)


class RandomDataset(Dataset):  # added: the seed leaves the data set out
    def __init__(self, size):
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(size, 20, generator=generator)
        self.y = torch.randint(0, 4, (size,), generator=generator)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, index):
        return self.x[index], self.y[index]


def device_of(local_rank):  # added: a GPU per worker where there are GPUs, else the CPU
    return local_rank if torch.cuda.is_available() else torch.device("cpu")


def initialize():
    # correct use of rank, provided by launcher
    local_rank  = int(os.environ["LOCAL_RANK"])
    global_rank = int(os.environ["RANK"])

    # make sure each process exclusively operates on a dedicated GPU
    if torch.cuda.is_available():  # added: no GPU to pin on a CPU machine
        torch.cuda.set_device(local_rank)
    init_process_group(DIST_BACKEND)  # meshrun.ft


def destroy():
    destroy_process_group()


def prep_dataloader(dataset, batch_size):
    return DataLoader(
            dataset,
            batch_size=batch_size,
            pin_memory=True,
            shuffle=False,
            sampler=ft.DistributedSampler(dataset, batch_size)  # meshrun.ft
    )


def save_checkpoint(ddp_model):
    rank = dist.get_rank()  # added: the seed reads a global rank
    CHECKPOINT_PATH = tempfile.gettempdir() + f"/model{ft.replica_id()}.pt"  # meshrun.ft
    if rank == 0:
        # some code refers state_dict of DDP models to the following,
        # ddp_model.module.state_dict() because module is an attribute
        # but technically, `DDP` is a subclass of `nn.Module`
        # hence directly access state_dict should be alright
        torch.save(ddp_model.state_dict(), CHECKPOINT_PATH)

    # block all processes until process[0] (i.e., rank 0) finishes saving
    dist.barrier()

    # specify `map_location` to justify each process
    map_location = {"cuda:0": f"cuda:{rank}"}
    ddp_model.load_state_dict(
            torch.load(CHECKPOINT_PATH,
                       map_location=map_location))  # changed: the seed misses the comma

    dist.barrier()  # added: rank 0 must not remove the file while others read it
    if rank == 0:
        os.remove(CHECKPOINT_PATH)
    # changed: the seed calls destroy() here, ending the process group in the middle of training


def train(train_data, max_epochs, snapshot):
    local_rank = int(os.environ["LOCAL_RANK"])
    device = device_of(local_rank)  # added: see device_of
    torch.manual_seed(0)  # added: the same initial weights in every run, so runs compare
    model = MyModel().to(device)  # changed: .to(local_rank) in the seed, a GPU index
    ddp_model = DDP(model,
                    device_ids=[local_rank] if torch.cuda.is_available() else None,  # changed: CPU modules take none
                    output_device=local_rank if torch.cuda.is_available() else None)  # changed: as above
    optimizer = optim.SGD(ddp_model.parameters(), lr=1e-3)
    optimizer = ft.Optimizer(ft.Manager.from_module(ddp_model, optimizer), optimizer)  # meshrun.ft

    for epoch in range(train_data.sampler.start_epoch, max_epochs):  # meshrun.ft
        train_data.sampler.set_epoch(epoch)
        for src, tgt in train_data:
            src = src.to(device)
            tgt = tgt.to(device)
            optimizer.zero_grad()
            out = ddp_model(src)
            loss = F.cross_entropy(out, tgt)
            loss.backward()
            optimizer.step()
        print(f"rank {dist.get_rank()} epoch {epoch} loss {loss.item():.6f}")  # added: what each rank shows

        if epoch % snapshot == 0:  # changed: "rank == 0 and" in the seed, but every rank must reach its barrier
            save_checkpoint(ddp_model)


# add `@record` decorator to enable summary on worker errors,
# including time, rank, pid, traceback, etc.
@record
def main():
    parser = argparse.ArgumentParser(description="Distributed Training with PyTorch DistributedDataParallel Module.")
    parser.add_argument("--snapshot", default=1, type=int, help="How often saving a snapshot")
    parser.add_argument("--max-epochs", default=3, type=int, help="Maximum epochs for training")  # changed: "--max-expoch" in the seed
    parser.add_argument("--batch_size", default=32, type=int, help="Batch size on each device (default: 32)")
    args = parser.parse_args()

    initialize()
    train_data = prep_dataloader(RandomDataset(512), args.batch_size)  # added: the data set
    train(train_data, args.max_epochs, args.snapshot)
    destroy()


if __name__ == "__main__":  # always guard your entrypoint before execution
    main()
