# Seed 000, "Hybrid FSDP - FSDPv2 + DP" (hsdp_fsdp2.py), restart-free: the
# DP dimension of its (2, 4) mesh becomes two replica groups of meshrun.ft
# (fault-tolerant all-reduce across them), FSDP2's fully_shard stays inside
# each group; a group that fails restarts alone and is healed.
#   meshrun --standalone --nproc-per-node=8 --restart-scope=replica \
#           --replica-size=4 hsdp_fsdp2_ft.py
# Lines ending in "# meshrun.ft" are the changes for it (counted in the README
# and checked by tests/e2e/ft_python_test.py). The seed's program trains
# nothing: lines marked "# added:" give it a training loop, so that there is
# something to recover.
import argparse  # added: the training's length
import torch
import os
from torch import distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed._composable.fsdp import fully_shard
from meshrun import ft  # meshrun.ft

import warnings # ignore all warning messages
warnings.filterwarnings("ignore")

class ToyModel(nn.Module):
    def __init__(self):
        super(ToyModel, self).__init__()
        self.net1 = nn.Linear(10, 10, bias=False)
        self.relu = nn.ReLU()

        with torch.no_grad():
            self.net1.weight = nn.Parameter(torch.arange(101., 201.).view(10, 10))  # added: a Linear(10, 10)'s weight, to run forward

    def forward(self, x):
        return self.relu(self.net1(x))

device = 'cuda' if torch.cuda.is_available() else 'cpu'
backend = 'nccl' if device == 'cuda' else 'gloo'

world_size = int(os.environ["WORLD_SIZE"])
local_rank = int(os.environ["LOCAL_RANK"])

ft.init_process_group(backend=backend)  # meshrun.ft
if device == 'cuda':
    torch.cuda.set_device(local_rank)

model = ToyModel()

mesh = init_device_mesh(device, (4,), mesh_dim_names=["FSDP"])  # meshrun.ft

model = fully_shard(model, mesh=mesh["FSDP"])

print(f'Global rank: {os.environ["RANK"]}, dp_rank: {ft.replica_id()}, fsdp_rank:{mesh["FSDP"].get_local_rank()}, Weights array: {list(model.parameters())}')  # meshrun.ft

# added: a training loop on random inputs, each worker its own rows
parser = argparse.ArgumentParser()  # added
parser.add_argument("--epochs", type=int, default=4)  # added
parser.add_argument("--samples", type=int, default=1024)  # added
args = parser.parse_args()  # added
optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)  # added
optimizer = ft.Optimizer(ft.Manager.from_module(model, optimizer), optimizer)  # meshrun.ft
inputs = torch.randn(args.samples, 10, generator=torch.Generator().manual_seed(0))  # added
dataset = torch.utils.data.TensorDataset(inputs)  # added
loader = torch.utils.data.DataLoader(dataset, batch_size=1, sampler=ft.DistributedSampler(dataset, 1))  # meshrun.ft
for epoch in range(loader.sampler.start_epoch, args.epochs):  # meshrun.ft
    loader.sampler.set_epoch(epoch)  # added
    for (x,) in loader:  # added
        optimizer.zero_grad()  # added
        loss = model(x.to(device)).mean()  # added
        loss.backward()  # added
        optimizer.step()  # added
    print(f"Global rank: {os.environ['RANK']}, epoch {epoch}, loss {loss.item():.6f}")  # added
ft.destroy_process_group()  # meshrun.ft
