# Seed 000, "Hybrid FSDP - FSDPv2 + DP": FSDP2's fully_shard over the FSDP
# dimension of a (2, 4) mesh, replicated over DP; every rank prints its
# DTensor shard of the weights 101..200.
#   torchrun --node_rank=0 --nproc_per_node=8 --nnodes=1 --standalone hsdp_fsdp2.py
# The FSDP1 program (hsdp_fsdp1.py) with the seed's "couple of lines of
# change". Lines marked "# added:" are not in the seed.
import torch
import os
from torch import distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed._composable.fsdp import fully_shard

import warnings # ignore all warning messages
warnings.filterwarnings("ignore")

class ToyModel(nn.Module):
    def __init__(self):
        super(ToyModel, self).__init__()
        self.net1 = nn.Linear(10, 10, bias=False)
        self.relu = nn.ReLU()

        with torch.no_grad():
            self.net1.weight = nn.Parameter(torch.arange(101., 201.))

    def forward(self, x):
        return self.relu(self.net1(x))

device = 'cuda' if torch.cuda.is_available() else 'cpu'
backend = 'nccl' if device == 'cuda' else 'gloo'

world_size = int(os.environ["WORLD_SIZE"])
local_rank = int(os.environ["LOCAL_RANK"])

dist.init_process_group(backend=backend, world_size=world_size)
if device == 'cuda':
    torch.cuda.set_device(local_rank)

model = ToyModel()

mesh = init_device_mesh(device, (2, 4), mesh_dim_names=["DP", "FSDP"])

model = fully_shard(model, mesh=mesh["FSDP"])

print(f'Global rank: {dist.get_rank()}, dp_rank: {mesh["DP"].get_local_rank()}, fsdp_rank:{mesh["FSDP"].get_local_rank()}, Weights array: {list(model.parameters())}')
